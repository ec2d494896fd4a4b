// The rotation of one pair (a, b) by an angle's cosine and sine, shared by
// `rope.wgsl` and `rope_store.wgsl` so that both round alike.
fn rotate(a: f32, b: f32, c: f32, s: f32) -> vec2<f32> {
    return vec2<f32>(a * c - b * s, a * s + b * c);
}
