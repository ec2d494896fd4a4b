// d: f16, then 32 signed bytes. On the device d lies apart (`scale_o`),
// the 32 bytes at `o`.
const BLOCK: u32 = 32u;
const PIECES: u32 = 1u;
const BLOCK_BYTES: u32 = 34u;

fn block_piece(acc: ptr<function, array<Rf, COLS>>, o: Ru, scale_o: Ru, piece: u32) {
    var s: array<Rf, COLS>;
    for (var j = 0u; j < 32u; j += 4u) {
        let q = bytes_at(o + j);
        for (var k = 0u; k < 4u; k++) {
            fma_cols(&s, i8_of(q, k), j + k);
        }
    }
    add_scaled(acc, f16_at(scale_o), s);
}
