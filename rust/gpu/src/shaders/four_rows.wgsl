// The products' form of four rows a thread (see `matmul_common.wgsl`):
// a row a lane of a vec4, each lane's arithmetic the one row's.

alias Ru = vec4<u32>;
alias Rf = vec4<f32>;
alias Ri = vec4<i32>;
const R: u32 = 4u;
const ROW_STEPS = vec4<u32>(0u, 1u, 2u, 3u);
fn bytes_at(o: Ru) -> Ru {
    return Ru(bytes_at1(o.x), bytes_at1(o.y), bytes_at1(o.z), bytes_at1(o.w));
}
fn byte_at(o: Ru) -> Ru {
    return Ru(byte_at1(o.x), byte_at1(o.y), byte_at1(o.z), byte_at1(o.w));
}
fn word_at(o: Ru) -> Ru {
    return Ru(w[o.x >> 2u], w[o.y >> 2u], w[o.z >> 2u], w[o.w >> 2u]);
}
fn f16_at(o: Ru) -> Rf {
    return Rf(f16_at1(o.x), f16_at1(o.y), f16_at1(o.z), f16_at1(o.w));
}
fn row_value(v: Rf, k: u32) -> f32 {
    return v[k];
}
