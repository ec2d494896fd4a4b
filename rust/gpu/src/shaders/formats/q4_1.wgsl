// d and m: f16, then nibbles as Q4_0's, each d * q + m.
const BLOCK: u32 = 32u;
const BLOCK_BYTES: u32 = 20u;

fn block_dot(o: u32, xo: u32) -> f32 {
    var s = 0.0;
    var sx = 0.0;
    for (var j = 0u; j < 16u; j += 4u) {
        let q = bytes_at(o + 4u + j);
        for (var k = 0u; k < 4u; k++) {
            let b = (q >> (8u * k)) & 0xffu;
            let x0 = x[xo + j + k];
            let x1 = x[xo + j + k + 16u];
            s += f32(b & 15u) * x0 + f32(b >> 4u) * x1;
            sx += x0 + x1;
        }
    }
    return f16_at(o) * s + f16_at(o + 2u) * sx;
}
