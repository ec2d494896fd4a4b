// d, dmin: f16; 12 bytes of scales and mins; 128 bytes of nibbles. Four
// chunks of 64: the low nibbles of 32 bytes, then their high nibbles, each
// with its own (scale, min): d * sc * q - dmin * m.
const BLOCK: u32 = 256u;
const BLOCK_BYTES: u32 = 144u;
// A piece is a chunk of 64.
const PIECES: u32 = 4u;

fn block_piece(acc: ptr<function, array<Rf, COLS>>, o: Ru, c: u32) {
    let d = f16_at(o);
    let dmin = f16_at(o + 2u);
    let sm1 = scale_min_k4(2u * c, o + 4u);
    let sm2 = scale_min_k4(2u * c + 1u, o + 4u);
    var s1: array<Rf, COLS>;
    var s2: array<Rf, COLS>;
    var x1: array<f32, COLS>;
    var x2: array<f32, COLS>;
    for (var l = 0u; l < 32u; l += 4u) {
        let q = bytes_at(o + 16u + 32u * c + l);
        for (var k = 0u; k < 4u; k++) {
            let b = (q >> Ru(8u * k)) & Ru(0xffu);
            let ia = 64u * c + l + k;
            fma_cols(&s1, Rf(b & Ru(15u)), ia);
            fma_cols(&s2, Rf(b >> Ru(4u)), ia + 32u);
            sum_cols(&x1, ia);
            sum_cols(&x2, ia + 32u);
        }
    }
    add_k_chunk(acc, d, dmin, sm1, sm2, s1, s2, x1, x2);
}
