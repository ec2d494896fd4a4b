// d and m: f16, 32 high bits, then nibbles; each d * (nibble | high << 4) + m.
const BLOCK: u32 = 32u;
const PIECES: u32 = 1u;
const BLOCK_BYTES: u32 = 24u;

fn block_piece(acc: ptr<function, array<Rf, COLS>>, o: Ru, scale_o: Ru, piece: u32) {
    let qh = bytes_at(o + 4u);
    var s: array<Rf, COLS>;
    var sx: array<f32, COLS>;
    for (var j = 0u; j < 16u; j += 4u) {
        let q = bytes_at(o + 8u + j);
        for (var k = 0u; k < 4u; k++) {
            let e = j + k;
            let b = (q >> Ru(8u * k)) & Ru(0xffu);
            let lo = (b & Ru(15u)) | (((qh >> Ru(e)) & Ru(1u)) << Ru(4u));
            let hi = (b >> Ru(4u)) | (((qh >> Ru(e + 16u)) & Ru(1u)) << Ru(4u));
            fma_cols(&s, Rf(lo), e);
            fma_cols(&s, Rf(hi), e + 16u);
            sum_cols(&sx, e);
            sum_cols(&sx, e + 16u);
        }
    }
    add_scaled(acc, f16_at(o), s);
    add_scaled_sums(acc, f16_at(o + 2u), sx);
}
