const BLOCK: u32 = 1u;
const BLOCK_BYTES: u32 = 4u;

fn block_dot(acc: ptr<function, array<f32, COLS>>, o: u32, xo: u32) {
    fma_cols(acc, bitcast<f32>(w[o >> 2u]), xo);
}
