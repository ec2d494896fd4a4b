// A cache of f16 rows (`kv_store.wgsl`, `rope_store.wgsl` write it): a
// thread stores a unit of two elements, one word, element e of the row at
// ring row `slot` in half e % 2 of word (slot * width + e) / 2.

const KV_UNIT: u32 = 2u;

fn store_key_unit(ring: u32, width: u32, slot: u32, u: u32, x: array<f32, KV_UNIT>) {
    cache_k[slot * width / 2u + u] = pack2x16float(vec2<f32>(x[0], x[1]));
}

fn store_value_unit(ring: u32, width: u32, slot: u32, u: u32, x: array<f32, KV_UNIT>) {
    cache_v[slot * width / 2u + u] = pack2x16float(vec2<f32>(x[0], x[1]));
}
