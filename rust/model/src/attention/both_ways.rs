//! Attention of a picture's rows in families whose encoder rows see each
//! other both ways (Gemma 3; llama.cpp's non-causal image batches): a row
//! attends to every key before its run, as a causal row does, and to every
//! key of its run, later ones included. A sliding window still bounds it
//! from below (llama.cpp's mask keeps a key at `p0` for a query at `p1`
//! unless `p1 - p0 >= window`, so later keys are always seen).
//!
//! Few rows take this path (a picture's, once, as its prompt is read), so it
//! is written plainly: each (row, head) widens the keys and values it sees
//! to f32, the query rounded to the cache's precision first as the causal
//! loops round it.

use ember_kv::{to_bf16, KvCache, Rows};
use half::f16;

use super::AttnShape;
use crate::pool::{Pool, SyncPtr};

/// One row of a bidirectional run: where its query and output are in the
/// pass's buffers (offsets in elements), its position, and the end of the
/// keys it sees (the end of its run).
pub struct BothWays<'a> {
    pub cache: &'a KvCache,
    pub q: usize,
    pub out: usize,
    pub pos: usize,
    pub keys_end: usize,
}

/// Writes each row's attention over the keys it sees into `out`.
pub fn attend_rows(pool: &Pool, il: usize, s: &AttnShape, q: &[f32], out: &mut [f32], rows: &[BothWays<'_>]) {
    let (hk, hv) = (s.head_dim_k, s.head_dim_v);
    let group = s.n_head / s.n_head_kv;
    let out_ptr = SyncPtr(out.as_mut_ptr());
    pool.for_each(rows.len() * s.n_head, |item| {
        let (r, h) = (&rows[item / s.n_head], item % s.n_head);
        let cache = r.cache;
        let (kw, vw) = (cache.shape(il).k_width, cache.shape(il).v_width);
        let (keys, values) = (cache.keys(il), cache.values(il));
        let kvh = h / group;
        let first = s.window.map_or(0, |w| (r.pos + 1).saturating_sub(w));
        let query: Vec<f32> = q[r.q + h * hk..][..hk]
            .iter()
            .map(|&x| match keys {
                Rows::F16(_) => f16::from_f32(x).to_f32(),
                Rows::BF16(_) => to_bf16(x).to_f32(),
                _ => x,
            })
            .collect();
        let mut key = vec![0.0f32; hk];
        let mut scores = Vec::with_capacity(r.keys_end - first);
        let mut max = f32::NEG_INFINITY;
        for p in first..r.keys_end {
            keys.widen(cache.row_of(il, p) * kw + kvh * hk, &mut key);
            let score = s.scale * query.iter().zip(&key).map(|(a, b)| a * b).sum::<f32>();
            max = max.max(score);
            scores.push(score);
        }
        let mut sum = 0.0f32;
        scores.iter_mut().for_each(|x| {
            *x = (*x - max).exp();
            sum += *x;
        });
        let mut acc = vec![0.0f32; hv];
        let mut value = vec![0.0f32; hv];
        for (p, &w) in (first..r.keys_end).zip(&scores) {
            values.widen(cache.row_of(il, p) * vw + kvh * hv, &mut value);
            acc.iter_mut().zip(&value).for_each(|(a, v)| *a = w.mul_add(*v, *a));
        }
        // SAFETY: each (row, head) is one item, and rows' outputs are disjoint.
        let dst = unsafe { std::slice::from_raw_parts_mut(out_ptr.get().add(r.out + h * hv), hv) };
        dst.iter_mut().zip(&acc).for_each(|(d, a)| *d = a / sum);
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use ember_kv::{KvType, LayerShape};

    /// A run's rows against the definition written out in f64: each sees the
    /// keys before the run (within the window) and all of the run's own.
    #[test]
    fn a_runs_rows_see_every_key_of_the_run() {
        let (n_head, n_head_kv, hd) = (4, 2, 32);
        let (kw, n) = (n_head_kv * hd, 12);
        for window in [None, Some(5)] {
            let shape = [LayerShape { k_width: kw, v_width: kw, window }];
            let mut cache = KvCache::new(KvType::F32, 64, 16, &shape);
            let val = |p: usize, i: usize, salt: usize| (((p * 31 + i * 7 + salt) % 17) as f32 - 8.0) / 9.0;
            for p in 0..n {
                let k: Vec<f32> = (0..kw).map(|i| val(p, i, 1)).collect();
                let v: Vec<f32> = (0..kw).map(|i| val(p, i, 2)).collect();
                cache.write(0, p, &k, &v);
            }
            cache.commit(n);
            let q: Vec<f32> = (0..n * n_head * hd).map(|i| ((i * 13 % 23) as f32 - 11.0) / 10.0).collect();
            let s = AttnShape { n_head, n_head_kv, head_dim_k: hd, head_dim_v: hd, scale: 0.2, window };
            // Tokens 4..9 are the run.
            let rows: Vec<BothWays> = (4..9)
                .map(|j| BothWays { cache: &cache, q: j * n_head * hd, out: (j - 4) * n_head * hd, pos: j, keys_end: 9 })
                .collect();
            let mut out = vec![0.0f32; 5 * n_head * hd];
            attend_rows(&Pool::new(2).unwrap(), 0, &s, &q, &mut out, &rows);
            for (r, row) in rows.iter().enumerate() {
                for h in 0..n_head {
                    let first = window.map_or(0, |w| (row.pos + 1).saturating_sub(w));
                    let qh = &q[row.q + h * hd..][..hd];
                    let kvh = h / (n_head / n_head_kv);
                    let scores: Vec<f64> = (first..9)
                        .map(|p| 0.2 * (0..hd).map(|i| qh[i] as f64 * val(p, kvh * hd + i, 1) as f64).sum::<f64>())
                        .collect();
                    let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let sum: f64 = scores.iter().map(|x| (x - max).exp()).sum();
                    for i in 0..hd {
                        let want: f64 = (first..9)
                            .zip(&scores)
                            .map(|(p, x)| (x - max).exp() / sum * val(p, kvh * hd + i, 2) as f64)
                            .sum();
                        let got = out[r * n_head * hd + h * hd + i] as f64;
                        assert!((got - want).abs() < 1e-5, "window {window:?} row {r} head {h} dim {i}: {got} vs {want}");
                    }
                }
            }
        }
    }
}
