//! SigLIP, the vision tower of Gemma 3 (llama.cpp's `clip_graph_siglip`):
//! the picture cut into square patches, each a row of the patch kernel's
//! product plus a learned position; pre-norm transformer blocks with layer
//! norms, every patch attending to every other, GELU feed-forward; a final
//! layer norm. Gemma 3's projector then averages each `n_merge` square of
//! patches into one row, RMS-normalises it and projects it to the text
//! model's width.

use crate::error::Result;
use crate::matmul::{matmul, matmul_many, Acts, Product};
use crate::ops;
use crate::pool::{Pool, SyncPtr};
use crate::vision::VisionParams;
use crate::weights::{Binder, Matrix};

struct Block {
    ln1: (Vec<f32>, Vec<f32>),
    q: (Matrix, Vec<f32>),
    k: (Matrix, Vec<f32>),
    v: (Matrix, Vec<f32>),
    out: (Matrix, Vec<f32>),
    ln2: (Vec<f32>, Vec<f32>),
    up: (Matrix, Vec<f32>),
    down: (Matrix, Vec<f32>),
}

pub(super) struct Siglip {
    patch: Matrix, // (n_embd, 3 * patch * patch), the kernel's (channel, y, x) order
    patch_bias: Vec<f32>,
    position: Vec<f32>, // [n_patches, n_embd]
    blocks: Vec<Block>,
    post_ln: (Vec<f32>, Vec<f32>),
    soft_emb_norm: Vec<f32>,
    projection: Matrix, // (proj_dim, n_embd)
}

impl Siglip {
    pub(super) fn bind(b: &mut Binder<'_>, p: &VisionParams) -> Result<Siglip> {
        let (e, ff) = (p.n_embd, p.n_ff);
        let linear = |b: &mut Binder<'_>, name: &str, rows: usize, cols: usize| -> Result<(Matrix, Vec<f32>)> {
            Ok((b.matrix(&format!("{name}.weight"), rows, cols)?, b.vector(&format!("{name}.bias"), rows)?))
        };
        let norm = |b: &mut Binder<'_>, name: &str| -> Result<(Vec<f32>, Vec<f32>)> {
            Ok((b.vector(&format!("{name}.weight"), e)?, b.vector(&format!("{name}.bias"), e)?))
        };
        let patch = b.matrix_flat("v.patch_embd.weight", e, 3 * p.patch_size * p.patch_size)?;
        let patch_bias = b.vector("v.patch_embd.bias", e)?;
        let position = b.vector("v.position_embd.weight", p.n_patches() * e)?;
        let mut blocks = Vec::with_capacity(p.n_layer);
        for il in 0..p.n_layer {
            let n = |s: &str| format!("v.blk.{il}.{s}");
            let ln1 = norm(b, &n("ln1"))?;
            let q = linear(b, &n("attn_q"), e, e)?;
            let k = linear(b, &n("attn_k"), e, e)?;
            let v = linear(b, &n("attn_v"), e, e)?;
            let out = linear(b, &n("attn_out"), e, e)?;
            let ln2 = norm(b, &n("ln2"))?;
            // Older converters wrote the feed-forward pair under each other's
            // names; llama.cpp tells them apart by shape, and so does this.
            let swapped = b.file.tensor(&n("ffn_down.weight")).is_some_and(|t| t.dims[0] as usize == e && e != ff);
            let (up_name, down_name) = if swapped { ("ffn_down", "ffn_up") } else { ("ffn_up", "ffn_down") };
            let up = linear(b, &n(up_name), ff, e)?;
            let down = linear(b, &n(down_name), e, ff)?;
            blocks.push(Block { ln1, q, k, v, out, ln2, up, down });
        }
        let post_ln = norm(b, "v.post_ln")?;
        let soft_emb_norm = b.vector("mm.soft_emb_norm.weight", e)?;
        let projection = b.matrix_transposed("mm.input_projection.weight", p.proj_dim, e)?;
        Ok(Siglip { patch, patch_bias, position, blocks, post_ln, soft_emb_norm, projection })
    }

    /// `rgb`: `image_size` square, interleaved, normalised. Returns the
    /// projected rows, `tokens_per_image` of `proj_dim`.
    pub(super) fn encode(&self, pool: &Pool, p: &VisionParams, rgb: &[f32]) -> Vec<f32> {
        let (e, ff, side, ps) = (p.n_embd, p.n_ff, p.patches_per_side(), p.patch_size);
        let t = p.n_patches();
        let mut acts = Acts::default();

        // Patches as rows in the kernel's (channel, y, x) order: the
        // convolution is then one product.
        let k = 3 * ps * ps;
        let mut cols = vec![0.0f32; t * k];
        pool.rows_mut(&mut cols, k, |j, row| {
            let (py, px) = (j / side, j % side);
            for c in 0..3 {
                for y in 0..ps {
                    let from = ((py * ps + y) * p.image_size + px * ps) * 3 + c;
                    for x in 0..ps {
                        row[(c * ps + y) * ps + x] = rgb[from + x * 3];
                    }
                }
            }
        });
        let mut x = vec![0.0f32; t * e];
        matmul(pool, &self.patch, acts.get(pool, self.patch.input, &cols, t, k), t, &mut x);
        drop(cols);
        pool.rows_mut(&mut x, e, |j, row| {
            for ((v, b), pos) in row.iter_mut().zip(&self.patch_bias).zip(&self.position[j * e..(j + 1) * e]) {
                *v += b + pos;
            }
        });

        let mut h = vec![0.0f32; t * e];
        let (mut q, mut kk, mut v) = (vec![0.0f32; t * e], vec![0.0f32; t * e], vec![0.0f32; t * e]);
        let mut att = vec![0.0f32; t * e];
        let mut o = vec![0.0f32; t * e];
        let mut up = vec![0.0f32; t * ff];
        for blk in &self.blocks {
            layer_norm_rows(pool, &x, &blk.ln1, p.eps, &mut h, e);
            acts.invalidate();
            let [aq, ak, av] = acts.get_many(pool, [blk.q.0.input, blk.k.0.input, blk.v.0.input], &h, t, e);
            matmul_many(
                pool,
                t,
                [
                    Product { w: &blk.q.0, acts: aq, out: &mut q },
                    Product { w: &blk.k.0, acts: ak, out: &mut kk },
                    Product { w: &blk.v.0, acts: av, out: &mut v },
                ],
            );
            for (m, bias) in [(&mut q, &blk.q.1), (&mut kk, &blk.k.1), (&mut v, &blk.v.1)] {
                add_bias(pool, m, bias);
            }
            attention_full(pool, &q, &kk, &v, &mut att, t, p.n_head, e / p.n_head);
            acts.invalidate();
            matmul(pool, &blk.out.0, acts.get(pool, blk.out.0.input, &att, t, e), t, &mut o);
            add_bias(pool, &mut o, &blk.out.1);
            x.iter_mut().zip(&o).for_each(|(x, o)| *x += o);

            layer_norm_rows(pool, &x, &blk.ln2, p.eps, &mut h, e);
            acts.invalidate();
            matmul(pool, &blk.up.0, acts.get(pool, blk.up.0.input, &h, t, e), t, &mut up);
            pool.rows_mut(&mut up, ff, |_, row| {
                for (u, b) in row.iter_mut().zip(&blk.up.1) {
                    *u = ops::gelu_table(*u + b);
                }
            });
            acts.invalidate();
            matmul(pool, &blk.down.0, acts.get(pool, blk.down.0.input, &up, t, ff), t, &mut o);
            add_bias(pool, &mut o, &blk.down.1);
            x.iter_mut().zip(&o).for_each(|(x, o)| *x += o);
        }
        layer_norm_rows(pool, &x, &self.post_ln, p.eps, &mut h, e);

        // Gemma 3's projector: each n_merge square of patches averaged into
        // one row, row-major over the pooled grid as the patches are.
        let (m, out_side) = (p.n_merge, side / p.n_merge);
        let n_out = out_side * out_side;
        let mut pooled = vec![0.0f32; n_out * e];
        pool.rows_mut(&mut pooled, e, |j, row| {
            let (oy, ox) = (j / out_side, j % out_side);
            for y in oy * m..(oy + 1) * m {
                for x in ox * m..(ox + 1) * m {
                    row.iter_mut().zip(&h[(y * side + x) * e..][..e]).for_each(|(r, v)| *r += v);
                }
            }
            let inv = 1.0 / (m * m) as f32;
            row.iter_mut().for_each(|r| *r *= inv);
            ops::rms_norm_inplace(row, &self.soft_emb_norm, p.eps);
        });
        let mut rows = vec![0.0f32; n_out * p.proj_dim];
        acts.invalidate();
        matmul(pool, &self.projection, acts.get(pool, self.projection.input, &pooled, n_out, e), n_out, &mut rows);
        rows
    }
}

fn add_bias(pool: &Pool, m: &mut [f32], bias: &[f32]) {
    pool.rows_mut(m, bias.len(), |_, row| row.iter_mut().zip(bias).for_each(|(v, b)| *v += b));
}

/// `out = (x - mean) / sqrt(var + eps) * w + b` per row (ggml's `norm`, its
/// sums in double as ggml's are).
fn layer_norm_rows(pool: &Pool, x: &[f32], (w, b): &(Vec<f32>, Vec<f32>), eps: f32, out: &mut [f32], e: usize) {
    pool.rows_mut(&mut out[..x.len()], e, |j, row| layer_norm(&x[j * e..(j + 1) * e], w, b, eps, row));
}

fn layer_norm(x: &[f32], w: &[f32], b: &[f32], eps: f32, out: &mut [f32]) {
    let n = x.len() as f64;
    let mean = (x.iter().map(|&v| v as f64).sum::<f64>() / n) as f32;
    let mut var = 0.0f64;
    for (o, &v) in out.iter_mut().zip(x) {
        *o = v - mean;
        var += (*o as f64) * (*o as f64);
    }
    let scale = 1.0 / ((var / n) as f32 + eps).sqrt();
    for ((o, w), b) in out.iter_mut().zip(w).zip(b) {
        *o = *o * scale * w + b;
    }
}

/// Query rows a task of the encoder's attention takes: their scores against
/// every key fit in a core's L2 for the longest towers (4,096 patches).
const QUERY_TILE: usize = 16;

/// Every row attending to every row (no mask), head by head: `q`, `k`, `v`
/// and `out` are `t` rows of `n_head` heads of `d` each. Each task takes a
/// tile of queries of one head, scores them against every key, and folds
/// the values in by the softmax of those scores.
fn attention_full(pool: &Pool, q: &[f32], k: &[f32], v: &[f32], out: &mut [f32], t: usize, n_head: usize, d: usize) {
    let e = n_head * d;
    let scale = 1.0 / (d as f32).sqrt();
    // Each head's keys and values gathered into rows of their own, so the
    // score and fold loops read runs of memory.
    let mut kh = vec![0.0f32; t * e];
    let mut vh = vec![0.0f32; t * e];
    pool.rows_mut(&mut kh, t * d, |h, dst| {
        for j in 0..t {
            dst[j * d..(j + 1) * d].copy_from_slice(&k[j * e + h * d..][..d]);
        }
    });
    pool.rows_mut(&mut vh, t * d, |h, dst| {
        for j in 0..t {
            dst[j * d..(j + 1) * d].copy_from_slice(&v[j * e + h * d..][..d]);
        }
    });
    let tiles = t.div_ceil(QUERY_TILE);
    let out_ptr = SyncPtr(out.as_mut_ptr());
    pool.for_each(n_head * tiles, |item| {
        let (h, tile) = (item / tiles, item % tiles);
        let (keys, values) = (&kh[h * t * d..][..t * d], &vh[h * t * d..][..t * d]);
        let mut scores = vec![0.0f32; t];
        let mut acc = vec![0.0f32; d];
        for i in tile * QUERY_TILE..((tile + 1) * QUERY_TILE).min(t) {
            let qi = &q[i * e + h * d..][..d];
            let mut max = f32::NEG_INFINITY;
            for (s, key) in scores.iter_mut().zip(keys.chunks_exact(d)) {
                *s = scale * dot(qi, key);
                max = max.max(*s);
            }
            let sum = ops::exp_shifted_sum(&mut scores, max, &[]).sum;
            acc.iter_mut().for_each(|a| *a = 0.0);
            for (&s, val) in scores.iter().zip(values.chunks_exact(d)) {
                acc.iter_mut().zip(val).for_each(|(a, v)| *a += s * v);
            }
            let inv = 1.0 / sum;
            // SAFETY: each (query, head) is written by the one task that owns its tile.
            let dst = unsafe { std::slice::from_raw_parts_mut(out_ptr.get().add(i * e + h * d), d) };
            dst.iter_mut().zip(&acc).for_each(|(o, a)| *o = a * inv);
        }
    });
}

/// A dot product in eight lanes, which the compiler keeps in vector registers.
#[inline]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in ca.zip(cb) {
        for l in 0..8 {
            lanes[l] += x[l] * y[l];
        }
    }
    lanes.iter().sum::<f32>() + tail
}
