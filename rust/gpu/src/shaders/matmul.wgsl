// y[c, r] = Σ_k dequant(w)[r, k] · x[c, k] for every row r of a weight
// matrix kept in its file format, and every column c of the input.
//
// One thread a row and up to COLS columns (8 for a prompt, 1 for a decoded
// token): it walks the row's blocks, each dequantized once for all its
// columns, with no barrier to wait at (a workgroup a row, its threads
// meeting in workgroup memory, ran four times slower on lavapipe; a card
// will want subgroup sums). The weights are the file's bytes in an array of
// words, so a block may start at any byte: every read goes through
// `bytes_at`, which joins two words where a read straddles them.
// BLOCK (elements a block holds), BLOCK_BYTES and `block_dot` (a block's
// products with every column, added to `acc`) come from the format's own
// file, appended to this one.

struct Params {
    rows: u32,
    cols: u32,
    n: u32,
    row_bytes: u32,
    // Workgroups along x: rows past the dispatch limit go to y.
    groups_x: u32,
    x_stride: u32,
    y_stride: u32,
    // The first row of this run of the matrix, in y's rows.
    y_first: u32,
}

@group(0) @binding(0) var<storage, read> w: array<u32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

const WG: u32 = 64u;
const COLS: u32 = 8u;

// The columns this workgroup takes (at most COLS).
var<private> n_cols: u32;

// The four bytes at byte offset `o` of the weights, little-endian.
// Without a branch: threads of one SIMD group read rows of any alignment.
fn bytes_at(o: u32) -> u32 {
    let i = o >> 2u;
    let s = (o & 3u) * 8u;
    let next = select(0u, w[i + 1u] << ((32u - s) & 31u), s != 0u);
    return (w[i] >> s) | next;
}

fn byte_at(o: u32) -> u32 {
    return (w[o >> 2u] >> ((o & 3u) * 8u)) & 0xffu;
}

// The f16 at byte offset `o`, widened.
fn f16_at(o: u32) -> f32 {
    return unpack2x16float(bytes_at(o) & 0xffffu).x;
}

// Byte `k` (0..3) of a word, as a signed value.
fn i8_of(word: u32, k: u32) -> f32 {
    return f32(bitcast<i32>(word << (24u - 8u * k)) >> 24u);
}

// acc[c] += v * x[c, i] for each column: element i of the row (counted from
// the first column's start) met by every column.
fn fma_cols(acc: ptr<function, array<f32, COLS>>, v: f32, i: u32) {
    for (var c = 0u; c < n_cols; c++) {
        (*acc)[c] += v * x[i + c * p.x_stride];
    }
}

// acc[c] += x[c, i]: the sums of inputs a block's minimum multiplies.
fn sum_cols(acc: ptr<function, array<f32, COLS>>, i: u32) {
    for (var c = 0u; c < n_cols; c++) {
        (*acc)[c] += x[i + c * p.x_stride];
    }
}

// acc[c] += scale * part[c].
fn add_scaled(acc: ptr<function, array<f32, COLS>>, scale: f32, part: array<f32, COLS>) {
    for (var c = 0u; c < n_cols; c++) {
        (*acc)[c] += scale * part[c];
    }
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    let row = id.x + id.y * p.groups_x * WG;
    let col0 = id.z * COLS;
    if (row >= p.rows) {
        return;
    }
    n_cols = min(COLS, p.n - col0);
    let n_blocks = p.cols / BLOCK;
    let row_start = row * p.row_bytes;
    let x_start = col0 * p.x_stride;
    var acc: array<f32, COLS>;
    for (var b = 0u; b < n_blocks; b++) {
        block_dot(&acc, row_start + b * BLOCK_BYTES, x_start + b * BLOCK);
    }
    for (var c = 0u; c < n_cols; c++) {
        y[(col0 + c) * p.y_stride + p.y_first + row] = acc[c];
    }
}
