// The gated activations, shared by the element-wise kernels and the gated
// product so that both round alike: ggml's SiLU and tanh-approximated GELU
// of the gate times the up value, and a sigmoid gate (Qwen3.5's gated
// attention) of b.

fn silu_mul_of(g: f32, u: f32) -> f32 {
    return g / (1.0 + exp(-g)) * u;
}

fn gelu_mul_of(g: f32, u: f32) -> f32 {
    // tanh(z) as 1 - 2 / (e^2z + 1), which stays finite where WGSL's
    // tanh may not for large |z|.
    let z = 0.7978846 * g * (1.0 + 0.044715 * g * g);
    let t = 1.0 - 2.0 / (exp(min(2.0 * z, 80.0)) + 1.0);
    return 0.5 * g * (1.0 + t) * u;
}

fn sigmoid_mul_of(a: f32, b: f32) -> f32 {
    return b / (1.0 + exp(-a));
}
