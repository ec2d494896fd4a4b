// A gated DeltaNet layer's short causal convolution for one sequence, then
// SiLU: per channel c, each of the `n` rows from `row0` of `x` (`channels`
// wide) meets the last `d_conv` inputs (the state's `d_conv - 1`, oldest
// first, then the row) through the channel's taps `w[c][d_conv]`; the
// state is left holding the last `d_conv - 1` inputs. One thread a channel,
// the rows in order: the CPU's `conv_silu`, summed in the same order.

struct Params {
    n: u32,
    row0: u32,
    channels: u32,
    d_conv: u32,
    // Where this layer's state starts in the sequence's states.
    state_at: u32,
    threads_x: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> w: array<f32>;
@group(0) @binding(2) var<storage, read_write> state: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
var<immediate> p: Params;

const MAX_CONV: u32 = 16u;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    let c = id.x + id.y * p.threads_x;
    if (c >= p.channels) {
        return;
    }
    let keep = p.d_conv - 1u;
    var window: array<f32, MAX_CONV>;
    for (var i = 0u; i < keep; i++) {
        window[i] = state[p.state_at + i * p.channels + c];
    }
    for (var r = 0u; r < p.n; r++) {
        let at = (p.row0 + r) * p.channels + c;
        window[keep] = x[at];
        var s = 0.0;
        for (var i = 0u; i < p.d_conv; i++) {
            s += window[i] * w[c * p.d_conv + i];
        }
        out[at] = s / (1.0 + exp(-s));
        for (var i = 0u; i < keep; i++) {
            window[i] = window[i + 1u];
        }
    }
    for (var i = 0u; i < keep; i++) {
        state[p.state_at + i * p.channels + c] = window[i];
    }
}
