// d: f16, then 32 signed bytes.
const BLOCK: u32 = 32u;
const BLOCK_BYTES: u32 = 34u;

fn block_dot(o: u32, xo: u32) -> f32 {
    var s = 0.0;
    for (var j = 0u; j < 32u; j += 4u) {
        let q = bytes_at(o + 2u + j);
        for (var k = 0u; k < 4u; k++) {
            s += i8_of(q, k) * x[xo + j + k];
        }
    }
    return f16_at(o) * s;
}
