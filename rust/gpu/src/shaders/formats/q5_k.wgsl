// As Q4_K, with a fifth bit per element from 32 bytes of high bits: chunk c
// reads bit 2c (low nibbles) and bit 2c + 1 (high nibbles) of byte l.
const BLOCK: u32 = 256u;
const BLOCK_BYTES: u32 = 176u;
// A piece is a chunk of 64.
const PIECES: u32 = 4u;

fn block_piece(acc: ptr<function, array<Rf, COLS>>, o: Ru, scale_o: Ru, c: u32) {
    k_chunk_piece(acc, o, c, 48u, true);
}
