// y[c, r] = Σ_k dequant(w)[r, k] · x[c, k] for every row r of a weight
// matrix kept in its file format, and every column c of the input.
//
// A workgroup takes ROWS rows and up to COLS columns (8 for a prompt, 1 for
// a decoded token), THREADS threads a row: thread j of a row takes its
// blocks j, j + THREADS, ..., each dequantized once for all its columns, so
// neighbouring threads read neighbouring bytes (one thread walking a whole
// row, as this kernel did first, read a card's memory at 2% of its rate or
// less). The threads of a row then add their sums in workgroup memory. The
// inputs come laid out block-major (`block_inputs.wgsl`): element e of every
// block of a column side by side, so that neighbouring threads, each at
// element e of its own block, read neighbouring floats. The weights are the
// file's bytes in an array of words, so a block may start at any byte: every
// read goes through `bytes_at`, which joins two words where a read straddles
// them. BLOCK (elements a block holds), BLOCK_BYTES and `block_dot` (a
// block's products with every column, added to `acc`) come from the format's
// own file, appended to this one.

const THREADS: u32 = 32u;
const ROWS: u32 = WG / THREADS;

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
var<immediate> p: Params;

var<workgroup> partial: array<f32, WG * COLS>;

// Where this workgroup's first column starts, its last column (counted
// from the first), and blocks a row holds.
var<private> x_col0: u32;
var<private> last_col: u32;
var<private> n_blocks: u32;

// Element i of input column c (i counted from the column's start), in the
// block-major layout. Columns past the input's last read the last one
// again: their sums are not written.
fn x_at(i: u32, c: u32) -> f32 {
    return x[x_col0 + min(c, last_col) * p.x_stride + (i % BLOCK) * n_blocks + i / BLOCK];
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) g: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = (g.x + g.y * p.groups_x) * ROWS + lid / THREADS;
    let lane = lid % THREADS;
    let col0 = g.z * COLS;
    let n_cols = min(COLS, p.n - col0);
    last_col = n_cols - 1u;
    x_col0 = col0 * p.x_stride;
    n_blocks = p.cols / BLOCK;
    var acc: array<f32, COLS>;
    if (row < p.rows) {
        let row_start = row * p.row_bytes;
        for (var b = lane; b < n_blocks; b += THREADS) {
            block_dot(&acc, row_start + b * BLOCK_BYTES, b * BLOCK);
        }
    }
    for (var c = 0u; c < COLS; c++) {
        partial[c * WG + lid] = acc[c];
    }
    workgroupBarrier();
    for (var s = THREADS / 2u; s > 0u; s >>= 1u) {
        if (lane < s) {
            for (var c = 0u; c < COLS; c++) {
                partial[c * WG + lid] += partial[c * WG + lid + s];
            }
        }
        workgroupBarrier();
    }
    if (lane == 0u && row < p.rows) {
        for (var c = 0u; c < n_cols; c++) {
            y[(col0 + c) * p.y_stride + p.y_first + row] = partial[c * WG + lid];
        }
    }
}
