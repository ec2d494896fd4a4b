// A mixture's output: out[j, i] (=, or += beside a shared expert)
// Σ_s weight[j, s] · scale[expert] · y[j * n_used + s, i], over the experts
// row j chose. One thread a value.

struct Params {
    rows: u32,
    width: u32,
    n_used: u32,
    accumulate: u32,
    threads_x: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<storage, read> y: array<f32>;
@group(0) @binding(1) var<storage, read> ids: array<u32>;
@group(0) @binding(2) var<storage, read> weights: array<f32>;
@group(0) @binding(3) var<storage, read> expert_scale: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
var<immediate> p: Params;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    let k = id.x + id.y * p.threads_x;
    if (k >= p.rows * p.width) {
        return;
    }
    let j = k / p.width;
    let i = k % p.width;
    var acc = 0.0;
    for (var s = 0u; s < p.n_used; s++) {
        let c = j * p.n_used + s;
        acc += y[c * p.width + i] * expert_scale[ids[c]] * weights[c];
    }
    out[k] = select(acc, out[k] + acc, p.accumulate != 0u);
}
