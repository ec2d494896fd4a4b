// d and m: f16, then nibbles as Q4_0's, each d * q + m.
const BLOCK: u32 = 32u;
const BLOCK_BYTES: u32 = 20u;

fn block_dot(acc: ptr<function, array<f32, COLS>>, o: u32, xo: u32) {
    var s: array<f32, COLS>;
    var sx: array<f32, COLS>;
    for (var j = 0u; j < 16u; j += 4u) {
        let q = bytes_at(o + 4u + j);
        for (var k = 0u; k < 4u; k++) {
            let b = (q >> (8u * k)) & 0xffu;
            fma_cols(&s, f32(b & 15u), xo + j + k);
            fma_cols(&s, f32(b >> 4u), xo + j + k + 16u);
            sum_cols(&sx, xo + j + k);
            sum_cols(&sx, xo + j + k + 16u);
        }
    }
    add_scaled(acc, f16_at(o), s);
    add_scaled(acc, f16_at(o + 2u), sx);
}
