// IQ4_NL's and IQ4_XS's sixteen levels (ggml's kvalues_iq4nl).
const IQ4_LEVELS = array<f32, 16>(-127.0, -104.0, -83.0, -65.0, -49.0, -35.0, -22.0, -10.0, 1.0, 13.0, 25.0, 38.0, 53.0, 69.0, 89.0, 113.0);

fn iq4_level1(i: u32) -> f32 {
    return IQ4_LEVELS[i];
}
