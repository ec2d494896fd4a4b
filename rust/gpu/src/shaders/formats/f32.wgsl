const BLOCK: u32 = 1u;
const BLOCK_BYTES: u32 = 4u;

fn block_dot(o: u32, xo: u32) -> f32 {
    return bitcast<f32>(w[o >> 2u]) * x[xo];
}
