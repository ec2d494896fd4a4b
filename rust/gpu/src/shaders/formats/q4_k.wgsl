// d, dmin: f16; 12 bytes of scales and mins; 128 bytes of nibbles. Four
// chunks of 64: the low nibbles of 32 bytes, then their high nibbles, each
// with its own (scale, min): d * sc * q - dmin * m.
const BLOCK: u32 = 256u;
const BLOCK_BYTES: u32 = 144u;
// A piece is a chunk of 64.
const PIECES: u32 = 4u;

fn block_piece(acc: ptr<function, array<Rf, COLS>>, o: Ru, scale_o: Ru, c: u32) {
    k_chunk_piece(acc, o, c, 16u, false);
}
