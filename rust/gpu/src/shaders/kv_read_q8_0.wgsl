// Attention's reads of a cache of Q8_0 rows (see `kv_write_q8_0.wgsl`):
// element i of the ring, counted over its rows. The queries stay f32: each
// block's quants meet them, and the sum takes the block's scale.

// Byte i % 4 of `word` (a word of quants) as a signed value.
fn quant_at(word: u32, i: u32) -> f32 {
    return f32(bitcast<i32>(word << (24u - 8u * (i & 3u))) >> 24u);
}

// A block's keys are staged a Q8_0 block of every row at a time: the
// workgroup reads the rows' quants in runs (where each thread reading its
// own row would touch a line per thread), and each thread then reads its
// row's from workgroup memory: eight words of quants and the block's scale
// a row (nine words, so that the threads' rows fall in different banks).
const KEY_CHUNK: u32 = 32u;
const STAGED_ROW: u32 = 9u;
var<workgroup> staged_keys: array<u32, WG * STAGED_ROW>;

// Where the key head `kvh` starts in each row this thread stages of the
// block at position c0: word lid % 8 of the quants of rows lid / 8 + 8 i,
// so that eight neighbouring threads read a block's eight words, and the
// scale of row lid. Taken once a block, the ring's wrap (a division) out
// of every chunk.
struct StagedRows {
    at: array<u32, 8>,
    own: u32,
}

fn staged_rows(lid: u32, c0: u32, kvh: u32) -> StagedRows {
    let k_stride = p.n_head_kv * p.dk;
    var rows: StagedRows;
    for (var i = 0u; i < 8u; i++) {
        rows.at[i] = ((c0 + lid / 8u + 8u * i) % p.ring) * k_stride + kvh * p.dk;
    }
    rows.own = ((c0 + lid) % p.ring) * k_stride + kvh * p.dk;
    return rows;
}

// Block ch / 32 of the rows. Every thread calls it.
fn stage_keys(lid: u32, rows: StagedRows, ch: u32) {
    let col = lid % 8u;
    for (var i = 0u; i < 8u; i++) {
        staged_keys[(lid / 8u + 8u * i) * STAGED_ROW + col] = cache_k[((rows.at[i] + ch) >> 2u) + col];
    }
    let scales = p.ring * p.n_head_kv * p.dk / 4u;
    staged_keys[lid * STAGED_ROW + 8u] = cache_k[scales + (rows.own + ch) / 32u];
}

// Each pair's Σ q · key over the staged block ch / 32 of this thread's
// row: the block's exact sum of quants times query elements in order, then
// times the block's scale, added to `dots`.
fn chunk_dots(lid: u32, ch: u32, dots: ptr<function, array<f32, PAIRS>>) {
    let row = lid * STAGED_ROW;
    var s: array<f32, PAIRS>;
    for (var j = 0u; j < 8u; j++) {
        let word = staged_keys[row + j];
        let quants = vec4<f32>(quant_at(word, 0u), quant_at(word, 1u), quant_at(word, 2u), quant_at(word, 3u));
        for (var n = 0u; n < PAIRS; n++) {
            let q4 = staged_queries[(n * Q_WIDTH + ch) / 4u + j];
            s[n] += q4.x * quants.x;
            s[n] += q4.y * quants.y;
            s[n] += q4.z * quants.z;
            s[n] += q4.w * quants.w;
        }
    }
    let scale = bitcast<f32>(staged_keys[row + 8u]);
    for (var n = 0u; n < PAIRS; n++) {
        (*dots)[n] += s[n] * scale;
    }
}

fn value_at(i: u32) -> f32 {
    let scales = p.ring * p.n_head_kv * p.dv / 4u;
    return quant_at(cache_v[i >> 2u], i) * bitcast<f32>(cache_v[scales + i / 32u]);
}
