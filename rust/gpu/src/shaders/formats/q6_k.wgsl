// 128 bytes of low nibbles, 64 of 2-bit highs, 16 signed scales, d: f16.
// Two halves of 128; in each, byte l of the lows and highs makes elements
// l, l + 32, l + 64 and l + 96 (each less 32), scaled by the scale of its
// 16 (scales is, is + 2, is + 4, is + 6 of the half, is = l / 16). On
// the device d lies apart (`scale_o`), the rest at `o` as in the file.
const BLOCK: u32 = 256u;
const BLOCK_BYTES: u32 = 210u;
// A piece is half a half: its bytes l of 16 * is..16 * is + 16.
const PIECES: u32 = 4u;

fn block_piece(acc: ptr<function, array<Rf, COLS>>, o: Ru, scale_o: Ru, piece: u32) {
    let d = f16_at(scale_o);
    let h = piece / 2u;
    let is = piece % 2u;
    let ql = o + 64u * h;
    let qh = o + 128u + 32u * h;
    let sc = bytes_at(o + 192u + 8u * h);
    let sc2 = bytes_at(o + 196u + 8u * h);
    let xb = 128u * h;
    var s1: array<Rf, COLS>;
    var s2: array<Rf, COLS>;
    var s3: array<Rf, COLS>;
    var s4: array<Rf, COLS>;
    for (var l = 16u * is; l < 16u * is + 16u; l += 4u) {
        let a = bytes_at(ql + l);
        let b = bytes_at(ql + l + 32u);
        let hh = bytes_at(qh + l);
        for (var k = 0u; k < 4u; k++) {
            let av = (a >> Ru(8u * k)) & Ru(0xffu);
            let bv = (b >> Ru(8u * k)) & Ru(0xffu);
            let hv = (hh >> Ru(8u * k)) & Ru(0xffu);
            let e = xb + l + k;
            fma_cols(&s1, Rf((av & Ru(15u)) | ((hv & Ru(3u)) << Ru(4u))) - 32.0, e);
            fma_cols(&s2, Rf((bv & Ru(15u)) | (((hv >> Ru(2u)) & Ru(3u)) << Ru(4u))) - 32.0, e + 32u);
            fma_cols(&s3, Rf((av >> Ru(4u)) | (((hv >> Ru(4u)) & Ru(3u)) << Ru(4u))) - 32.0, e + 64u);
            fma_cols(&s4, Rf((bv >> Ru(4u)) | (((hv >> Ru(6u)) & Ru(3u)) << Ru(4u))) - 32.0, e + 96u);
        }
    }
    add_scaled(acc, d * i8_of(sc, is), s1);
    add_scaled(acc, d * i8_of(sc, is + 2u), s2);
    add_scaled(acc, d * i8_of(sc2, is), s3);
    add_scaled(acc, d * i8_of(sc2, is + 2u), s4);
}
