// The products' form of one row a thread (see `matmul_common.wgsl`): a
// row's lane is a plain value.

alias Ru = u32;
alias Rf = f32;
alias Ri = i32;
const R: u32 = 1u;
const ROW_STEPS = 0u;
fn bytes_at(o: Ru) -> Ru {
    return bytes_at1(o);
}
fn byte_at(o: Ru) -> Ru {
    return byte_at1(o);
}
fn word_at(o: Ru) -> Ru {
    return w[o >> 2u];
}
fn f16_at(o: Ru) -> Rf {
    return f16_at1(o);
}
fn row_value(v: Rf, k: u32) -> f32 {
    return v;
}
