// A mixture's expert products: y[c, r] = Σ_k dequant(w[ids[c]])[r, k] ·
// x[c / x_group, k] for each chosen (row, expert) pair c, the experts of
// one tensor side by side in `w`, each `rows` rows of the file's format
// (llama.cpp's mul_mat_id). A column's expert is chosen on the device, so
// nothing is read back between the router and the experts.
//
// One thread a weight row and one column (each column may read another
// expert, so no block is shared between columns). A run of the tensor holds
// experts first_expert..first_expert + n_experts; a column whose expert
// another run holds is left to that run's dispatch.

struct Params {
    rows: u32,
    cols: u32,
    n: u32,
    row_bytes: u32,
    groups_x: u32,
    x_stride: u32,
    y_stride: u32,
    // Columns that read one input row: the experts a row chose (gate and
    // up read the row's input), or 1 (down reads each pair's own row).
    x_group: u32,
    first_expert: u32,
    n_experts: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<storage, read> w: array<u32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> ids: array<u32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
var<immediate> p: Params;

// Where the block being read starts in this thread's input row.
var<private> x_block: u32;

// Element e of the block being read of input column c.
fn x_at(e: u32, c: u32) -> f32 {
    return x[x_block + e + c * p.x_stride];
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    let row = id.x + id.y * p.groups_x * WG;
    let col = id.z;
    if (row >= p.rows || col >= p.n) {
        return;
    }
    let expert = ids[col];
    if (expert < p.first_expert || expert >= p.first_expert + p.n_experts) {
        return;
    }
    let n_blocks = p.cols / BLOCK;
    let row_start = ((expert - p.first_expert) * p.rows + row) * p.row_bytes;
    let x_start = (col / p.x_group) * p.x_stride;
    var acc: array<Rf, COLS>;
    for (var b = 0u; b < n_blocks; b++) {
        x_block = x_start + b * BLOCK;
        for (var piece = 0u; piece < PIECES; piece++) {
            block_piece(&acc, block_bytes_at(row_start, b, n_blocks), block_scale_at(row_start, b), piece);
        }
    }
    y[col * p.y_stride + row] = acc[0];
}
