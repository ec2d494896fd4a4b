// What the row-parallel products share (`matmul.wgsl`, `matmul_gated.wgsl`,
// `matmul_split.wgsl`): a workgroup takes ROWS groups of R rows (four, each
// input read once for the four, or one: `Shareout` in `kernels.rs` chooses)
// and up to COLS columns (8 for a prompt, 1 for a decoded token), THREADS
// threads a group. A row's blocks are cut in PIECES pieces each (one for the
// 32-element formats, four or eight for the 256-element ones, whose rows of
// 4096 hold only 16 blocks: a thread each left half of 32 threads idle), and
// thread j of a group takes its rows' pieces j, j + THREADS, ..., each
// dequantized once for all its columns, so neighbouring threads read
// neighbouring bytes (one thread walking a whole row, as this kernel did
// first, read a card's memory at 2% of its rate or less). The threads of a
// group then add their sums in workgroup memory. The inputs come laid out
// block-major (`block_inputs.wgsl`): element e of every block of a column
// side by side, so that neighbouring threads, each at element e of its own
// block, read neighbouring floats. The weights are the file's bytes in an
// array of words, so a block may start at any byte: every read goes through
// `bytes_at`, which joins two words where a read straddles them. BLOCK
// (elements a block holds), BLOCK_BYTES, PIECES and `block_piece` (a
// piece's products with every column, added to `acc`) come from the
// format's own file; the product's template declares `w`, `x` and `p`
// (with `cols`, `n` and `x_stride`). Every product built on this takes each
// sum in the same order, whatever R, so their outputs agree bit for bit.

const THREADS: u32 = 32u;
const ROWS: u32 = WG / THREADS;

// The tree's steps in workgroup memory (none where every step is a
// shuffle: a card's subgroups of 32 or more).
var<workgroup> partial: array<Rf, select(WG * COLS, 1u, SHUFFLED_BELOW >= THREADS)>;

// Where this workgroup's first column starts, its last column (counted
// from the first), blocks a row holds, and where the block being read
// starts in the first column.
var<private> x_col0: u32;
var<private> last_col: u32;
var<private> n_blocks: u32;
var<private> x_block: u32;

// Element e of the block being read of input column c, in the block-major
// layout. Columns past the input's last read the last one again: their
// sums are not written.
fn x_at(e: u32, c: u32) -> f32 {
    return x[x_block + min(c, last_col) * p.x_stride + e * n_blocks];
}

// The byte offsets of rows first..first + R, a row past the last read as
// the last (its sums are not written).
fn row_starts(first: u32, rows: u32, row_bytes: u32) -> Ru {
    return min(Ru(first) + ROW_STEPS, Ru(rows - 1u)) * row_bytes;
}

// The sums of the rows at bytes `row_start` (none where `has_row` is false)
// with the columns of column group `col_group`, into `sums` of the group's
// first thread, a row a lane. Returns how many columns the group has.
// Every thread of the workgroup calls it (it waits at barriers, and
// shuffles within its subgroup).
//
// The group's threads add their sums by a tree: each pair THREADS / 2
// apart first, then half as far, down to neighbours. Pairs in different
// subgroups add in workgroup memory; pairs within one (closer than
// SHUFFLED_BELOW, from the invocation's form in `kernels.rs`) add through a
// subgroup shuffle, with no barrier between steps: the same pairs in the
// same order, so a device with subgroups gives the bits of one without.
fn row_sums(col_group: u32, lid: u32, row_start: Ru, has_row: bool, sums: ptr<function, array<Rf, COLS>>) -> u32 {
    let lane = lid % THREADS;
    let col0 = col_group * COLS;
    let n_cols = min(COLS, p.n - col0);
    last_col = n_cols - 1u;
    x_col0 = col0 * p.x_stride;
    n_blocks = p.cols / BLOCK;
    var acc: array<Rf, COLS>;
    if (has_row) {
        for (var q = lane; q < n_blocks * PIECES; q += THREADS) {
            let b = q / PIECES;
            x_block = x_col0 + b;
            block_piece(&acc, block_bytes_at(row_start, b, n_blocks), block_scale_at(row_start, b), q % PIECES);
        }
    }
    if (SHUFFLED_BELOW < THREADS) {
        for (var c = 0u; c < COLS; c++) {
            partial[c * WG + lid] = acc[c];
        }
        workgroupBarrier();
        for (var s = THREADS / 2u; s >= SHUFFLED_BELOW; s >>= 1u) {
            if (lane < s) {
                for (var c = 0u; c < COLS; c++) {
                    partial[c * WG + lid] += partial[c * WG + lid + s];
                }
            }
            workgroupBarrier();
        }
        for (var c = 0u; c < COLS; c++) {
            acc[c] = partial[c * WG + lid];
        }
    }
    for (var s = min(THREADS, SHUFFLED_BELOW) / 2u; s > 0u; s >>= 1u) {
        for (var c = 0u; c < COLS; c++) {
            acc[c] = add_across(acc[c], s);
        }
    }
    *sums = acc;
    return n_cols;
}
