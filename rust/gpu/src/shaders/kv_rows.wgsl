// What the kernels that store a pass's keys and values share
// (`kv_store.wgsl`, `rope_store.wgsl`): unit `i` of the keys (`is_key`) or
// the values of rows `first_row..first_row + rows` of the pass, each row
// `width` wide, stored for positions `start..` at position % ring, in the
// cache's format (`kv_write_*.wgsl` gives KV_UNIT and `store_unit`). The
// kernel gives `key_at(row, e)` (element e of pass row `row`'s keys as they
// are to be stored), the values `v`, the cache's `cache_k` and `cache_v`,
// and `p` with first_row, start and ring.

fn put_word(is_key: bool, at: u32, word: u32) {
    if (is_key) {
        cache_k[at] = word;
    } else {
        cache_v[at] = word;
    }
}

fn store_row_unit(is_key: bool, i: u32, width: u32) {
    let units = width / KV_UNIT;
    let local = i / units;
    let u = i % units;
    let row = p.first_row + local;
    var x: array<f32, KV_UNIT>;
    for (var e = 0u; e < KV_UNIT; e++) {
        let g = u * KV_UNIT + e;
        if (is_key) {
            x[e] = key_at(row, g);
        } else {
            x[e] = v[row * width + g];
        }
    }
    store_unit(is_key, p.ring, width, (p.start + local) % p.ring, u, x);
}
