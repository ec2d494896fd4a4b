// Element by element over `n` values: the gated FFN's activations and a
// sigmoid gate (`activations.wgsl`).
// One thread a value. The gate and the output are rows of `width`; the up
// values may sit in wider rows (`b_stride`) from `b_at` (gemma4's
// per-layer inputs: one layer's slice of each token's row).

struct Params {
    n: u32,
    // Threads along x: values past the dispatch limit go to y.
    threads_x: u32,
    width: u32,
    b_stride: u32,
    b_at: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
var<immediate> p: Params;

fn index(id: vec3<u32>) -> u32 {
    return id.x + id.y * p.threads_x;
}

// Where the up value of element i sits.
fn b_index(i: u32) -> u32 {
    return (i / p.width) * p.b_stride + p.b_at + i % p.width;
}

@compute @workgroup_size(64)
fn silu_mul(@builtin(global_invocation_id) id: vec3<u32>) {
    let i = index(id);
    if (i < p.n) {
        out[i] = silu_mul_of(a[i], b[b_index(i)]);
    }
}

@compute @workgroup_size(64)
fn gelu_mul(@builtin(global_invocation_id) id: vec3<u32>) {
    let i = index(id);
    if (i < p.n) {
        out[i] = gelu_mul_of(a[i], b[b_index(i)]);
    }
}

@compute @workgroup_size(64)
fn sigmoid_mul(@builtin(global_invocation_id) id: vec3<u32>) {
    let i = index(id);
    if (i < p.n) {
        out[i] = sigmoid_mul_of(a[i], b[b_index(i)]);
    }
}
