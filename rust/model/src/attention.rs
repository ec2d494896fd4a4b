//! Causal attention of a pass's queries over one sequence's KV cache, with a
//! sliding window where the layer has one.
//!
//! With an f16 cache the arithmetic follows llama.cpp's (non-flash) CPU path,
//! whose outputs are the parity reference: the query is rounded to f16 before
//! it meets the keys, scores are softmaxed in f32, and the probabilities are
//! rounded to f16 before they weight the values. Each (position, head) keeps
//! its scores in a per-thread buffer that grows to the longest span seen.

use std::cell::RefCell;
use std::sync::OnceLock;

use ember_gguf::GgmlType;
use ember_kv::{KvCache, Rows};
use ember_quant::DotFn;
use half::f16;
use half::slice::HalfFloatSliceExt;
use rayon::prelude::*;

pub struct AttnShape {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim_k: usize,
    pub head_dim_v: usize,
    pub scale: f32,
    pub window: Option<usize>,
}

/// Per-thread buffers: the scores of one (position, head), the query in f32
/// and in f16, and one value row widened to f32.
#[derive(Default)]
struct Scratch {
    scores: Vec<f32>,
    q32: Vec<f32>,
    q16: Vec<f16>,
    v32: Vec<f32>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// The f16 x f16 dot kernel (SIMD where the CPU has it), fetched once.
fn f16_dot() -> DotFn {
    static DOT: OnceLock<DotFn> = OnceLock::new();
    *DOT.get_or_init(|| ember_quant::dot_fn(GgmlType::F16).expect("F16 has a dot kernel"))
}

fn f16_bytes(v: &[f16]) -> &[u8] {
    // SAFETY: f16 is two plain bytes with no padding.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
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
        SCRATCH.with_borrow_mut(|sc| {
            let Scratch { scores, q32, q16, v32 } = sc;
            scores.clear();
            let mut max = f32::NEG_INFINITY;
            match &keys {
                Rows::F16(k) => {
                    q16.resize(hk, f16::ZERO);
                    q16.convert_from_f32_slice(qh);
                    let (dot, qb) = (f16_dot(), f16_bytes(q16));
                    for p in first..=pos {
                        let row = cache.row_of(il, p);
                        let score = s.scale * dot(hk, f16_bytes(&k[row * kw + kvh * hk..][..hk]), qb);
                        max = max.max(score);
                        scores.push(score);
                    }
                }
                Rows::F32(k) => {
                    q32.clear();
                    q32.extend_from_slice(qh);
                    for p in first..=pos {
                        let row = cache.row_of(il, p);
                        let score = s.scale * dot_f32(q32, &k[row * kw + kvh * hk..][..hk]);
                        max = max.max(score);
                        scores.push(score);
                    }
                }
            }
            let mut sum = 0.0f64;
            for e in scores.iter_mut() {
                *e = (*e - max).exp();
                sum += *e as f64;
            }
            let inv = (1.0 / sum) as f32;
            o.fill(0.0);
            v32.resize(hv, 0.0);
            for (p, &e) in (first..=pos).zip(scores.iter()) {
                let row = cache.row_of(il, p);
                match &values {
                    Rows::F16(v) => {
                        v[row * vw + kvh * hv..][..hv].convert_to_f32_slice(v32);
                        axpy_f32(f16::from_f32(e * inv).to_f32(), v32, o);
                    }
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
fn axpy_f32(w: f32, v: &[f32], o: &mut [f32]) {
    for (o, x) in o.iter_mut().zip(v) {
        *o += w * x;
    }
}

