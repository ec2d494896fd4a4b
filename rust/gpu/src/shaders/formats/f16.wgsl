const BLOCK: u32 = 1u;
const BLOCK_BYTES: u32 = 2u;

fn block_dot(o: u32, xo: u32) -> f32 {
    return f16_at(o) * x[xo];
}
