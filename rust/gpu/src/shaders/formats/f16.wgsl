const BLOCK: u32 = 1u;
const BLOCK_BYTES: u32 = 2u;

fn block_dot(acc: ptr<function, array<Rf, COLS>>, o: Ru) {
    fma_cols(acc, f16_at(o), 0u);
}
