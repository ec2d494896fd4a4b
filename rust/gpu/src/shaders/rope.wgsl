// Rotates the first 2 * half dimensions of every head of `rows` rows of
// `heads` heads (`head_dim` apart), by the angles the host computed for each
// row (cos and sin: [rows, half]), as the CPU's rope_apply does: adjacent
// pairs (2i, 2i + 1), or halves (i, i + half). One thread a pair, in place.

struct Params {
    rows: u32,
    heads: u32,
    head_dim: u32,
    half: u32,
    // 0: adjacent pairs; 1: halves.
    halves: u32,
    threads_x: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@group(0) @binding(1) var<storage, read> cos_t: array<f32>;
@group(0) @binding(2) var<storage, read> sin_t: array<f32>;
var<immediate> p: Params;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    let i = id.x + id.y * p.threads_x;
    if (i >= p.rows * p.heads * p.half) {
        return;
    }
    let pair = i % p.half;
    let head = (i / p.half) % p.heads;
    let row = i / (p.half * p.heads);
    let base = (row * p.heads + head) * p.head_dim;
    var ia = base + 2u * pair;
    var ib = ia + 1u;
    if (p.halves == 1u) {
        ia = base + pair;
        ib = ia + p.half;
    }
    let r = rotate(x[ia], x[ib], cos_t[row * p.half + pair], sin_t[row * p.half + pair]);
    x[ia] = r.x;
    x[ib] = r.y;
}
