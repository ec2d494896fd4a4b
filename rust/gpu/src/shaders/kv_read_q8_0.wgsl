// Attention's reads of a cache of Q8_0 rows (see `kv_write_q8_0.wgsl`):
// element i of the ring, counted over its rows. The queries stay f32: each
// block's quants meet them, and the sum takes the block's scale.

// Byte i % 4 of `word` (a word of quants) as a signed value.
fn quant_at(word: u32, i: u32) -> f32 {
    return f32(bitcast<i32>(word << (24u - 8u * (i & 3u))) >> 24u);
}

// Σ_d q[q_at[n] + d] · key element i0 + d over d < dk (whole blocks), for
// each of the PAIRS queries whose rows lie at q_at: the key's words read
// once for them all, each pair's sum taken as one pair's alone would be.
fn key_dots(q_at: array<u32, PAIRS>, i0: u32, dk: u32) -> array<f32, PAIRS> {
    let scales = p.ring * p.n_head_kv * p.dk / 4u;
    var dots: array<f32, PAIRS>;
    for (var b = 0u; b < dk; b += 32u) {
        var s: array<f32, PAIRS>;
        for (var j = 0u; j < 32u; j += 4u) {
            let word = cache_k[(i0 + b + j) >> 2u];
            for (var k = 0u; k < 4u; k++) {
                let quant = quant_at(word, k);
                for (var n = 0u; n < PAIRS; n++) {
                    s[n] += q[q_at[n] + b + j + k] * quant;
                }
            }
        }
        let scale = bitcast<f32>(cache_k[scales + (i0 + b) / 32u]);
        for (var n = 0u; n < PAIRS; n++) {
            dots[n] += s[n] * scale;
        }
    }
    return dots;
}

fn value_at(i: u32) -> f32 {
    let scales = p.ring * p.n_head_kv * p.dv / 4u;
    return quant_at(cache_v[i >> 2u], i) * bitcast<f32>(cache_v[scales + i / 32u]);
}
