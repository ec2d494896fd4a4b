//! Causal attention of a pass's queries over one sequence's KV cache, with a
//! sliding window where the layer has one.
//!
//! With an f16 cache the arithmetic follows llama.cpp's (non-flash) CPU path,
//! whose outputs are the parity reference: the query is rounded to f16 before
//! it meets the keys, scores are softmaxed in f32, and the probabilities are
//! rounded to f16 before they weight the values. Each (position, head) keeps
//! its scores in a per-thread buffer that grows to the longest span seen.

use std::cell::RefCell;

use ember_kv::{KvCache, Rows};
use half::f16;
use rayon::prelude::*;

pub struct AttnShape {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim_k: usize,
    pub head_dim_v: usize,
    pub scale: f32,
    pub window: Option<usize>,
}

thread_local! {
    /// Scores of one (position, head), and the query rounded to f16.
    static SCRATCH: RefCell<(Vec<f32>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// `q`: t rows of n_head * head_dim_k; `out`: t rows of n_head * head_dim_v.
/// Query row j sits at position `start + j`; the cache already holds its key.
pub fn attention(cache: &KvCache, il: usize, s: &AttnShape, q: &[f32], start: usize, t: usize, out: &mut [f32]) {
    let (hk, hv) = (s.head_dim_k, s.head_dim_v);
    let group = s.n_head / s.n_head_kv;
    let kw = cache.shape(il).k_width;
    let vw = cache.shape(il).v_width;
    let keys = cache.keys(il);
    let values = cache.values(il);
    out[..t * s.n_head * hv].par_chunks_mut(hv).enumerate().for_each(|(i, o)| {
        let (j, h) = (i / s.n_head, i % s.n_head);
        let pos = start + j;
        let kvh = h / group;
        let qh = &q[j * s.n_head * hk + h * hk..][..hk];
        let first = match s.window {
            Some(w) => (pos + 1).saturating_sub(w),
            None => 0,
        };
        SCRATCH.with_borrow_mut(|(scores, qr)| {
            scores.clear();
            qr.clear();
            let half_precision = matches!(keys, Rows::F16(_));
            qr.extend(qh.iter().map(|&x| if half_precision { f16::from_f32(x).to_f32() } else { x }));
            let mut max = f32::NEG_INFINITY;
            for p in first..=pos {
                let row = cache.row_of(il, p);
                let score = s.scale
                    * match &keys {
                        Rows::F16(k) => dot_f16(qr, &k[row * kw + kvh * hk..][..hk]),
                        Rows::F32(k) => dot_f32(qr, &k[row * kw + kvh * hk..][..hk]),
                    };
                max = max.max(score);
                scores.push(score);
            }
            let mut sum = 0.0f64;
            for sc in scores.iter_mut() {
                *sc = (*sc - max).exp();
                sum += *sc as f64;
            }
            let inv = (1.0 / sum) as f32;
            o.fill(0.0);
            for (p, &e) in (first..=pos).zip(scores.iter()) {
                let row = cache.row_of(il, p);
                match &values {
                    Rows::F16(v) => axpy_f16(f16::from_f32(e * inv).to_f32(), &v[row * vw + kvh * hv..][..hv], o),
                    Rows::F32(v) => axpy_f32(e * inv, &v[row * vw + kvh * hv..][..hv], o),
                }
            }
        });
    });
}

#[inline]
fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

#[inline]
fn dot_f16(a: &[f32], b: &[f16]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y.to_f32()).sum()
}

#[inline]
fn axpy_f32(w: f32, v: &[f32], o: &mut [f32]) {
    for (o, x) in o.iter_mut().zip(v) {
        *o += w * x;
    }
}

#[inline]
fn axpy_f16(w: f32, v: &[f16], o: &mut [f32]) {
    for (o, x) in o.iter_mut().zip(v) {
        *o += w * x.to_f32();
    }
}
