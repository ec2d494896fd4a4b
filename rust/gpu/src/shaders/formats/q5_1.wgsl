// d and m: f16, 32 high bits, then nibbles; each d * (nibble | high << 4) + m.
const BLOCK: u32 = 32u;
const BLOCK_BYTES: u32 = 24u;

fn block_dot(acc: ptr<function, array<f32, COLS>>, o: u32, xo: u32) {
    let qh = bytes_at(o + 4u);
    var s: array<f32, COLS>;
    var sx: array<f32, COLS>;
    for (var j = 0u; j < 16u; j += 4u) {
        let q = bytes_at(o + 8u + j);
        for (var k = 0u; k < 4u; k++) {
            let e = j + k;
            let b = (q >> (8u * k)) & 0xffu;
            let lo = (b & 15u) | (((qh >> e) & 1u) << 4u);
            let hi = (b >> 4u) | (((qh >> (e + 16u)) & 1u) << 4u);
            fma_cols(&s, f32(lo), xo + e);
            fma_cols(&s, f32(hi), xo + e + 16u);
            sum_cols(&sx, xo + e);
            sum_cols(&sx, xo + e + 16u);
        }
    }
    add_scaled(acc, f16_at(o), s);
    add_scaled(acc, f16_at(o + 2u), sx);
}
