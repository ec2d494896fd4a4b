const BLOCK: u32 = 1u;
const PIECES: u32 = 1u;
const BLOCK_BYTES: u32 = 2u;

fn block_piece(acc: ptr<function, array<Rf, COLS>>, o: Ru, scale_o: Ru, piece: u32) {
    fma_cols(acc, bitcast<Rf>((bytes_at(o) & Ru(0xffffu)) << Ru(16u)), 0u);
}
