// d and m: f16, 32 high bits, then nibbles; each d * (nibble | high << 4) + m.
const BLOCK: u32 = 32u;
const BLOCK_BYTES: u32 = 24u;

fn block_dot(o: u32, xo: u32) -> f32 {
    let qh = bytes_at(o + 4u);
    var s = 0.0;
    var sx = 0.0;
    for (var j = 0u; j < 16u; j += 4u) {
        let q = bytes_at(o + 8u + j);
        for (var k = 0u; k < 4u; k++) {
            let e = j + k;
            let b = (q >> (8u * k)) & 0xffu;
            let lo = (b & 15u) | (((qh >> e) & 1u) << 4u);
            let hi = (b >> 4u) | (((qh >> (e + 16u)) & 1u) << 4u);
            let x0 = x[xo + e];
            let x1 = x[xo + e + 16u];
            s += f32(lo) * x0 + f32(hi) * x1;
            sx += x0 + x1;
        }
    }
    return f16_at(o) * s + f16_at(o + 2u) * sx;
}
