const BLOCK: u32 = 1u;
const BLOCK_BYTES: u32 = 2u;

fn block_dot(acc: ptr<function, array<f32, COLS>>, o: u32, xo: u32) {
    fma_cols(acc, bitcast<f32>((bytes_at(o) & 0xffffu) << 16u), xo);
}
