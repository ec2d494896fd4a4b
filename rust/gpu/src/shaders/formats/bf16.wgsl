const BLOCK: u32 = 1u;
const BLOCK_BYTES: u32 = 2u;

fn block_dot(o: u32, xo: u32) -> f32 {
    return bitcast<f32>((bytes_at(o) & 0xffffu) << 16u) * x[xo];
}
