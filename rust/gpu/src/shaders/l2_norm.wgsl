// x / sqrt(Σx² + eps) in place, over the first `heads` heads (`width`
// wide) of each of `rows` rows `stride` apart: a gated DeltaNet layer's
// queries and keys, which lead each row of its convolution's output. One
// workgroup a head.

struct Params {
    rows: u32,
    heads: u32,
    width: u32,
    stride: u32,
    eps: f32,
    groups_x: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<storage, read_write> x: array<f32>;
var<immediate> p: Params;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) g: vec3<u32>, invocation: Invocation) {
    let lid = index_of(invocation);
    let head = g.x + g.y * p.groups_x;
    if (head >= p.rows * p.heads) {
        return;
    }
    let start = (head / p.heads) * p.stride + (head % p.heads) * p.width;
    var acc = 0.0;
    for (var i = lid; i < p.width; i += WG) {
        let v = x[start + i];
        acc += v * v;
    }
    let sum = workgroup_sum(lid, acc);
    let inv = 1.0 / sqrt(sum + p.eps);
    for (var i = lid; i < p.width; i += WG) {
        x[start + i] *= inv;
    }
}
