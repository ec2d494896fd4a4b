// A matrix product's inputs laid out block-major for `matmul_rows.wgsl`
// (`laid_out.wgsl`'s layout), each row of `cols` on its own.

struct Params {
    n: u32,
    threads_x: u32,
    cols: u32,
    block: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
var<immediate> p: Params;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    let i = id.x + id.y * p.threads_x;
    if (i >= p.n) {
        return;
    }
    let k = i % p.cols;
    out[i - k + laid_out_at(k, p.cols, p.block)] = x[i];
}
