// What Q4_K and Q5_K share. Their eight 6-bit (scale, min) pairs packed in
// 12 bytes at `o`: ggml's get_scale_min_k4.
struct ScaleMin {
    sc: Rf,
    m: Rf,
}

fn scale_min_k4(j: u32, o: Ru) -> ScaleMin {
    if (j < 4u) {
        return ScaleMin(Rf(byte_at(o + j) & Ru(63u)), Rf(byte_at(o + j + 4u) & Ru(63u)));
    }
    let sc = (byte_at(o + j + 4u) & Ru(15u)) | ((byte_at(o + j - 4u) >> Ru(6u)) << Ru(4u));
    let m = (byte_at(o + j + 4u) >> Ru(4u)) | ((byte_at(o + j) >> Ru(6u)) << Ru(4u));
    return ScaleMin(Rf(sc), Rf(m));
}

// Chunk c (a piece) of a Q4_K or Q5_K block at `o` added to acc: its 32
// bytes of nibbles at `o + qs + 32 c` (the low nibbles its first half, the
// high its second), and for Q5_K (`fifth`) a fifth bit of each element from
// the 32 bytes at `o + 16`: bit 2c of byte l for the first half, 2c + 1 for
// the second. Each half has its own (scale, min): d * sc * q - dmin * m.
fn k_chunk_piece(acc: ptr<function, array<Rf, COLS>>, o: Ru, c: u32, qs: u32, fifth: bool) {
    let d = f16_at(o);
    let dmin = f16_at(o + 2u);
    let sm1 = scale_min_k4(2u * c, o + 4u);
    let sm2 = scale_min_k4(2u * c + 1u, o + 4u);
    var s1: array<Rf, COLS>;
    var s2: array<Rf, COLS>;
    var x1: array<f32, COLS>;
    var x2: array<f32, COLS>;
    for (var l = 0u; l < 32u; l += 4u) {
        let q = bytes_at(o + qs + 32u * c + l);
        var h = Ru(0u);
        if (fifth) {
            h = bytes_at(o + 16u + l);
        }
        for (var k = 0u; k < 4u; k++) {
            let b = (q >> Ru(8u * k)) & Ru(0xffu);
            let hb = (h >> Ru(8u * k)) >> Ru(2u * c);
            let ia = 64u * c + l + k;
            fma_cols(&s1, Rf((b & Ru(15u)) | ((hb & Ru(1u)) << Ru(4u))), ia);
            fma_cols(&s2, Rf((b >> Ru(4u)) | ((hb & Ru(2u)) << Ru(3u))), ia + 32u);
            sum_cols(&x1, ia);
            sum_cols(&x2, ia + 32u);
        }
    }
    add_scaled(acc, d * sm1.sc, s1);
    add_scaled(acc, d * sm2.sc, s2);
    add_scaled_sums(acc, -dmin * sm1.m, x1);
    add_scaled_sums(acc, -dmin * sm2.m, x2);
}
