// A cache of f16 rows (`kv_rows.wgsl` writes it): a thread stores a unit
// of two elements, one word, element e of the row at ring row `slot` in
// half e % 2 of word (slot * width + e) / 2.

const KV_UNIT: u32 = 2u;

fn store_unit(is_key: bool, ring: u32, width: u32, slot: u32, u: u32, x: array<f32, KV_UNIT>) {
    put_word(is_key, slot * width / 2u + u, pack2x16float(vec2<f32>(x[0], x[1])));
}
