// Qwen3.5's gated attention: each row of the query projection holds, per
// head, its query then its gate (`head_dim` each); the queries close up
// into `q` and the gates into `gates` (rows of `n_head * head_dim`). One
// thread a value.

struct Params {
    n: u32,
    threads_x: u32,
    head_dim: u32,
    _pad: u32,
}

@group(0) @binding(0) var<storage, read> raw: array<f32>;
@group(0) @binding(1) var<storage, read_write> q: array<f32>;
@group(0) @binding(2) var<storage, read_write> gates: array<f32>;
var<immediate> p: Params;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    let i = id.x + id.y * p.threads_x;
    if (i >= p.n) {
        return;
    }
    // Head (of every row's heads, counted on) and element.
    let head = i / p.head_dim;
    let e = i % p.head_dim;
    let at = head * 2u * p.head_dim + e;
    q[i] = raw[at];
    gates[i] = raw[at + p.head_dim];
}
