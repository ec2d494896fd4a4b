//! The forward pass: a batch of tokens of one sequence in, their logits out.
//!
//! One code path for every family (the differences are read from
//! `FamilyOptions`) and for every batch size: a prompt and a single decoded
//! token go through the same loop, so prefill and decode cannot drift apart.
//! Scratch buffers grow to the largest batch seen and are then reused: the
//! token loop allocates nothing.

use ember_kv::{KvCache, KvType, LayerShape};

use crate::attention::{attention_many, AttnPart, AttnShape};
use crate::config::{Config, FfnActivation};
use crate::error::{ModelError, Result};
use crate::matmul::{matmul, matmul_gated, matmul_many, Acts, Product};
use crate::ops;
use crate::pool::{Pool, SyncPtr};
use crate::Model;

/// Which positions of a pass need logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    None,
    Last,
    All,
    /// Every position's final hidden state (after the output norm, before
    /// the head), `n_embd` wide, in place of logits: what embeddings are
    /// pooled from. A pass of its own sequence only.
    Hidden,
}

/// Per-pass working memory, sized for the largest batch seen.
#[derive(Default)]
struct Scratch {
    cap: usize,
    x: Vec<f32>,    // [t, n_embd] residual stream
    h: Vec<f32>,    // [t, n_embd] normed input of a block
    q: Vec<f32>,    // [t, n_head * head_dim_k]
    k: Vec<f32>,    // [t, n_head_kv * head_dim_k]
    v: Vec<f32>,    // [t, n_head_kv * head_dim_v]
    att: Vec<f32>,  // [t, n_head * head_dim_v]
    o: Vec<f32>,    // [t, n_embd] block output
    gate: Vec<f32>, // [t, n_ff]
    cos: Vec<f32>,  // [t, n_rot / 2], one table per rope variant: global then windowed
    sin: Vec<f32>,
    acts: Acts,
    /// Position and token of each row of the pass.
    pos: Vec<usize>,
    ids: Vec<u32>,
    /// Rows of the pass whose logits are wanted, in order.
    out_rows: Vec<usize>,
    logits: Vec<f32>, // [rows wanted, n_vocab]
}

impl Scratch {
    fn ensure(&mut self, c: &Config, t: usize) {
        if t <= self.cap {
            return;
        }
        let half = c.n_rot / 2;
        let sizes: [(&mut Vec<f32>, usize); 10] = [
            (&mut self.x, c.n_embd),
            (&mut self.h, c.n_embd),
            (&mut self.q, c.n_head * c.head_dim_k),
            (&mut self.k, c.n_head_kv * c.head_dim_k),
            (&mut self.v, c.n_head_kv * c.head_dim_v),
            (&mut self.att, c.n_head * c.head_dim_v),
            (&mut self.o, c.n_embd),
            (&mut self.gate, c.n_ff),
            (&mut self.cos, 2 * half),
            (&mut self.sin, 2 * half),
        ];
        for (buf, width) in sizes {
            buf.resize(t * width, 0.0);
        }
        self.cap = t;
    }
}

/// One sequence's state: its KV cache, the logits of its last pass, and the
/// scratch of the passes it runs alone.
pub struct Session {
    pub cache: KvCache,
    scratch: Scratch,
    logits: Vec<f32>,
}

/// Working memory for passes over several sessions at once, sized for the
/// largest pass seen (the engine keeps one).
#[derive(Default)]
pub struct Workspace {
    scratch: Scratch,
}

/// One session's part of a pass over several: `tokens` appended after what it
/// holds, and which of their logits to keep in the session.
pub struct SeqPass<'a> {
    pub session: &'a mut Session,
    pub tokens: &'a [u32],
    pub want: Logits,
}

/// What the pass needs of one sequence.
struct Seq<'a> {
    cache: &'a mut KvCache,
    logits: &'a mut Vec<f32>,
    tokens: &'a [u32],
    want: Logits,
}

impl Session {
    /// Positions held in the cache.
    pub fn len(&self) -> usize {
        self.cache.len()
    }
    pub fn is_empty(&self) -> bool {
        self.cache.is_empty()
    }
    /// Logits of the last pass: rows of n_vocab.
    pub fn logits(&self) -> &[f32] {
        &self.logits
    }

    /// The same, for a draw that masks tokens in place.
    pub(crate) fn logits_mut(&mut self) -> &mut [f32] {
        &mut self.logits
    }
}

impl Model {
    /// Whether this model's caches can be of type `kv`: a Q8_0 cache stores
    /// each head as whole blocks of 32 elements.
    pub fn check_kv_type(&self, kv: KvType) -> Result<()> {
        let c = &self.config;
        if kv.holds_heads_of(c.head_dim_k) && kv.holds_heads_of(c.head_dim_v) {
            return Ok(());
        }
        Err(ModelError::Invalid(format!(
            "a {} KV cache stores heads of whole blocks of 32 elements; this model's heads have {} (keys) and {} (values)",
            kv.name(),
            c.head_dim_k,
            c.head_dim_v
        )))
    }

    /// A sequence of up to `n_ctx` positions, fed at most `max_batch` tokens per pass.
    /// # Panics
    /// When the cache type cannot hold this model's heads (see
    /// [`Model::check_kv_type`], which callers check first).
    pub fn new_session(&self, n_ctx: usize, max_batch: usize, kv_type: KvType) -> Session {
        if let Err(e) = self.check_kv_type(kv_type) {
            panic!("{e}");
        }
        let c = &self.config;
        let shapes: Vec<LayerShape> = (0..c.n_layer)
            .map(|il| LayerShape {
                k_width: c.n_head_kv * c.head_dim_k,
                v_width: c.n_head_kv * c.head_dim_v,
                window: if c.is_swa_layer(il) { c.sliding_window } else { None },
            })
            .collect();
        Session { cache: KvCache::new(kv_type, n_ctx, max_batch.max(1), &shapes), scratch: Scratch::default(), logits: Vec::new() }
    }

    /// Runs one pass of `tokens` (at most the session's `max_batch`), appended
    /// after what the session holds, and returns the logits asked for.
    pub fn forward<'s>(&self, s: &'s mut Session, tokens: &[u32], want: Logits) -> Result<&'s [f32]> {
        self.check_pass(&s.cache, tokens)?;
        let Session { cache, scratch, logits } = s;
        self.pass(scratch, &mut [Seq { cache, logits, tokens, want }]);
        Ok(&s.logits)
    }

    /// One pass over several sessions: their tokens go through every matrix
    /// together (one read of the weights for all), attention runs per
    /// session over its own cache, and each session keeps the logits it
    /// asked for (`Session::logits`). A session's results are the same, bit
    /// for bit, as in a pass of its own. Nothing is run unless every part is
    /// valid.
    pub fn forward_batch(&self, ws: &mut Workspace, seqs: &mut [SeqPass<'_>]) -> Result<()> {
        for sp in seqs.iter() {
            self.check_pass(&sp.session.cache, sp.tokens)?;
        }
        if seqs.len() > 1 && seqs.iter().any(|sp| sp.want == Logits::Hidden) {
            return Err(ModelError::Invalid("hidden states are read in a pass of their own sequence".into()));
        }
        let mut parts: Vec<Seq<'_>> = seqs
            .iter_mut()
            .map(|sp| {
                let Session { cache, logits, .. } = &mut *sp.session;
                Seq { cache, logits, tokens: sp.tokens, want: sp.want }
            })
            .collect();
        if !parts.is_empty() {
            self.pass(&mut ws.scratch, &mut parts);
        }
        Ok(())
    }

    fn check_pass(&self, cache: &KvCache, tokens: &[u32]) -> Result<()> {
        let c = &self.config;
        if tokens.is_empty() {
            return Err(ModelError::Invalid("a pass needs at least one token".into()));
        }
        if let Some(&id) = tokens.iter().find(|&&id| id as usize >= c.n_vocab) {
            return Err(ModelError::BadToken { id, n_vocab: c.n_vocab });
        }
        cache.reserve(tokens.len())?;
        Ok(())
    }

    /// Feeds any number of tokens in passes of at most `max_batch`; returns the
    /// logits of every position (`Logits::All`) or of the last one.
    pub fn prefill(&self, s: &mut Session, tokens: &[u32], want: Logits) -> Result<Vec<f32>> {
        let step = s.cache.max_batch();
        s.cache.reserve(0)?;
        if s.cache.len() + tokens.len() > s.cache.n_ctx() {
            return Err(ember_kv::KvError::ContextFull { needed: s.cache.len() + tokens.len(), capacity: s.cache.n_ctx() }.into());
        }
        let mut all = Vec::new();
        let n_chunks = tokens.len().div_ceil(step);
        for (i, chunk) in tokens.chunks(step).enumerate() {
            let last = i + 1 == n_chunks;
            let w = match want {
                Logits::All | Logits::Hidden => want,
                Logits::Last if last => Logits::Last,
                _ => Logits::None,
            };
            let out = self.forward(s, chunk, w)?;
            if matches!(w, Logits::All | Logits::Hidden) {
                all.extend_from_slice(out);
            } else if w == Logits::Last {
                all = out.to_vec();
            }
        }
        Ok(all)
    }

    fn pass(&self, sc: &mut Scratch, seqs: &mut [Seq<'_>]) {
        let c = &self.config;
        let w = &self.weights;
        let pool = &self.pool;
        let t: usize = seqs.iter().map(|q| q.tokens.len()).sum();
        let (e, hk, hv) = (c.n_embd, c.head_dim_k, c.head_dim_v);
        let (qw, kw, vw) = (c.n_head * hk, c.n_head_kv * hk, c.n_head_kv * hv);
        let half = c.n_rot / 2;
        sc.ensure(c, t);
        sc.pos.clear();
        for q in seqs.iter() {
            let start = q.cache.len();
            sc.pos.extend((0..q.tokens.len()).map(|j| start + j));
        }

        // Token embeddings.
        let scale = if c.opts.embed_scale { (e as f32).sqrt() } else { 1.0 };
        sc.ids.clear();
        sc.ids.extend(seqs.iter().flat_map(|q| q.tokens.iter().copied()));
        let ids = &sc.ids;
        pool.rows_mut(&mut sc.x[..t * e], e, |j, row| {
            ember_quant::dequantize_row(w.token_embd.ty, w.token_embd.row(ids[j] as usize), row).expect("embedding row bound at load");
            if scale != 1.0 {
                row.iter_mut().for_each(|v| *v *= scale);
            }
        });

        // Rows whose logits are wanted, in order: in the last layer only they
        // go on past attention (as llama.cpp's output ids do).
        sc.out_rows.clear();
        let mut r0 = 0;
        for q in seqs.iter() {
            let n = q.tokens.len();
            match q.want {
                Logits::None => {}
                Logits::Last => sc.out_rows.push(r0 + n - 1),
                Logits::All | Logits::Hidden => sc.out_rows.extend(r0..r0 + n),
            }
            r0 += n;
        }
        let n_out = sc.out_rows.len();

        // Rope angles for this pass, per rope variant.
        for (variant, (inv, fscale)) in self.rope_tables.iter().enumerate() {
            for (j, &p) in sc.pos.iter().enumerate() {
                let at = (variant * t + j) * half;
                ops::rope_angles(p, *fscale, inv, &mut sc.cos[at..at + half], &mut sc.sin[at..at + half]);
            }
        }

        let mut t = t;
        for (il, l) in w.layers.iter().enumerate() {
            let variant = self.rope_variant[il];
            let last = il + 1 == w.layers.len();
            // Attention block.
            norm_rows(pool, &sc.x, &l.attn_norm, c.rms_eps, &mut sc.h, e, t);
            sc.acts.invalidate();
            // One dispatch for the three: a decoded token pays for each fork/join.
            let [aq, ak, av] = sc.acts.get_many(pool, [l.wq.input, l.wk.input, l.wv.input], &sc.h, t, e);
            matmul_many(
                pool,
                t,
                [
                    Product { w: &l.wq, acts: aq, out: &mut sc.q },
                    Product { w: &l.wk, acts: ak, out: &mut sc.k },
                    Product { w: &l.wv, acts: av, out: &mut sc.v },
                ],
            );
            for (buf, bias, width) in [(&mut sc.q, &l.bq, qw), (&mut sc.k, &l.bk, kw), (&mut sc.v, &l.bv, vw)] {
                if let Some(b) = bias {
                    buf[..t * width].chunks_mut(width).for_each(|r| r.iter_mut().zip(b).for_each(|(x, y)| *x += y));
                }
            }
            let (cos, sin) = (&sc.cos[variant * t * half..], &sc.sin[variant * t * half..]);
            for (buf, norm, width) in [(&mut sc.q, &l.q_norm, qw), (&mut sc.k, &l.k_norm, kw)] {
                pool.rows_mut(&mut buf[..t * width], width, |j, row| {
                    for head in row.chunks_mut(hk) {
                        if let Some(n) = norm {
                            ops::rms_norm_inplace(head, n, c.rms_eps);
                        }
                        ops::rope_apply(head, c.opts.rope, &cos[j * half..(j + 1) * half], &sin[j * half..(j + 1) * half]);
                    }
                });
            }
            let shape = AttnShape {
                n_head: c.n_head,
                n_head_kv: c.n_head_kv,
                head_dim_k: hk,
                head_dim_v: hv,
                scale: c.attn_scale,
                window: if c.is_swa_layer(il) { c.sliding_window } else { None },
            };
            let mut r0 = 0;
            for q in seqs.iter_mut() {
                let (n, start) = (q.tokens.len(), q.cache.len());
                for j in 0..n {
                    let r = r0 + j;
                    q.cache.write(il, start + j, &sc.k[r * kw..(r + 1) * kw], &sc.v[r * vw..(r + 1) * vw]);
                }
                r0 += n;
            }
            // Every row's key and value are in the cache now. In the last
            // layer a row whose logits nobody wants changes nothing more, so
            // only the wanted rows' queries attend, and the rows after
            // attention are those alone, in order (`out_rows`).
            if last && n_out < t {
                if n_out == 0 {
                    break;
                }
                for (at, &r) in sc.out_rows.iter().enumerate() {
                    sc.x.copy_within(r * e..(r + 1) * e, at * e);
                }
            }
            let aw = c.n_head * hv;
            let mut parts = Vec::with_capacity(seqs.len());
            let (mut q_rest, mut out_rest) = (&sc.q[..t * qw], &mut sc.att[..t * aw]);
            for q in seqs.iter() {
                let n = q.tokens.len();
                let (qs, qr) = q_rest.split_at(n * qw);
                q_rest = qr;
                // The queries that attend: all of them, or the wanted ones of the last layer.
                let (first, m) = match q.want {
                    _ if !last => (0, n),
                    Logits::None => continue,
                    Logits::Last => (n - 1, 1),
                    Logits::All | Logits::Hidden => (0, n),
                };
                let (os, or) = std::mem::take(&mut out_rest).split_at_mut(m * aw);
                out_rest = or;
                parts.push(AttnPart { cache: &*q.cache, q: &qs[first * qw..], start: q.cache.len() + first, t: m, out: os });
            }
            attention_many(pool, il, &shape, &mut parts);
            drop(parts);
            if last {
                t = n_out;
            }
            sc.acts.invalidate();
            matmul(pool, &l.wo, sc.acts.get(pool, l.wo.input, &sc.att, t, c.n_head * hv), t, &mut sc.o);
            residual_add(pool, &mut sc.x, &mut sc.o, l.post_attn_norm.as_deref(), c.rms_eps, e, t);

            // Feed-forward block.
            norm_rows(pool, &sc.x, &l.ffn_norm, c.rms_eps, &mut sc.h, e, t);
            sc.acts.invalidate();
            // The activation rides in the products' dispatch, on rows still in cache.
            let [a_gate, a_up] = sc.acts.get_many(pool, [l.w_gate.input, l.w_up.input], &sc.h, t, e);
            let act = c.opts.activation;
            matmul_gated(
                pool,
                t,
                Product { w: &l.w_gate, acts: a_gate, out: &mut sc.gate },
                &l.w_up,
                a_up,
                |out, g, u| match act {
                    FfnActivation::Silu => ops::silu_mul(out, g, u),
                    FfnActivation::GeluTanh => ops::gelu_mul(out, g, u),
                },
            );
            sc.acts.invalidate();
            matmul(pool, &l.w_down, sc.acts.get(pool, l.w_down.input, &sc.gate, t, c.n_ff), t, &mut sc.o);
            residual_add(pool, &mut sc.x, &mut sc.o, l.post_ffn_norm.as_deref(), c.rms_eps, e, t);
        }

        // Output head, on the rows asked for only (the first `n_out` rows of
        // `x` now), all sequences in one product.
        for q in seqs.iter_mut() {
            q.cache.commit(q.tokens.len());
        }
        let n = n_out;
        if n > 0 && seqs.iter().any(|q| q.want == Logits::Hidden) {
            // The normed rows are the answer (checked by the callers: a pass of this one sequence).
            sc.logits.resize(n * e, 0.0);
            norm_rows(pool, &sc.x, &w.output_norm, c.rms_eps, &mut sc.logits, e, n);
        } else if n > 0 {
            norm_rows(pool, &sc.x, &w.output_norm, c.rms_eps, &mut sc.h, e, n);
            let out = w.output();
            sc.logits.resize(n * c.n_vocab, 0.0);
            sc.acts.invalidate();
            matmul(pool, out, sc.acts.get(pool, out.input, &sc.h, n, e), n, &mut sc.logits);
        } else {
            // No rows wanted: the session must not keep an earlier pass's.
            sc.logits.clear();
        }
        if let [q] = seqs {
            // One sequence: hand the rows over instead of copying them (a
            // prompt's logits for every position can be large).
            std::mem::swap(q.logits, &mut sc.logits);
            return;
        }
        let mut at = 0;
        for q in seqs.iter_mut() {
            let rows = match q.want {
                Logits::None => 0,
                Logits::Last => 1,
                Logits::All | Logits::Hidden => q.tokens.len(),
            };
            q.logits.clear();
            q.logits.extend_from_slice(&sc.logits[at * c.n_vocab..(at + rows) * c.n_vocab]);
            at += rows;
        }
    }
}

fn norm_rows(pool: &Pool, x: &[f32], w: &[f32], eps: f32, out: &mut [f32], width: usize, t: usize) {
    pool.rows_mut(&mut out[..t * width], width, |j, o| ops::rms_norm(&x[j * width..(j + 1) * width], w, eps, o));
}

/// `x += norm(o)` (or `x += o` without a post-norm).
fn residual_add(pool: &Pool, x: &mut [f32], o: &mut [f32], post_norm: Option<&[f32]>, eps: f32, width: usize, t: usize) {
    let o = SyncPtr(o.as_mut_ptr());
    pool.rows_mut(&mut x[..t * width], width, |j, x| {
        // SAFETY: row j of `o` belongs to the task of row j of `x` alone.
        let o = unsafe { std::slice::from_raw_parts_mut(o.get().add(j * width), width) };
        if let Some(n) = post_norm {
            ops::rms_norm_inplace(o, n, eps);
        }
        x.iter_mut().zip(o.iter()).for_each(|(a, b)| *a += b);
    });
}
