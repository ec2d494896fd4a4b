// y[c, r] = Σ_k dequant(w)[r, k] · x[c, k] for every row r of a weight
// matrix kept in its file format, and every column c of the input.
//
// One workgroup a (row, column): its threads take the row's blocks in turn
// and their sums meet in workgroup memory. The weights are the file's bytes
// in an array of words, so a block may start at any byte: every read goes
// through `bytes_at`, which joins two words where a read straddles them.
// BLOCK (elements a block holds), BLOCK_BYTES and `block_dot` come from the
// format's own file, prepended to this one.

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
var<workgroup> partial: array<f32, WG>;

// The four bytes at byte offset `o` of the weights, little-endian.
fn bytes_at(o: u32) -> u32 {
    let i = o >> 2u;
    let s = (o & 3u) * 8u;
    if (s == 0u) {
        return w[i];
    }
    return (w[i] >> s) | (w[i + 1u] << (32u - s));
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

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) g: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = g.x + g.y * p.groups_x;
    let col = g.z;
    // Uniform across the workgroup, so the barriers below stay in uniform control flow.
    if (row >= p.rows) {
        return;
    }
    let n_blocks = p.cols / BLOCK;
    let row_start = row * p.row_bytes;
    let x_start = col * p.x_stride;
    var acc = 0.0;
    for (var b = lid; b < n_blocks; b += WG) {
        acc += block_dot(row_start + b * BLOCK_BYTES, x_start + b * BLOCK);
    }
    partial[lid] = acc;
    workgroupBarrier();
    for (var half = WG / 2u; half > 0u; half >>= 1u) {
        if (lid < half) {
            partial[lid] += partial[lid + half];
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
        y[col * p.y_stride + p.y_first + row] = partial[0];
    }
}
