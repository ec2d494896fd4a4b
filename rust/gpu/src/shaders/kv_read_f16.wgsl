// Attention's reads of a cache of f16 rows (see `kv_write_f16.wgsl`):
// element i of the ring, counted over its rows.

// Σ_d q[q0 + h dk + d] · key element i0 + d over d < dk, in pairs, for
// each of the GROUP heads whose queries lie from q0: the key's words read
// once for them all, each head's sum taken as one head's alone would be.
fn key_dots(q0: u32, i0: u32, dk: u32) -> array<f32, GROUP> {
    // Rows are f16 pairs from an even start: a word is two of them.
    let k0 = i0 >> 1u;
    var dots: array<f32, GROUP>;
    for (var d = 0u; d < dk; d += 2u) {
        let pair = unpack2x16float(cache_k[k0 + (d >> 1u)]);
        for (var h = 0u; h < GROUP; h++) {
            let qh = q0 + h * dk + d;
            dots[h] += q[qh] * pair.x + q[qh + 1u] * pair.y;
        }
    }
    return dots;
}

fn value_at(i: u32) -> f32 {
    let pair = unpack2x16float(cache_v[i >> 1u]);
    return select(pair.x, pair.y, (i & 1u) == 1u);
}
