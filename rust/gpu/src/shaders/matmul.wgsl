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
