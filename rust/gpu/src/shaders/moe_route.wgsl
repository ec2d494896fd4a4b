// A mixture's router: per row of router logits, the softmax's top n_used
// experts (ties to the lower expert), their probabilities normalised to sum
// to one where the model asks (the sum clamped below at f16's smallest
// normal) and scaled, as llama.cpp's build_moe_ffn and the CPU's
// MoeScratch::route take them. One thread a row.

struct Params {
    rows: u32,
    n_expert: u32,
    n_used: u32,
    normalise: u32,
    scale: f32,
    threads_x: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<storage, read> logits: array<f32>;
@group(0) @binding(1) var<storage, read_write> ids: array<u32>;
@group(0) @binding(2) var<storage, read_write> weights: array<f32>;
var<immediate> p: Params;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    let j = id.x + id.y * p.threads_x;
    if (j >= p.rows) {
        return;
    }
    let row = j * p.n_expert;
    var top = logits[row];
    for (var i = 1u; i < p.n_expert; i++) {
        top = max(top, logits[row + i]);
    }
    var sum = 0.0;
    for (var i = 0u; i < p.n_expert; i++) {
        sum += exp(logits[row + i] - top);
    }
    let first = j * p.n_used;
    var total = 0.0;
    for (var s = 0u; s < p.n_used; s++) {
        var best = 0u;
        var best_p = -1.0;
        for (var i = 0u; i < p.n_expert; i++) {
            var taken = false;
            for (var u = 0u; u < s; u++) {
                taken = taken || ids[first + u] == i;
            }
            let prob = exp(logits[row + i] - top) / sum;
            if (!taken && prob > best_p) {
                best = i;
                best_p = prob;
            }
        }
        ids[first + s] = best;
        weights[first + s] = best_p;
        total += best_p;
    }
    let div = select(1.0, max(total, 6.1035156e-5), p.normalise != 0u);
    for (var s = 0u; s < p.n_used; s++) {
        weights[first + s] = weights[first + s] / div * p.scale;
    }
}
