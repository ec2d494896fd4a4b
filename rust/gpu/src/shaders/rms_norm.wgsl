// out[r, i] = x[r, i] / sqrt(mean_i(x[r, i]^2) + eps) * weight[i], one
// workgroup a row (rows past the dispatch limit along y). Its forms take in
// the kernels around it (`kernels.rs` gives `x`, `load` and `store`): a
// residual add before it (x[r] += b[r] first, the sum kept), and the
// laying out of its output for the product that reads it next
// (`block_inputs.wgsl`'s layout, into `laid_out`), each rounding as the
// kernel it stands for does, a kernel fewer each.

struct Params {
    width: u32,
    rows: u32,
    eps: f32,
    groups_x: u32,
    // The block of the layout (for the form that lays its output out).
    block: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(1) var<storage, read> weight: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
var<immediate> p: Params;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) g: vec3<u32>, invocation: Invocation) {
    let lid = index_of(invocation);
    let row = g.x + g.y * p.groups_x;
    if (row >= p.rows) {
        return;
    }
    let start = row * p.width;
    var acc = 0.0;
    // A thread reads back only what it wrote itself.
    for (var i = lid; i < p.width; i += WG) {
        let v = load(start + i);
        acc += v * v;
    }
    let sum = workgroup_sum(lid, acc);
    let scale = inverseSqrt(sum / f32(p.width) + p.eps);
    for (var i = lid; i < p.width; i += WG) {
        store(start, i, x[start + i] * scale * weight[i]);
    }
}
