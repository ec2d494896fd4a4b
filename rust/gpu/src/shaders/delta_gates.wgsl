// A gated DeltaNet layer's per-head terms, in place over `n` values (rows
// of `n_v_heads`): beta = sigmoid(beta), and the log decay
// gate = softplus(alpha + dt_bias) * a (a = -exp(A_log), as the file
// stores it; softplus the identity above 20, as ggml's).

struct Params {
    n: u32,
    threads_x: u32,
    n_v_heads: u32,
    _pad: u32,
}

@group(0) @binding(0) var<storage, read_write> beta: array<f32>;
@group(0) @binding(1) var<storage, read_write> gate: array<f32>;
@group(0) @binding(2) var<storage, read> dt_bias: array<f32>;
@group(0) @binding(3) var<storage, read> a: array<f32>;
var<immediate> p: Params;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    let i = id.x + id.y * p.threads_x;
    if (i >= p.n) {
        return;
    }
    let h = i % p.n_v_heads;
    beta[i] = 1.0 / (1.0 + exp(-beta[i]));
    let x = gate[i] + dt_bias[h];
    let softplus = select(log(1.0 + exp(x)), x, x > 20.0);
    gate[i] = softplus * a[h];
}
