// d: f16, 32 high bits (bit j of element j), then nibbles as Q4_0's; each
// element (nibble | high bit << 4) - 16.
const BLOCK: u32 = 32u;
const BLOCK_BYTES: u32 = 22u;

fn block_dot(acc: ptr<function, array<f32, COLS>>, o: u32, xo: u32) {
    let qh = bytes_at(o + 2u);
    var s: array<f32, COLS>;
    for (var j = 0u; j < 16u; j += 4u) {
        let q = bytes_at(o + 6u + j);
        for (var k = 0u; k < 4u; k++) {
            let e = j + k;
            let b = (q >> (8u * k)) & 0xffu;
            let lo = (b & 15u) | (((qh >> e) & 1u) << 4u);
            let hi = (b >> 4u) | (((qh >> (e + 16u)) & 1u) << 4u);
            fma_cols(&s, f32(lo) - 16.0, xo + e);
            fma_cols(&s, f32(hi) - 16.0, xo + e + 16u);
        }
    }
    add_scaled(acc, f16_at(o), s);
}
