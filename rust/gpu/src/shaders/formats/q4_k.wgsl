// d, dmin: f16; 12 bytes of scales and mins; 128 bytes of nibbles. Four
// chunks of 64: the low nibbles of 32 bytes, then their high nibbles, each
// with its own (scale, min): d * sc * q - dmin * m.
const BLOCK: u32 = 256u;
const BLOCK_BYTES: u32 = 144u;

fn block_dot(o: u32, xo: u32) -> f32 {
    let d = f16_at(o);
    let dmin = f16_at(o + 2u);
    var s = 0.0;
    for (var c = 0u; c < 4u; c++) {
        let sm1 = scale_min_k4(2u * c, o + 4u);
        let sm2 = scale_min_k4(2u * c + 1u, o + 4u);
        var s1 = 0.0;
        var s2 = 0.0;
        var x1 = 0.0;
        var x2 = 0.0;
        for (var l = 0u; l < 32u; l += 4u) {
            let q = bytes_at(o + 16u + 32u * c + l);
            for (var k = 0u; k < 4u; k++) {
                let b = (q >> (8u * k)) & 0xffu;
                let xa = x[xo + 64u * c + l + k];
                let xb = x[xo + 64u * c + 32u + l + k];
                s1 += f32(b & 15u) * xa;
                s2 += f32(b >> 4u) * xb;
                x1 += xa;
                x2 += xb;
            }
        }
        s += d * (sm1.x * s1 + sm2.x * s2) - dmin * (sm1.y * x1 + sm2.y * x2);
    }
    return s;
}
