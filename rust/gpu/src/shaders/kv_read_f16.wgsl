// Attention's reads of a cache of f16 rows (see `kv_write_f16.wgsl`):
// element i of the ring, counted over its rows.

// Σ_d q[q_at[n] + d] · key element i0 + d over d < dk, in pairs, for each
// of the PAIRS queries whose rows lie at q_at: the key's words read once
// for them all, each pair's sum taken as one pair's alone would be.
fn key_dots(q_at: array<u32, PAIRS>, i0: u32, dk: u32) -> array<f32, PAIRS> {
    // Rows are f16 pairs from an even start: a word is two of them.
    let k0 = i0 >> 1u;
    var dots: array<f32, PAIRS>;
    for (var d = 0u; d < dk; d += 2u) {
        let pair = unpack2x16float(cache_k[k0 + (d >> 1u)]);
        for (var n = 0u; n < PAIRS; n++) {
            let qn = q_at[n] + d;
            dots[n] += q[qn] * pair.x + q[qn + 1u] * pair.y;
        }
    }
    return dots;
}

fn value_at(i: u32) -> f32 {
    let pair = unpack2x16float(cache_v[i >> 1u]);
    return select(pair.x, pair.y, (i & 1u) == 1u);
}
