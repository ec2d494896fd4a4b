// d: f16, scales_h: u16, scales_l: 4 bytes, then 128 bytes of 4-bit level
// indices: 8 sub-blocks of 32 as IQ4_NL lays one out (16 bytes each), each
// scaled by d * (ls - 32), ls 6 bits: nibble ib % 2 of scales_l[ib / 2],
// with bits 2 ib and 2 ib + 1 of scales_h on top.
const BLOCK: u32 = 256u;
const BLOCK_BYTES: u32 = 136u;
// A piece is a sub-block of 32.
const PIECES: u32 = 8u;

fn block_piece(acc: ptr<function, array<Rf, COLS>>, o: Ru, scale_o: Ru, ib: u32) {
    let d = f16_at(o);
    let scales_h = bytes_at(o + 2u) & Ru(0xffffu);
    let scales_l = bytes_at(o + 4u);
    let ls = ((scales_l >> Ru(4u * ib)) & Ru(15u)) | (((scales_h >> Ru(2u * ib)) & Ru(3u)) << Ru(4u));
    var s: array<Rf, COLS>;
    let qo = o + 8u + 16u * ib;
    let xb = 32u * ib;
    for (var j = 0u; j < 16u; j += 4u) {
        let q = bytes_at(qo + j);
        for (var k = 0u; k < 4u; k++) {
            let b = (q >> Ru(8u * k)) & Ru(0xffu);
            fma_cols(&s, iq4_level(b & Ru(15u)), xb + j + k);
            fma_cols(&s, iq4_level(b >> Ru(4u)), xb + j + k + 16u);
        }
    }
    add_scaled(acc, d * (Rf(ls) - 32.0), s);
}
