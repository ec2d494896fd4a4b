// Attention's reads of a cache of f16 rows (see `kv_write_f16.wgsl`):
// element i of the ring, counted over its rows.

// A block's keys are staged KEY_CHUNK elements of every row at a time: the
// workgroup reads the rows' words in runs (where each thread reading its
// own row would touch a line per thread), and each thread then reads its
// row's from workgroup memory, STAGED_ROW words a row (one past the eight
// used, so that the threads' rows fall in different banks).
const KEY_CHUNK: u32 = 16u;
const STAGED_ROW: u32 = 9u;
var<workgroup> staged_keys: array<u32, WG * STAGED_ROW>;

// Where the key head `kvh` starts in each row this thread stages of the
// block at position c0: word lid % 8 of rows lid / 8 + 8 i, so that eight
// neighbouring threads read a row's eight words. Taken once a block, the
// ring's wrap (a division) out of every chunk.
struct StagedRows {
    at: array<u32, 8>,
}

fn staged_rows(lid: u32, c0: u32, kvh: u32) -> StagedRows {
    var rows: StagedRows;
    for (var i = 0u; i < 8u; i++) {
        rows.at[i] = ((c0 + lid / 8u + 8u * i) % p.ring) * p.n_head_kv * p.dk + kvh * p.dk;
    }
    return rows;
}

// Elements ch..ch + KEY_CHUNK (fewer at the head's end) of the rows. Every
// thread calls it.
fn stage_keys(lid: u32, rows: StagedRows, ch: u32) {
    let col = lid % 8u;
    if (ch + 2u * col < p.dk) {
        for (var i = 0u; i < 8u; i++) {
            // Rows are f16 pairs from an even start: a word is two of them.
            staged_keys[(lid / 8u + 8u * i) * STAGED_ROW + col] = cache_k[((rows.at[i] + ch) >> 1u) + col];
        }
    }
}

// Each pair's Σ q · key over the staged elements ch.. of this thread's row,
// added to `dots` pair of elements by pair of elements in order, as the sum
// over the whole head is taken.
fn chunk_dots(lid: u32, ch: u32, dots: ptr<function, array<f32, PAIRS>>) {
    let words = min(KEY_CHUNK, p.dk - ch) / 2u;
    let row = lid * STAGED_ROW;
    var c = 0u;
    for (; c + 2u <= words; c += 2u) {
        let a = unpack2x16float(staged_keys[row + c]);
        let b = unpack2x16float(staged_keys[row + c + 1u]);
        for (var n = 0u; n < PAIRS; n++) {
            let q4 = staged_queries[(n * Q_WIDTH + ch + 2u * c) / 4u];
            (*dots)[n] += q4.x * a.x + q4.y * a.y;
            (*dots)[n] += q4.z * b.x + q4.w * b.y;
        }
    }
    if (c < words) {
        // A head of 4k + 2 elements: its last pair, the first half of a
        // staged query's four.
        let a = unpack2x16float(staged_keys[row + c]);
        for (var n = 0u; n < PAIRS; n++) {
            let q4 = staged_queries[(n * Q_WIDTH + ch + 2u * c) / 4u];
            (*dots)[n] += q4.x * a.x + q4.y * a.y;
        }
    }
}

fn value_at(i: u32) -> f32 {
    let pair = unpack2x16float(cache_v[i >> 1u]);
    return select(pair.x, pair.y, (i & 1u) == 1u);
}
