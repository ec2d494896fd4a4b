// x[i] += b[i % period]: the residual add (period n), or a bias added to
// every row (period the row's width). One thread a value.

struct Params {
    n: u32,
    threads_x: u32,
    period: u32,
    _pad: u32,
}

@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
var<immediate> p: Params;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    let i = id.x + id.y * p.threads_x;
    if (i < p.n) {
        x[i] += b[i % p.period];
    }
}
