// What Q4_K and Q5_K share. Their eight 6-bit (scale, min) pairs packed in
// 12 bytes at `o`: ggml's get_scale_min_k4.
fn scale_min_k4(j: u32, o: u32) -> vec2<f32> {
    if (j < 4u) {
        return vec2<f32>(f32(byte_at(o + j) & 63u), f32(byte_at(o + j + 4u) & 63u));
    }
    let sc = (byte_at(o + j + 4u) & 15u) | ((byte_at(o + j - 4u) >> 6u) << 4u);
    let m = (byte_at(o + j + 4u) >> 4u) | ((byte_at(o + j) >> 6u) << 4u);
    return vec2<f32>(f32(sc), f32(m));
}

// A chunk of 64 added to acc: its two halves' sums of q * x (s1, s2) and of
// x (x1, x2), each half with its (scale, min): d * sc * s - dmin * m * x.
fn add_k_chunk(
    acc: ptr<function, array<f32, COLS>>,
    d: f32,
    dmin: f32,
    sm1: vec2<f32>,
    sm2: vec2<f32>,
    s1: array<f32, COLS>,
    s2: array<f32, COLS>,
    x1: array<f32, COLS>,
    x2: array<f32, COLS>,
) {
    add_scaled(acc, d * sm1.x, s1);
    add_scaled(acc, d * sm2.x, s2);
    add_scaled(acc, -dmin * sm1.y, x1);
    add_scaled(acc, -dmin * sm2.y, x2);
}
