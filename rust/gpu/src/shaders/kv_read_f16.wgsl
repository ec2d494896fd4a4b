// Attention's reads of a cache of f16 rows (see `kv_write_f16.wgsl`):
// element i of the ring, counted over its rows.

// Σ_d q[q0 + d] · key element i0 + d over d < dk, in pairs.
fn key_dot(q0: u32, i0: u32, dk: u32) -> f32 {
    // Rows are f16 pairs from an even start: a word is two of them.
    let k0 = i0 >> 1u;
    var dot = 0.0;
    for (var d = 0u; d < dk; d += 2u) {
        let pair = unpack2x16float(cache_k[k0 + (d >> 1u)]);
        dot += q[q0 + d] * pair.x + q[q0 + d + 1u] * pair.y;
    }
    return dot;
}

fn value_at(i: u32) -> f32 {
    let pair = unpack2x16float(cache_v[i >> 1u]);
    return select(pair.x, pair.y, (i & 1u) == 1u);
}
