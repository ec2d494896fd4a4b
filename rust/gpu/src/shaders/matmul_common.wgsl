// What every matrix product shares: the readers of a weight row's bytes and
// the per-column accumulation the formats' `block_dot` calls. The product
// that includes this declares `w` (the weights as words) and `x_at(e, c)`
// (element e of the block being read, of input column c, as its inputs are
// laid out; any c below COLS, so that every loop here runs a constant count: on a card that made
// a decoded token's product of the 32-element formats 4-16% faster than a
// count read at run time, the others within a few percent).
//
// A thread takes R rows at once (a form from `kernels.rs`): a row's byte
// offset, its values and its sums are a lane of `Ru`/`Rf` (vec4 for four
// rows, u32 and f32 for one), so every input read serves R rows while each
// row's arithmetic is the one row's, lane by lane, in the same order: the
// forms give the same bits. The form gives `bytes_at`, `byte_at`,
// `word_at` and `f16_at` over R offsets, and `row_value` (lane k of a sum).

const WG: u32 = 64u;
const COLS: u32 = 8u;

// The order every form of the products adds a row's terms in, so that an
// output's bits do not depend on the form its pass took (one input or
// several, a decoded token's or a prompt's; `kernels.rs` chooses): a row's
// blocks are cut in PIECES pieces each (one for the 32-element formats,
// four or eight for the 256-element ones, whose rows of 4096 hold only 16
// blocks: a strand each left half of 32 idle), dealt out to STRANDS strands,
// strand j taking pieces j, j + STRANDS, ... in turn, each piece's
// `block_piece` adding to the strand's sums from zero. The row's sum is
// strand 0's sums plus strand 1's, and so on in order, from zero: one thread
// can walk the strands in turn with two sums a column (the tiled form),
// where adding them by a tree would need six.
const STRANDS: u32 = 32u;

// Where block b of the row at byte `row` (of `n_blocks` blocks) keeps its
// bytes, and its f16 scale where the format keeps that apart (SCALE_APART
// bytes a block; `layout.rs`): such a row holds its blocks' scales first,
// padded to a word, then their other bytes, so that every block starts on
// a word.
fn block_bytes_at(row: Ru, b: u32, n_blocks: u32) -> Ru {
    return row + ((n_blocks * SCALE_APART + 3u) & ~3u) + b * (BLOCK_BYTES - SCALE_APART);
}

fn block_scale_at(row: Ru, b: u32) -> Ru {
    return row + b * SCALE_APART;
}

// The bytes from byte offset `o` of the weights to the end of its word,
// little-endian: one load. No read a format makes straddles two words, as
// the device lays the blocks out.
fn bytes_at1(o: u32) -> u32 {
    return w[o >> 2u] >> ((o & 3u) * 8u);
}

fn byte_at1(o: u32) -> u32 {
    return bytes_at1(o) & 0xffu;
}

// The f16 at byte offset `o`, widened.
fn f16_at1(o: u32) -> f32 {
    return unpack2x16float(bytes_at1(o) & 0xffffu).x;
}

// Byte `k` (0..3) of a word, as a signed value.
fn i8_of(word: Ru, k: u32) -> Rf {
    return Rf(bitcast<Ri>(word << Ru(24u - 8u * k)) >> Ru(24u));
}

// acc[c] += v * x[c, e] for each column: element e of the block met by
// every column.
fn fma_cols(acc: ptr<function, array<Rf, COLS>>, v: Rf, e: u32) {
    for (var c = 0u; c < COLS; c++) {
        (*acc)[c] += v * x_at(e, c);
    }
}

// acc[c] += x[c, e]: the sums of inputs a block's minimum multiplies.
fn sum_cols(acc: ptr<function, array<f32, COLS>>, e: u32) {
    for (var c = 0u; c < COLS; c++) {
        (*acc)[c] += x_at(e, c);
    }
}

// acc[c] += scale * part[c].
fn add_scaled(acc: ptr<function, array<Rf, COLS>>, scale: Rf, part: array<Rf, COLS>) {
    for (var c = 0u; c < COLS; c++) {
        (*acc)[c] += scale * part[c];
    }
}

// acc[c] += scale * sums[c]: inputs' sums (`sum_cols`), the same for every row.
fn add_scaled_sums(acc: ptr<function, array<Rf, COLS>>, scale: Rf, sums: array<f32, COLS>) {
    for (var c = 0u; c < COLS; c++) {
        (*acc)[c] += scale * sums[c];
    }
}


// The byte offsets of rows first..first + R, a row past the last read as
// the last (its sums are not written).
fn row_starts(first: u32, rows: u32, row_bytes: u32) -> Ru {
    return min(Ru(first) + ROW_STEPS, Ru(rows - 1u)) * row_bytes;
}
