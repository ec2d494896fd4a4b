// 16 bytes of 4-bit (scale, min) pairs, 64 bytes of 2-bit values, d and
// dmin: f16. Two halves of 128; in half n, the shift-th pair of bits of
// bytes 0..16 and 16..32 of its 32 make 16 elements each, with scales
// 8n + 2j and 8n + 2j + 1 (j = shift / 2): d * (sc & 15) * q - dmin * (sc >> 4).
const BLOCK: u32 = 256u;
const BLOCK_BYTES: u32 = 84u;
// A piece is a shift's 32 elements of a half (n, j = piece / 4, piece % 4).
const PIECES: u32 = 8u;

fn block_piece(acc: ptr<function, array<Rf, COLS>>, o: Ru, scale_o: Ru, piece: u32) {
    let d = f16_at(o + 80u);
    let dmin = f16_at(o + 82u);
    let n = piece / 4u;
    let j = piece % 4u;
    for (var part = 0u; part < 2u; part++) {
        let sc = byte_at(o + 8u * n + 2u * j + part);
        var sq: array<Rf, COLS>;
        var sx: array<f32, COLS>;
        for (var l = 0u; l < 16u; l += 4u) {
            let q = bytes_at(o + 16u + 32u * n + 16u * part + l);
            for (var k = 0u; k < 4u; k++) {
                let i = 128u * n + 32u * j + 16u * part + l + k;
                fma_cols(&sq, Rf((q >> Ru(8u * k + 2u * j)) & Ru(3u)), i);
                sum_cols(&sx, i);
            }
        }
        add_scaled(acc, d * Rf(sc & Ru(15u)), sq);
        add_scaled_sums(acc, -dmin * Rf(sc >> Ru(4u)), sx);
    }
}
