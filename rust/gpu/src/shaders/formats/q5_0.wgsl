// d: f16, 32 high bits (bit j of element j), then nibbles as Q4_0's; each
// element (nibble | high bit << 4) - 16. On the device d lies apart
// (`scale_o`), the high bits and nibbles at `o`.
const BLOCK: u32 = 32u;
const PIECES: u32 = 1u;
const BLOCK_BYTES: u32 = 22u;

fn block_piece(acc: ptr<function, array<Rf, COLS>>, o: Ru, scale_o: Ru, piece: u32) {
    let qh = bytes_at(o);
    var s: array<Rf, COLS>;
    for (var j = 0u; j < 16u; j += 4u) {
        let q = bytes_at(o + 4u + j);
        for (var k = 0u; k < 4u; k++) {
            let e = j + k;
            let b = (q >> Ru(8u * k)) & Ru(0xffu);
            let lo = (b & Ru(15u)) | (((qh >> Ru(e)) & Ru(1u)) << Ru(4u));
            let hi = (b >> Ru(4u)) | (((qh >> Ru(e + 16u)) & Ru(1u)) << Ru(4u));
            fma_cols(&s, Rf(lo) - 16.0, e);
            fma_cols(&s, Rf(hi) - 16.0, e + 16u);
        }
    }
    add_scaled(acc, f16_at(scale_o), s);
}
