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

// A chunk of 64 added to acc: its two halves' sums of q * x (s1, s2) and of
// x (x1, x2), each half with its (scale, min): d * sc * s - dmin * m * x.
fn add_k_chunk(
    acc: ptr<function, array<Rf, COLS>>,
    d: Rf,
    dmin: Rf,
    sm1: ScaleMin,
    sm2: ScaleMin,
    s1: array<Rf, COLS>,
    s2: array<Rf, COLS>,
    x1: array<f32, COLS>,
    x2: array<f32, COLS>,
) {
    add_scaled(acc, d * sm1.sc, s1);
    add_scaled(acc, d * sm2.sc, s2);
    add_scaled_sums(acc, -dmin * sm1.m, x1);
    add_scaled_sums(acc, -dmin * sm2.m, x2);
}
