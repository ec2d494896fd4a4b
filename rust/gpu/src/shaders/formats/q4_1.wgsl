// d and m: f16, then nibbles as Q4_0's, each d * q + m.
const BLOCK: u32 = 32u;
const PIECES: u32 = 1u;
const BLOCK_BYTES: u32 = 20u;

fn block_piece(acc: ptr<function, array<Rf, COLS>>, o: Ru, scale_o: Ru, piece: u32) {
    var s: array<Rf, COLS>;
    var sx: array<f32, COLS>;
    for (var j = 0u; j < 16u; j += 4u) {
        let q = bytes_at(o + 4u + j);
        for (var k = 0u; k < 4u; k++) {
            let b = (q >> Ru(8u * k)) & Ru(0xffu);
            fma_cols(&s, Rf(b & Ru(15u)), j + k);
            fma_cols(&s, Rf(b >> Ru(4u)), j + k + 16u);
            sum_cols(&sx, j + k);
            sum_cols(&sx, j + k + 16u);
        }
    }
    add_scaled(acc, f16_at(o), s);
    add_scaled_sums(acc, f16_at(o + 2u), sx);
}
