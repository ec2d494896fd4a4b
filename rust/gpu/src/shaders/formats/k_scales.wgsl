// Q4_K's and Q5_K's eight 6-bit (scale, min) pairs packed in 12 bytes at
// `o`: ggml's get_scale_min_k4.
fn scale_min_k4(j: u32, o: u32) -> vec2<f32> {
    if (j < 4u) {
        return vec2<f32>(f32(byte_at(o + j) & 63u), f32(byte_at(o + j + 4u) & 63u));
    }
    let sc = (byte_at(o + j + 4u) & 15u) | ((byte_at(o + j - 4u) >> 6u) << 4u);
    let m = (byte_at(o + j + 4u) >> 4u) | ((byte_at(o + j) >> 6u) << 4u);
    return vec2<f32>(f32(sc), f32(m));
}
