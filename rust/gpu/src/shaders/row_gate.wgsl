// x[j, i] *= sigmoid(z[j]) over `rows` rows of `width`, in place: a shared
// expert's output scaled by its gate (Qwen3.5's mixtures). One thread a
// value.

struct Params {
    n: u32,
    threads_x: u32,
    width: u32,
    _pad: u32,
}

@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@group(0) @binding(1) var<storage, read> z: array<f32>;
var<immediate> p: Params;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    let i = id.x + id.y * p.threads_x;
    if (i < p.n) {
        x[i] *= 1.0 / (1.0 + exp(-z[i / p.width]));
    }
}
