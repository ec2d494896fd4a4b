//! The forward pass: a batch of tokens of one sequence in, their logits out.
//!
//! One code path for every family (the differences are read from
//! `FamilyOptions`) and for every batch size: a prompt and a single decoded
//! token go through the same loop, so prefill and decode cannot drift apart.
//! Scratch buffers grow to the largest batch seen and are then reused: the
//! token loop allocates nothing.

use ember_kv::{KvCache, KvType, LayerShape};

use crate::attention::{attend_rows, attention_many, AttnPart, AttnShape, BothWays};
use crate::config::{Config, DeltaLayer, FfnActivation, KvSource, LayerConfig, MoeConfig};
use crate::delta_net::{self, ChunkScratch};
use crate::device::{DeviceRings, DeviceSeq};
use crate::error::{ModelError, Result};
use crate::matmul::{matmul, matmul_gated, matmul_gated_set, matmul_many, matmul_set, Acts, GatedPart, Part, Product};
use crate::ops;
use crate::pool::{Pool, SyncPtr};
use crate::weights::{DeltaNetWeights, DenseFfn, Experts, LayerWeights, Matrix, PerLayerEmbeddings, PerLayerInput};
use crate::Model;

/// `$v` emptied, as a vector of the same elements with other lifetimes on
/// the same allocation: a layer's list of parts borrows that layer's
/// buffers, and the next layer reuses the allocation rather than making its
/// own (collecting an emptied vector's `into_iter` keeps it in place).
macro_rules! recycled {
    ($v:expr) => {{
        let mut v = $v;
        v.clear();
        v.into_iter().map(|_| unreachable!("the vector is empty")).collect()
    }};
}

thread_local! {
    /// Each pool thread's working memory for the delta rule's chunks.
    static DELTA_SCRATCH: std::cell::RefCell<ChunkScratch> = std::cell::RefCell::new(ChunkScratch::default());
}

/// Which positions of a pass need logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    None,
    Last,
    /// The last position's logits, of which a draw reads only the `k`
    /// largest (`Sampler::decided_by_top`): the rest may read as -inf. A
    /// device reads back those alone; the CPU, which has the row in
    /// memory, gives all of it.
    Top(usize),
    All,
    /// Every position's final hidden state (after the output norm, before
    /// the head), `n_embd` wide, in place of logits: what embeddings are
    /// pooled from. A pass of its own sequence only.
    Hidden,
}

/// The queries of a sequence's `n` rows that attend in a layer, as (first,
/// count): all of them, or in the last layer the wanted ones alone.
fn attending(want: Logits, n: usize, last: bool) -> (usize, usize) {
    match want {
        _ if !last => (0, n),
        Logits::None => (0, 0),
        Logits::Last | Logits::Top(_) => (n - 1, 1),
        Logits::All | Logits::Hidden => (0, n),
    }
}

/// Tokens of a prompt the gated delta rule reads as one chunk (llama.cpp's
/// chunked form uses 64).
const DELTA_CHUNK: usize = 64;

/// Per-pass working memory, sized for the largest batch seen.
#[derive(Default)]
struct Scratch {
    cap: usize,
    x: Vec<f32>,    // [t, n_embd] residual stream
    h: Vec<f32>,    // [t, n_embd] normed input of a block
    q: Vec<f32>,    // [t, widest q of a layer]
    k: Vec<f32>,    // [t, widest k]
    v: Vec<f32>,    // [t, widest v]
    att: Vec<f32>,  // [t, widest attention output]
    o: Vec<f32>,    // [t, n_embd] block output
    o2: Vec<f32>,   // [t, n_embd] a mixture's router input, then its output, beside a dense block
    gate: Vec<f32>, // [t, widest n_ff]
    cos: Vec<f32>,  // [rope variants, t, widest n_rot / 2]
    sin: Vec<f32>,
    /// Per-layer inputs (gemma4's E models): [t, n_layer * n_embd_per_layer],
    /// and the table rows of the pass's tokens they start from.
    per_layer: Vec<f32>,
    per_layer_tok: Vec<f32>,
    /// Attention layers' query gates (qwen35): [t, widest q].
    qgate: Vec<f32>,
    /// Gated DeltaNet layers: the projections before the convolution, after
    /// it, the output norm's gate, the rule's output [t, widths], and per
    /// value head the write strength and the log decay [t, n_v_heads].
    dn_mixed: Vec<f32>,
    dn_conv: Vec<f32>,
    dn_z: Vec<f32>,
    dn_out: Vec<f32>,
    dn_beta: Vec<f32>,
    dn_gate: Vec<f32>,
    /// The rule's outputs, per sequence head by head, before they go to `dn_out`.
    dn_heads: Vec<f32>,
    acts: Acts,
    moe: MoeScratch,
    /// Position and token of each row of the pass.
    pos: Vec<usize>,
    ids: Vec<u32>,
    /// Rows of the pass whose logits are wanted, in order.
    out_rows: Vec<usize>,
    logits: Vec<f32>, // [rows wanted, n_vocab]
    /// The allocation of a layer's list of attention parts, kept empty
    /// between layers (see `recycled!`).
    attn_parts: Vec<AttnPart<'static>>,
    /// A DeltaNet layer's (first row, rows, first position, rule state) per
    /// sequence, and the snapshots inside the pass per sequence, kept
    /// between layers.
    dn_spans: Vec<(usize, usize, usize, SyncPtr<f32>)>,
    dn_snaps: Vec<Vec<(usize, SyncPtr<f32>)>>,
}

impl Scratch {
    fn ensure(&mut self, c: &Config, t: usize) {
        if t <= self.cap {
            return;
        }
        let m = c.max_widths();
        let n_ropes = c.ropes.len();
        let per_layer = c.n_layer * c.n_embd_per_layer;
        let delta = c.layers.iter().find_map(|l| l.delta);
        let (conv, value, heads) = delta.map_or((0, 0, 0), |d| (d.conv_dim(), d.value_dim(), d.net.n_v_heads));
        let gated = c.layers.iter().any(|l| l.attn_gate);
        let sizes: [(&mut Vec<f32>, usize); 21] = [
            (&mut self.dn_heads, value),
            (&mut self.qgate, if gated { m.q } else { 0 }),
            (&mut self.dn_mixed, conv),
            (&mut self.dn_conv, conv),
            (&mut self.dn_z, value),
            (&mut self.dn_out, value),
            (&mut self.dn_beta, heads),
            (&mut self.dn_gate, heads),
            (&mut self.x, c.n_embd),
            (&mut self.h, c.n_embd.max(c.n_embd_per_layer)),
            (&mut self.q, m.q),
            (&mut self.k, m.k),
            (&mut self.v, m.v),
            (&mut self.att, m.att),
            (&mut self.o, c.n_embd),
            (&mut self.o2, if c.moe.is_some() { c.n_embd } else { 0 }),
            (&mut self.gate, m.ff.max(c.n_embd_per_layer)),
            (&mut self.cos, n_ropes * m.half_rot),
            (&mut self.sin, n_ropes * m.half_rot),
            (&mut self.per_layer, per_layer),
            (&mut self.per_layer_tok, per_layer),
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
    /// The positions held, and on the CPU their keys and values; on a
    /// device, the ledger of the rings there.
    pub cache: KvCache,
    scratch: Scratch,
    logits: Vec<f32>,
    /// The keys and values, where the model is placed on a device.
    rings: Option<DeviceRings>,
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
    /// Copies of a hybrid's recurrent states to take inside the pass, in
    /// order (usually none).
    pub snapshots: &'a mut [Snapshot],
    /// Rows read in place of some tokens' embeddings (a picture's), in
    /// order of position (usually none).
    pub media: &'a [Media<'a>],
}

/// A run of rows that stand in for the embeddings of the pass's tokens
/// `at..at + rows.len() / n_embd` (whose ids are then placeholders the cache
/// remembers them by): a picture's rows from its projector. Where
/// `bidirectional`, the run's rows attend to each other both ways, as the
/// family's encoder was trained (llama.cpp's non-causal image batches); the
/// whole run is then in one pass.
#[derive(Clone, Copy)]
pub struct Media<'a> {
    pub at: usize,
    pub rows: &'a [f32],
    pub bidirectional: bool,
}

impl Media<'_> {
    /// The tokens of the pass it stands in for.
    pub fn span(&self, n_embd: usize) -> std::ops::Range<usize> {
        self.at..self.at + self.rows.len() / n_embd
    }
}

/// A hybrid sequence's recurrent states after the first `at` tokens of a
/// pass (0 < `at` < the pass's tokens), taken without changing the pass's
/// own arithmetic: the delta rule's chunk that `at` falls in is summed again
/// on a copy up to `at`. Every state, one after another in the cache's order.
pub struct Snapshot {
    pub at: usize,
    pub states: Vec<f32>,
}

/// What the pass needs of one sequence.
struct Seq<'a> {
    cache: &'a mut KvCache,
    logits: &'a mut Vec<f32>,
    tokens: &'a [u32],
    want: Logits,
    snapshots: &'a mut [Snapshot],
    media: &'a [Media<'a>],
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

    /// Whether the keys and values are held on a device.
    pub fn on_device(&self) -> bool {
        self.rings.is_some()
    }

    /// The positions held and their keys and values, as bytes that
    /// [`restore_state`](Self::restore_state) reads back into a session of
    /// the same model and shape ([`KvCache::save_state`]'s format, wherever
    /// the rows are held).
    pub fn save_state(&self, model: &Model) -> Result<Vec<u8>> {
        match (&self.rings, model.placement()) {
            (Some(rings), Some(dw)) => dw.save_state(&self.cache, rings),
            (None, _) => Ok(self.cache.save_state()),
            (Some(_), None) => Err(ModelError::Invalid("a device session of a model not on a device".into())),
        }
    }

    /// Brings a hybrid's recurrent states back into the host's cache where
    /// the device's passes left newer ones, for a checkpoint to read them.
    pub fn take_states_back(&mut self, model: &Model) -> Result<()> {
        match (&self.rings, model.placement()) {
            (Some(rings), Some(dw)) => dw.take_states_back(&mut self.cache, rings),
            (None, _) => Ok(()),
            (Some(_), None) => Err(ModelError::Invalid("a device session of a model not on a device".into())),
        }
    }

    /// Restores a state [`save_state`](Self::save_state) wrote; a state of
    /// another shape leaves the session as it was.
    pub fn restore_state(&mut self, model: &Model, state: &[u8]) -> Result<()> {
        match (&self.rings, model.placement()) {
            (Some(rings), Some(dw)) => dw.restore_state(&mut self.cache, rings, state),
            (None, _) => Ok(self.cache.restore_state(state)?),
            (Some(_), None) => Err(ModelError::Invalid("a device session of a model not on a device".into())),
        }
    }
}

impl Model {
    /// Whether this model's caches can be of type `kv`: a Q8_0 cache stores
    /// each head as whole blocks of 32 elements.
    pub fn check_kv_type(&self, kv: KvType) -> Result<()> {
        let c = &self.config;
        match c.layers.iter().find(|l| !kv.holds_heads_of(l.head_dim_k) || !kv.holds_heads_of(l.head_dim_v)) {
            None => Ok(()),
            Some(l) => Err(ModelError::Invalid(format!(
                "a {} KV cache stores heads of whole blocks of 32 elements; this model's heads have {} (keys) and {} (values)",
                kv.name(),
                l.head_dim_k,
                l.head_dim_v
            ))),
        }
    }

    /// A sequence of up to `n_ctx` positions, fed at most `max_batch` tokens per pass.
    /// # Panics
    /// When the cache type cannot hold this model's heads (see
    /// [`Model::check_kv_type`], which callers check first), or the model is
    /// on a device that cannot hold the session
    /// ([`try_new_session`](Self::try_new_session) says why instead).
    pub fn new_session(&self, n_ctx: usize, max_batch: usize, kv_type: KvType) -> Session {
        self.try_new_session(n_ctx, max_batch, kv_type).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`new_session`](Self::new_session), or why not: a cache type that
    /// cannot hold this model's heads, or for a model placed on a device, a
    /// type its rings do not keep (f32) or rings it cannot hold.
    pub fn try_new_session(&self, n_ctx: usize, max_batch: usize, kv_type: KvType) -> Result<Session> {
        self.check_kv_type(kv_type)?;
        let c = &self.config;
        // Layers that read an earlier layer's keys and values store none.
        let shapes: Vec<LayerShape> = c
            .layers
            .iter()
            .filter(|l| matches!(l.kv, KvSource::Own(_)))
            .map(|l| LayerShape { k_width: l.k_width(), v_width: l.v_width(), window: l.window })
            .collect();
        let Some(dw) = self.placement() else {
            return Ok(Session {
                cache: KvCache::new(kv_type, n_ctx, max_batch.max(1), &shapes).with_states(&c.state_lens()),
                scratch: Scratch::default(),
                logits: Vec::new(),
                rings: None,
            });
        };
        // A hybrid's recurrent states stay in the ledger on the host between
        // passes, where checkpoints and saved slots read them.
        let cache = KvCache::held_elsewhere(kv_type, n_ctx, max_batch.max(1), &shapes).with_states(&self.config.state_lens());
        let rings = dw.rings(self, &cache)?;
        Ok(Session { cache, scratch: Scratch::default(), logits: Vec::new(), rings: Some(rings) })
    }

    /// Runs one pass of `tokens` (at most the session's `max_batch`), appended
    /// after what the session holds, and returns the logits asked for.
    pub fn forward<'s>(&self, s: &'s mut Session, tokens: &[u32], want: Logits) -> Result<&'s [f32]> {
        self.forward_with_media(s, tokens, &[], want)
    }

    /// [`Model::forward`] with some tokens' embeddings given as rows (`media`).
    pub fn forward_with_media<'s>(
        &self,
        s: &'s mut Session,
        tokens: &[u32],
        media: &[Media<'_>],
        want: Logits,
    ) -> Result<&'s [f32]> {
        self.check_pass(&s.cache, tokens)?;
        self.check_media(tokens.len(), media, s.on_device())?;
        let Session { cache, scratch, logits, rings } = s;
        match rings {
            Some(rings) => self.device_pass(vec![(cache, &*rings, tokens, want, logits)])?,
            None => self.pass(scratch, &mut [Seq { cache, logits, tokens, want, snapshots: &mut [], media }]),
        }
        Ok(&s.logits)
    }

    /// Refuses rows that do not fit the pass: runs out of order or past its
    /// tokens, rows of another width, a model whose tokens carry per-layer
    /// inputs the rows cannot give, or a device pass (which reads tokens only).
    fn check_media(&self, n_tokens: usize, media: &[Media<'_>], on_device: bool) -> Result<()> {
        if media.is_empty() {
            return Ok(());
        }
        let e = self.config.n_embd;
        if on_device {
            return Err(ModelError::Invalid("pictures are read on the CPU only: a device pass takes tokens".into()));
        }
        if self.weights.per_layer.is_some() {
            return Err(ModelError::Invalid(format!(
                "{} models read per-layer inputs of each token, which a picture's rows do not have",
                self.config.arch.name()
            )));
        }
        let mut end = 0;
        for m in media {
            if m.rows.is_empty() || m.rows.len() % e != 0 {
                return Err(ModelError::Invalid(format!(
                    "a picture's rows are {e} wide: {} values are not whole rows",
                    m.rows.len()
                )));
            }
            let span = m.span(e);
            if span.start < end || span.end > n_tokens {
                return Err(ModelError::Invalid(format!(
                    "rows for tokens {}..{} overlap another run or pass the {n_tokens} tokens of the pass",
                    span.start, span.end
                )));
            }
            end = span.end;
        }
        Ok(())
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
            self.check_media(sp.tokens.len(), sp.media, sp.session.on_device())?;
        }
        if seqs.len() > 1 && seqs.iter().any(|sp| sp.want == Logits::Hidden) {
            return Err(ModelError::Invalid("hidden states are read in a pass of their own sequence".into()));
        }
        if seqs.iter().any(|sp| sp.session.on_device()) {
            if seqs.iter().any(|sp| !sp.session.on_device()) {
                return Err(ModelError::Invalid("a pass mixes CPU and device sessions".into()));
            }
            if seqs.iter().any(|sp| !sp.snapshots.is_empty()) {
                // Rare (a hybrid's prompt crossing a checkpoint): each
                // sequence on its own, cut where its snapshots fall.
                for sp in seqs.iter_mut() {
                    self.device_pass_with_snapshots(sp)?;
                }
                return Ok(());
            }
            let mut parts = Vec::with_capacity(seqs.len());
            for sp in seqs.iter_mut() {
                let Session { cache, logits, rings, .. } = &mut *sp.session;
                parts.push((cache, rings.as_ref().expect("checked above"), sp.tokens, sp.want, logits));
            }
            return self.device_pass(parts);
        }
        let mut parts: Vec<Seq<'_>> = seqs
            .iter_mut()
            .map(|sp| {
                let Session { cache, logits, .. } = &mut *sp.session;
                Seq { cache, logits, tokens: sp.tokens, want: sp.want, snapshots: &mut *sp.snapshots, media: sp.media }
            })
            .collect();
        if !parts.is_empty() {
            self.pass(&mut ws.scratch, &mut parts);
        }
        Ok(())
    }

    /// One pass of several sequences on the device their rings are on;
    /// their positions are held once it has run.
    #[allow(clippy::type_complexity)]
    fn device_pass(&self, parts: Vec<(&mut KvCache, &DeviceRings, &[u32], Logits, &mut Vec<f32>)>) -> Result<()> {
        let dw = self.placement().ok_or_else(|| ModelError::Invalid("a device session of a model not on a device".into()))?;
        let mut seqs: Vec<DeviceSeq<'_>> = parts
            .into_iter()
            .map(|(cache, rings, tokens, want, out)| DeviceSeq { cache, rings, tokens, want, out })
            .collect();
        dw.pass(self, &mut seqs)?;
        for q in seqs {
            q.cache.commit(q.tokens.len());
        }
        Ok(())
    }

    /// One device sequence's pass, cut where its snapshots fall, each
    /// snapshot taking the states the pieces before it left. The device's
    /// rule takes a token at a time, so the cuts change no arithmetic.
    fn device_pass_with_snapshots(&self, sp: &mut SeqPass<'_>) -> Result<()> {
        let Session { cache, logits, rings, .. } = &mut *sp.session;
        let rings = rings.as_ref().expect("a device session");
        let dw = self.placement().ok_or_else(|| ModelError::Invalid("a device session of a model not on a device".into()))?;
        let mut done = 0;
        for snap in sp.snapshots.iter_mut() {
            if snap.at > done {
                self.device_pass(vec![(&mut *cache, rings, &sp.tokens[done..snap.at], Logits::None, &mut *logits)])?;
                done = snap.at;
            }
            dw.take_states_back(cache, rings)?;
            snap.states.clear();
            cache.copy_states_into(&mut snap.states);
        }
        // Snapshots fall inside the pass (0 < at < its tokens), and the
        // batcher asks for the last row alone, which the last piece holds.
        debug_assert!(done < sp.tokens.len() && !matches!(sp.want, Logits::All | Logits::Hidden));
        self.device_pass(vec![(&mut *cache, rings, &sp.tokens[done..], sp.want, &mut *logits)])
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

    /// Feeds any number of tokens in passes of at most `max_batch`, ending on
    /// its multiples as a read from zero's do; returns the logits of every
    /// position (`Logits::All`) or of the last one.
    pub fn prefill(&self, s: &mut Session, tokens: &[u32], want: Logits) -> Result<Vec<f32>> {
        self.prefill_with_media(s, tokens, &[], want)
    }

    /// [`Model::prefill`] with some tokens' embeddings given as rows
    /// (`media`, positions counted from the first of `tokens`). A pass never
    /// ends inside a bidirectional run, so each run is read whole; one longer
    /// than a pass is refused.
    pub fn prefill_with_media(&self, s: &mut Session, tokens: &[u32], media: &[Media<'_>], want: Logits) -> Result<Vec<f32>> {
        let e = self.config.n_embd;
        s.cache.reserve(0)?;
        self.check_media(tokens.len(), media, s.on_device())?;
        let step = s.cache.max_batch();
        if let Some(m) = media.iter().find(|m| m.bidirectional && m.span(e).len() > step) {
            return Err(ModelError::Invalid(format!(
                "a picture of {} rows is read in one pass, and a pass holds {step} (raise the batch size)",
                m.span(e).len()
            )));
        }
        if s.cache.len() + tokens.len() > s.cache.n_ctx() {
            return Err(ember_kv::KvError::ContextFull { needed: s.cache.len() + tokens.len(), capacity: s.cache.n_ctx() }.into());
        }
        let mut all = Vec::new();
        let mut done = 0;
        while done < tokens.len() {
            let mut end = (done + step - s.cache.len() % step).min(tokens.len());
            // A cut inside a bidirectional run moves to its start, or, where
            // the pass starts with the run, to its end (a run fits a pass).
            if let Some(m) = media.iter().find(|m| m.bidirectional && m.span(e).start < end && end < m.span(e).end) {
                end = if m.span(e).start > done { m.span(e).start } else { m.span(e).end };
            }
            let part: Vec<Media<'_>> = media
                .iter()
                .filter_map(|m| {
                    let span = m.span(e);
                    let (from, to) = (span.start.max(done), span.end.min(end));
                    (from < to).then(|| Media {
                        at: from - done,
                        rows: &m.rows[(from - span.start) * e..(to - span.start) * e],
                        bidirectional: m.bidirectional,
                    })
                })
                .collect();
            let last = end == tokens.len();
            let w = match want {
                Logits::All | Logits::Hidden => want,
                Logits::Last | Logits::Top(_) if last => want,
                _ => Logits::None,
            };
            let out = self.forward_with_media(s, &tokens[done..end], &part, w)?;
            if matches!(w, Logits::All | Logits::Hidden) {
                all.extend_from_slice(out);
            } else if matches!(w, Logits::Last | Logits::Top(_)) {
                all = out.to_vec();
            }
            done = end;
        }
        Ok(all)
    }

    fn pass(&self, sc: &mut Scratch, seqs: &mut [Seq<'_>]) {
        let c = &self.config;
        let w = &self.weights;
        let pool = &self.pool;
        let t: usize = seqs.iter().map(|q| q.tokens.len()).sum();
        let e = c.n_embd;
        let max_half = c.max_widths().half_rot;
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
            ember_quant::dequantize_row(w.token_embd.ty, w.token_embd.row(ids[j] as usize), row)
                .expect("embedding row bound at load");
            if scale != 1.0 {
                row.iter_mut().for_each(|v| *v *= scale);
            }
        });
        let mut r0 = 0;
        for q in seqs.iter() {
            for m in q.media {
                let span = m.span(e);
                sc.x[(r0 + span.start) * e..(r0 + span.end) * e].copy_from_slice(m.rows);
            }
            r0 += q.tokens.len();
        }
        if let Some(pe) = &w.per_layer {
            self.per_layer_inputs(pe, sc, t);
        }

        // Rows whose logits are wanted, in order: in the last layer only they
        // go on past attention (as llama.cpp's output ids do).
        sc.out_rows.clear();
        let mut r0 = 0;
        for q in seqs.iter() {
            let n = q.tokens.len();
            match q.want {
                Logits::None => {}
                Logits::Last | Logits::Top(_) => sc.out_rows.push(r0 + n - 1),
                Logits::All | Logits::Hidden => sc.out_rows.extend(r0..r0 + n),
            }
            r0 += n;
        }
        let n_out = sc.out_rows.len();

        // Rope angles for this pass, per rope variant (LongRoPE's depend on
        // each sequence's context size).
        for (variant, table) in self.rope_tables.iter().enumerate() {
            let half = table.half();
            let mut j = 0;
            for q in seqs.iter() {
                let n_ctx = q.cache.n_ctx();
                for _ in q.tokens {
                    let at = (variant * t + j) * max_half;
                    table.angles(sc.pos[j], n_ctx, &mut sc.cos[at..at + half], &mut sc.sin[at..at + half]);
                    j += 1;
                }
            }
        }

        let mut t = t;
        for (il, (l, lc)) in w.layers.iter().zip(&c.layers).enumerate() {
            let last = il + 1 == w.layers.len();
            norm_rows(pool, &sc.x, &l.attn_norm, c.rms_eps, &mut sc.h, e, t);
            if let (Some(d), Some(dw), KvSource::Recurrent(si)) = (lc.delta, &l.delta, lc.kv) {
                // Gated DeltaNet block: every row carries the state forward,
                // so the last layer narrows to the wanted rows only after it.
                self.delta_block(d, dw, si, sc, seqs, t);
                if last && n_out < t {
                    if n_out == 0 {
                        break;
                    }
                    for (at, &r) in sc.out_rows.iter().enumerate() {
                        sc.x.copy_within(r * e..(r + 1) * e, at * e);
                        sc.o.copy_within(r * e..(r + 1) * e, at * e);
                    }
                    t = n_out;
                }
            } else {
                match self.attention_block(l, lc, last, sc, seqs, t, n_out) {
                    Some(rows) => t = rows,
                    None => break,
                }
            }
            residual_add(pool, &mut sc.x, &mut sc.o, l.post_attn_norm.as_deref(), c.rms_eps, e, t);
            self.ffn_block(l, sc, t);
            residual_add(pool, &mut sc.x, &mut sc.o, l.post_ffn_norm.as_deref(), c.rms_eps, e, t);
            if let Some(p) = &l.per_layer {
                self.per_layer_block(p, il, sc, t);
            }
            if let Some(s) = l.out_scale {
                sc.x[..t * e].iter_mut().for_each(|v| *v *= s);
            }
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
            if let Some(cap) = c.logit_softcap {
                pool.rows_mut(&mut sc.logits[..n * c.n_vocab], c.n_vocab, |_, row| {
                    row.iter_mut().for_each(|v| *v = (*v / cap).tanh() * cap);
                });
            }
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
                Logits::Last | Logits::Top(_) => 1,
                Logits::All | Logits::Hidden => q.tokens.len(),
            };
            q.logits.clear();
            q.logits.extend_from_slice(&sc.logits[at * c.n_vocab..(at + rows) * c.n_vocab]);
            at += rows;
        }
    }

    /// Layer `l`'s attention over the `t` rows of `sc.h` (normed), into
    /// `sc.o`: the projections, the keys and values written to each
    /// sequence's cache, every sequence's queries attending to it in one
    /// dispatch, and the output projection. The rows that go on (in the last
    /// layer, only those whose logits are wanted) or None when none do.
    #[allow(clippy::too_many_arguments)]
    fn attention_block(
        &self,
        l: &LayerWeights,
        lc: &LayerConfig,
        last: bool,
        sc: &mut Scratch,
        seqs: &mut [Seq<'_>],
        t: usize,
        n_out: usize,
    ) -> Option<usize> {
        let (c, pool) = (&self.config, &self.pool);
        let e = c.n_embd;
        let max_half = c.max_widths().half_rot;
        let (hk, hv) = (lc.head_dim_k, lc.head_dim_v);
        let (qw, kw, vw, aw) = (lc.q_width(), lc.k_width(), lc.v_width(), lc.att_width());
        let mut t = t;
        let wq = l.wq.as_ref().expect("an attention layer has queries");
        sc.acts.invalidate();
        // One dispatch for the three: a decoded token pays for each fork/join.
        match (&l.wk, &l.wv) {
            (Some(wk), Some(wv)) => {
                let [aq, ak, av] = sc.acts.get_many(pool, [wq.input, wk.input, wv.input], &sc.h, t, e);
                matmul_many(
                    pool,
                    t,
                    [
                        Product { w: wq, acts: aq, out: &mut sc.q },
                        Product { w: wk, acts: ak, out: &mut sc.k },
                        Product { w: wv, acts: av, out: &mut sc.v },
                    ],
                );
            }
            (Some(wk), None) => {
                let [aq, ak] = sc.acts.get_many(pool, [wq.input, wk.input], &sc.h, t, e);
                matmul_many(
                    pool,
                    t,
                    [Product { w: wq, acts: aq, out: &mut sc.q }, Product { w: wk, acts: ak, out: &mut sc.k }],
                );
                // Values are the keys before their norm (gemma4's attention_k_eq_v).
                sc.v[..t * vw].copy_from_slice(&sc.k[..t * kw]);
            }
            (None, _) => matmul(pool, wq, sc.acts.get(pool, wq.input, &sc.h, t, e), t, &mut sc.q),
        }
        if lc.attn_gate {
            split_query_gates(&mut sc.q, &mut sc.qgate, t, lc.n_head, hk);
        }
        let own = l.wk.is_some();
        for (buf, bias, width) in [(&mut sc.q, &l.bq, qw), (&mut sc.k, &l.bk, kw), (&mut sc.v, &l.bv, vw)] {
            if let Some(b) = bias {
                buf[..t * width].chunks_mut(width).for_each(|r| r.iter_mut().zip(b).for_each(|(x, y)| *x += y));
            }
        }
        let half = c.ropes[lc.rope].n_rot / 2;
        let table = lc.rope * t * max_half;
        let (cos, sin) = (&sc.cos[table..], &sc.sin[table..]);
        let rope_rows = |buf: &mut Vec<f32>, norm: &Option<Vec<f32>>, width: usize| {
            pool.rows_mut(&mut buf[..t * width], width, |j, row| {
                let at = j * max_half;
                for head in row.chunks_mut(hk) {
                    if let Some(n) = norm {
                        ops::rms_norm_inplace(head, n, c.rms_eps);
                    }
                    ops::rope_apply(head, c.opts.rope, &cos[at..at + half], &sin[at..at + half]);
                }
            });
        };
        rope_rows(&mut sc.q, &l.q_norm, qw);
        if own {
            rope_rows(&mut sc.k, &l.k_norm, kw);
            if c.opts.value_norm {
                pool.rows_mut(&mut sc.v[..t * vw], vw, |_, row| {
                    row.chunks_mut(hv).for_each(|head| ops::rms_norm_plain(head, c.rms_eps))
                });
            }
        }
        let cache_layer = lc.kv.cache_layer();
        let shape = AttnShape {
            n_head: lc.n_head,
            n_head_kv: lc.n_head_kv,
            head_dim_k: hk,
            head_dim_v: hv,
            scale: lc.attn_scale,
            window: lc.window,
        };
        if let KvSource::Own(ci) = lc.kv {
            let mut r0 = 0;
            for q in seqs.iter_mut() {
                let (n, start) = (q.tokens.len(), q.cache.len());
                for j in 0..n {
                    let r = r0 + j;
                    q.cache.write(ci, start + j, &sc.k[r * kw..(r + 1) * kw], &sc.v[r * vw..(r + 1) * vw]);
                }
                r0 += n;
            }
        }
        // Every row's key and value are in the cache now. In the last
        // layer a row whose logits nobody wants changes nothing more, so
        // only the wanted rows' queries attend, and the rows after
        // attention are those alone, in order (`out_rows`).
        if last && n_out < t {
            if n_out == 0 {
                return None;
            }
            let pw = c.n_layer * c.n_embd_per_layer;
            for (at, &r) in sc.out_rows.iter().enumerate() {
                sc.x.copy_within(r * e..(r + 1) * e, at * e);
                sc.per_layer.copy_within(r * pw..(r + 1) * pw, at * pw);
            }
        }
        let mut parts: Vec<AttnPart<'_>> = recycled!(std::mem::take(&mut sc.attn_parts));
        let (mut q_rest, mut out_rest) = (&sc.q[..t * qw], &mut sc.att[..t * aw]);
        for q in seqs.iter() {
            let n = q.tokens.len();
            let (qs, qr) = q_rest.split_at(n * qw);
            q_rest = qr;
            let (first, m) = attending(q.want, n, last);
            if m == 0 {
                continue;
            }
            let (os, or) = std::mem::take(&mut out_rest).split_at_mut(m * aw);
            out_rest = or;
            parts.push(AttnPart {
                cache: &*q.cache,
                q: &qs[first * qw..],
                start: q.cache.len() + first,
                t: m,
                out: os,
            });
        }
        attention_many(pool, cache_layer, &shape, &mut parts);
        sc.attn_parts = recycled!(parts);
        self.attend_both_ways(cache_layer, &shape, last, sc, seqs, lc);
        if last {
            t = n_out;
        }
        if lc.attn_gate {
            // The wanted rows only, in the last layer (`out_rows`).
            let (gates, rows) = (&sc.qgate, &sc.out_rows);
            let narrowed = last && t == n_out && n_out < sc.pos.len();
            pool.rows_mut(&mut sc.att[..t * aw], aw, |j, row| {
                let g = if narrowed { rows[j] } else { j };
                row.iter_mut().zip(&gates[g * qw..(g + 1) * qw]).for_each(|(v, &z)| *v *= sigmoid(z));
            });
        }
        let wo = l.wo.as_ref().expect("an attention layer has an output");
        sc.acts.invalidate();
        matmul(pool, wo, sc.acts.get(pool, wo.input, &sc.att, t, aw), t, &mut sc.o);
        Some(t)
    }

    /// The rows of a bidirectional run again, each over every key of its
    /// run as well as those before it: the causal attention above gave them
    /// the keys up to their own position only. In the last layer only the
    /// wanted rows are there (`attention_block`'s narrowing), and only
    /// those of a run are done again.
    fn attend_both_ways(&self, il: usize, shape: &AttnShape, last: bool, sc: &mut Scratch, seqs: &[Seq<'_>], lc: &LayerConfig) {
        if seqs.iter().all(|q| q.media.iter().all(|m| !m.bidirectional)) {
            return;
        }
        let (e, qw, aw) = (self.config.n_embd, lc.q_width(), lc.att_width());
        let mut rows = Vec::new();
        let (mut r0, mut out0) = (0, 0);
        for q in seqs.iter() {
            let n = q.tokens.len();
            let (first, m) = attending(q.want, n, last);
            let start = q.cache.len();
            for media in q.media.iter().filter(|m| m.bidirectional) {
                let span = media.span(e);
                for j in span.start.max(first)..span.end.min(first + m) {
                    rows.push(BothWays {
                        cache: &*q.cache,
                        q: (r0 + j) * qw,
                        out: (out0 + j - first) * aw,
                        pos: start + j,
                        keys_end: start + span.end,
                    });
                }
            }
            r0 += n;
            out0 += m;
        }
        attend_rows(&self.pool, il, shape, &sc.q, &mut sc.att, &rows);
    }

    /// Layer `l`'s feed-forward block over the `t` rows of `sc.x`, into
    /// `sc.o`: dense, a mixture, or both side by side.
    fn ffn_block(&self, l: &LayerWeights, sc: &mut Scratch, t: usize) {
        let (c, pool) = (&self.config, &self.pool);
        let e = c.n_embd;
    norm_rows(pool, &sc.x, &l.ffn_norm, c.rms_eps, &mut sc.h, e, t);
    if let Some(f) = &l.ffn {
        self.dense_ffn(f, sc, t);
    }
    if let Some(x) = &l.experts {
        let m = c.moe.as_ref().expect("experts in a model with a mixture");
        if let Some(g) = &l.shared_gate {
            // A shared expert (qwen35moe, in `o`), scaled by its gate,
            // beside the mixture.
            let h = &sc.h;
            pool.rows_mut(&mut sc.o[..t * e], e, |j, row| {
                let z: f32 = h[j * e..(j + 1) * e].iter().zip(g).map(|(a, b)| a * b).sum();
                let s = sigmoid(z);
                row.iter_mut().for_each(|v| *v *= s);
            });
            sc.moe.route(pool, &x.router, &sc.h, t, e, m);
            sc.moe.experts(pool, x, c.opts.activation, &sc.h, t, e, &mut sc.o2);
            sc.o[..t * e].iter_mut().zip(&sc.o2[..t * e]).for_each(|(a, b)| *a += b);
        } else if l.ffn.is_some() {
            // Beside a dense block (gemma4): each normed on its own,
            // the router reading the scaled residual.
            if let Some(n) = &x.post_norm_dense {
                pool.rows_mut(&mut sc.o[..t * e], e, |_, row| ops::rms_norm_inplace(row, n, c.rms_eps));
            }
            let inv = 1.0 / (e as f32).sqrt();
            let rs = x.router_scale.as_deref().expect("bound with the mixture");
            let xr = &sc.x;
            pool.rows_mut(&mut sc.o2[..t * e], e, |j, row| {
                ops::rms_norm_plain_into(&xr[j * e..(j + 1) * e], c.rms_eps, row);
                row.iter_mut().zip(rs).for_each(|(v, s)| *v = *v * inv * s);
            });
            sc.moe.route(pool, &x.router, &sc.o2, t, e, m);
            norm_rows(
                pool,
                &sc.x,
                x.pre_norm.as_deref().expect("bound with the mixture"),
                c.rms_eps,
                &mut sc.h,
                e,
                t,
            );
            sc.moe.experts(pool, x, c.opts.activation, &sc.h, t, e, &mut sc.o2);
            let post = x.post_norm.as_deref().expect("bound with the mixture");
            let o = SyncPtr(sc.o.as_mut_ptr());
            pool.rows_mut(&mut sc.o2[..t * e], e, |j, row| {
                ops::rms_norm_inplace(row, post, c.rms_eps);
                // SAFETY: row j of `o` belongs to the task of row j alone.
                let o = unsafe { std::slice::from_raw_parts_mut(o.get().add(j * e), e) };
                o.iter_mut().zip(row.iter()).for_each(|(a, b)| *a += b);
            });
        } else {
            sc.moe.route(pool, &x.router, &sc.h, t, e, m);
            sc.moe.experts(pool, x, c.opts.activation, &sc.h, t, e, &mut sc.o);
        }
    }
    }

    /// A gated DeltaNet layer over the `t` rows of `sc.h` (normed), into
    /// `sc.o`: the projections for all sequences at once, then per sequence
    /// its convolution and its rule (a decoded token one step, a prompt in
    /// chunks) carrying its own state (`si` of its cache's states), then
    /// the gated output norm and the output projection.
    fn delta_block(
        &self,
        d: DeltaLayer,
        dw: &DeltaNetWeights,
        si: usize,
        sc: &mut Scratch,
        seqs: &mut [Seq<'_>],
        t: usize,
    ) {
        let (pool, c) = (&self.pool, &self.config);
        let e = c.n_embd;
        let (cd, vd, kd, nv, hd) = (d.conv_dim(), d.value_dim(), d.key_dim(), d.net.n_v_heads, d.net.head_dim);
        sc.acts.invalidate();
        let [a_qkv, a_z, a_beta, a_alpha] =
            sc.acts.get_many(pool, [dw.qkv.input, dw.z.input, dw.beta.input, dw.alpha.input], &sc.h, t, e);
        matmul_many(
            pool,
            t,
            [
                Product { w: &dw.qkv, acts: a_qkv, out: &mut sc.dn_mixed },
                Product { w: &dw.z, acts: a_z, out: &mut sc.dn_z },
                Product { w: &dw.beta, acts: a_beta, out: &mut sc.dn_beta },
                Product { w: &dw.alpha, acts: a_alpha, out: &mut sc.dn_gate },
            ],
        );
        for r in 0..t {
            for h in 0..nv {
                let b = &mut sc.dn_beta[r * nv + h];
                *b = sigmoid(*b);
                let g = &mut sc.dn_gate[r * nv + h];
                *g = delta_net::softplus(*g + dw.dt_bias[h]) * dw.a[h];
            }
        }
        // Each sequence's convolution, then the rule for every (sequence,
        // value head) at once: the heads' states are disjoint, and each
        // writes its outputs head-major into its sequence's rows of
        // `dn_heads`.
        let mut spans = std::mem::take(&mut sc.dn_spans);
        spans.clear();
        // Per sequence, the snapshots inside this pass: where, and this
        // layer's rule state in each.
        let mut snaps = std::mem::take(&mut sc.dn_snaps);
        snaps.iter_mut().for_each(Vec::clear);
        snaps.resize_with(seqs.len(), Vec::new);
        let mut r0 = 0;
        for q in seqs.iter_mut() {
            let (n, first) = (q.tokens.len(), q.cache.len());
            let offset: usize = (0..si).map(|i| q.cache.state(i).len()).sum();
            let state = q.cache.state_mut(si);
            let (conv_state, rule_state) = state.split_at_mut(d.conv_state_len());
            let rows = r0 * cd..(r0 + n) * cd;
            let here = &mut snaps[spans.len()];
            for s in q.snapshots.iter_mut().filter(|s| s.at > 0 && s.at < n) {
                let (conv, rule) = s.states[offset..offset + d.state_len()].split_at_mut(d.conv_state_len());
                delta_net::conv_state_after(conv_state, &sc.dn_mixed[rows.clone()], cd, s.at, conv);
                here.push((s.at, SyncPtr(rule.as_mut_ptr())));
            }
            delta_net::conv_silu(
                &dw.conv,
                d.d_conv,
                cd,
                conv_state,
                &sc.dn_mixed[rows.clone()],
                n,
                &mut sc.dn_conv[rows.clone()],
            );
            for row in sc.dn_conv[rows].chunks_mut(cd) {
                row[..2 * kd].chunks_mut(hd).for_each(|head| delta_net::l2_norm(head, c.rms_eps));
            }
            spans.push((r0, n, first, SyncPtr(rule_state.as_mut_ptr())));
            r0 += n;
        }
        let (x, gate, beta) = (&sc.dn_conv, &sc.dn_gate, &sc.dn_beta);
        let heads_out = SyncPtr(sc.dn_heads.as_mut_ptr());
        pool.for_each(spans.len() * nv, |i| {
            let ((r0, n, first, state), h) = (&spans[i / nv], i % nv);
            let (r0, n, first) = (*r0, *n, *first);
            let snaps = &snaps[i / nv];
            // SAFETY: item i alone touches head h of this sequence's state
            // and its rows' head-h block of `dn_heads`.
            let m = unsafe { std::slice::from_raw_parts_mut(state.get().add(h * hd * hd), hd * hd) };
            let o = unsafe { std::slice::from_raw_parts_mut(heads_out.get().add(r0 * vd + h * n * hd), n * hd) };
            let x = &x[r0 * cd..(r0 + n) * cd];
            let (gate, beta) = (&gate[r0 * nv..(r0 + n) * nv], &beta[r0 * nv..(r0 + n) * nv]);
            if n == 1 {
                d.net.step_head(
                    h,
                    m,
                    &x[..kd],
                    &x[kd..2 * kd],
                    &x[2 * kd + h * hd..2 * kd + (h + 1) * hd],
                    gate[h],
                    beta[h],
                    o,
                );
            } else {
                let io = delta_net::TokenRows {
                    q: x,
                    k: &x[kd..],
                    qk_stride: cd,
                    v: &x[2 * kd..],
                    v_stride: cd,
                    gate,
                    beta,
                };
                DELTA_SCRATCH.with_borrow_mut(|sc| {
                    // Up to each snapshot's chunk on the grid, the pass's own
                    // run (cut only on the grid, which changes nothing);
                    // from there to the snapshot, a copy.
                    let mut done = 0;
                    for (at, rule) in snaps.iter() {
                        let at = *at;
                        let cut = ((first + at) / DELTA_CHUNK * DELTA_CHUNK).saturating_sub(first).max(done);
                        if cut > done {
                            let io = io.skip(done, nv);
                            d.net.chunks_head(
                                h,
                                m,
                                cut - done,
                                first + done,
                                DELTA_CHUNK,
                                &io,
                                &mut o[done * hd..],
                                sc,
                            );
                            done = cut;
                        }
                        // SAFETY: item i alone touches head h of this snapshot's rule state.
                        let copy = unsafe { std::slice::from_raw_parts_mut(rule.get().add(h * hd * hd), hd * hd) };
                        copy.copy_from_slice(m);
                        let mut discard = vec![0.0; (at - cut) * hd];
                        d.net.chunks_head(
                            h,
                            copy,
                            at - cut,
                            first + cut,
                            DELTA_CHUNK,
                            &io.skip(cut, nv),
                            &mut discard,
                            sc,
                        );
                    }
                    if done < n {
                        let io = io.skip(done, nv);
                        d.net.chunks_head(h, m, n - done, first + done, DELTA_CHUNK, &io, &mut o[done * hd..], sc);
                    }
                });
            }
        });
        for &(r0, n, ..) in &spans {
            for h in 0..nv {
                for s in 0..n {
                    let from = r0 * vd + h * n * hd + s * hd;
                    let to = (r0 + s) * vd + h * hd;
                    sc.dn_out[to..to + hd].copy_from_slice(&sc.dn_heads[from..from + hd]);
                }
            }
        }
        (sc.dn_spans, sc.dn_snaps) = (spans, snaps);
        let (z, norm, eps) = (&sc.dn_z, &dw.norm, c.rms_eps);
        pool.rows_mut(&mut sc.dn_out[..t * vd], vd, |j, row| {
            for (h, head) in row.chunks_mut(hd).enumerate() {
                ops::rms_norm_inplace(head, norm, eps);
                let zh = &z[j * vd + h * hd..j * vd + (h + 1) * hd];
                head.iter_mut().zip(zh).for_each(|(v, &g)| *v *= g * sigmoid(g));
            }
        });
        sc.acts.invalidate();
        matmul(pool, &dw.out, sc.acts.get(pool, dw.out.input, &sc.dn_out, t, vd), t, &mut sc.o);
    }

    /// `o = down(act(gate h) * up h)` over the `t` rows of `sc.h`.
    fn dense_ffn(&self, f: &DenseFfn, sc: &mut Scratch, t: usize) {
        let (pool, e) = (&self.pool, self.config.n_embd);
        sc.acts.invalidate();
        // The activation rides in the products' dispatch, on rows still in cache.
        let [a_gate, a_up] = sc.acts.get_many(pool, [f.gate.input, f.up.input], &sc.h, t, e);
        matmul_gated(
            pool,
            t,
            Product { w: &f.gate, acts: a_gate, out: &mut sc.gate },
            &f.up,
            a_up,
            activation(self.config.opts.activation),
        );
        sc.acts.invalidate();
        matmul(pool, &f.down, sc.acts.get(pool, f.down.input, &sc.gate, t, f.gate.rows), t, &mut sc.o);
    }

    /// gemma4's per-layer inputs of the pass, before the first layer: each
    /// token's rows of the per-layer table (read from the mapping for these
    /// tokens alone), scaled by sqrt(n_embd_per_layer), plus the projection
    /// of its scaled embedding, scaled by 1/sqrt(n_embd) and normed per
    /// layer; the sum scaled by 1/sqrt(2).
    fn per_layer_inputs(&self, pe: &PerLayerEmbeddings, sc: &mut Scratch, t: usize) {
        let (c, pool) = (&self.config, &self.pool);
        let (e, npl) = (c.n_embd, c.n_embd_per_layer);
        let width = c.n_layer * npl;
        sc.acts.invalidate();
        matmul(pool, &pe.model_proj, sc.acts.get(pool, pe.model_proj.input, &sc.x, t, e), t, &mut sc.per_layer);
        let (proj_scale, tok_scale, sum_scale) =
            (1.0 / (e as f32).sqrt(), (npl as f32).sqrt(), std::f32::consts::FRAC_1_SQRT_2);
        let ids = &sc.ids;
        self.per_layer_rows_read.fetch_add(t, std::sync::atomic::Ordering::Relaxed);
        let tok = SyncPtr(sc.per_layer_tok.as_mut_ptr());
        pool.rows_mut(&mut sc.per_layer[..t * width], width, |j, row| {
            // SAFETY: row j of the token rows belongs to the task of row j alone.
            let tok = unsafe { std::slice::from_raw_parts_mut(tok.get().add(j * width), width) };
            ember_quant::dequantize_row(pe.table.ty, pe.table.row(ids[j] as usize), tok)
                .expect("table row bound at load");
            for (p, tk) in row.chunks_mut(npl).zip(tok.chunks(npl)) {
                p.iter_mut().for_each(|v| *v *= proj_scale);
                ops::rms_norm_inplace(p, &pe.proj_norm, c.rms_eps);
                p.iter_mut().zip(tk).for_each(|(v, k)| *v = (*v + k * tok_scale) * sum_scale);
            }
        });
    }

    /// `x += post_norm(proj(gelu(gate x) * this layer's per-layer input))`.
    fn per_layer_block(&self, p: &PerLayerInput, il: usize, sc: &mut Scratch, t: usize) {
        let (c, pool) = (&self.config, &self.pool);
        let (e, npl) = (c.n_embd, c.n_embd_per_layer);
        let width = c.n_layer * npl;
        sc.acts.invalidate();
        matmul(pool, &p.gate, sc.acts.get(pool, p.gate.input, &sc.x, t, e), t, &mut sc.h);
        let (g, inputs) = (&sc.h, &sc.per_layer);
        pool.rows_mut(&mut sc.gate[..t * npl], npl, |j, out| {
            ops::gelu_mul(out, &g[j * npl..(j + 1) * npl], &inputs[j * width + il * npl..j * width + (il + 1) * npl]);
        });
        sc.acts.invalidate();
        matmul(pool, &p.proj, sc.acts.get(pool, p.proj.input, &sc.gate, t, npl), t, &mut sc.o);
        residual_add(pool, &mut sc.x, &mut sc.o, Some(&p.post_norm), c.rms_eps, e, t);
    }
}

fn activation(act: FfnActivation) -> impl Fn(&mut [f32], &[f32], &[f32]) + Sync {
    move |out, g, u| match act {
        FfnActivation::Silu => ops::silu_mul(out, g, u),
        FfnActivation::GeluTanh => ops::gelu_mul(out, g, u),
    }
}

/// Working memory of a mixture: the router's choice for each row of the
/// pass, the rows grouped by expert, and one expert's rows at a time.
#[derive(Default)]
struct MoeScratch {
    logits: Vec<f32>, // [t, n_expert]
    /// Experts in the order of one row's probabilities.
    order: Vec<u32>,
    /// Rows that chose each expert, with their weights, grouped by expert.
    by_expert: Vec<Vec<(u32, f32)>>,
    xs: Vec<f32>, // [rows of one expert, n_embd] gathered inputs
    gx: Vec<f32>, // [rows of one expert, n_ff_exp]
    ys: Vec<f32>, // [rows of one expert, n_embd]
    acts: Acts,
    /// The allocations of the experts' lists of products (see `recycled!`).
    gated: Vec<GatedPart<'static>>,
    down: Vec<Part<'static>>,
}

impl MoeScratch {
    /// Softmax over the router's logits of each row, its top `n_used`
    /// (ties to the lower expert), their weights normalised to sum to one as
    /// llama.cpp's `build_moe_ffn` does (the sum clamped below at f16's
    /// smallest normal), then grouped by expert.
    fn route(&mut self, pool: &Pool, router: &Matrix, x: &[f32], t: usize, e: usize, m: &MoeConfig) {
        let ne = m.n_expert;
        self.logits.resize(t * ne, 0.0);
        self.acts.invalidate();
        matmul(pool, router, self.acts.get(pool, router.input, x, t, e), t, &mut self.logits);
        self.by_expert.resize_with(ne, Vec::new);
        self.by_expert.iter_mut().for_each(Vec::clear);
        let order = &mut self.order;
        order.clear();
        order.extend(0..ne as u32);
        for j in 0..t {
            let row = &mut self.logits[j * ne..(j + 1) * ne];
            let max = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
            let mut sum = 0.0f32;
            row.iter_mut().for_each(|v| {
                *v = (*v - max).exp();
                sum += *v;
            });
            row.iter_mut().for_each(|v| *v /= sum);
            order.sort_by(|&a, &b| row[b as usize].total_cmp(&row[a as usize]).then(a.cmp(&b)));
            let top = &order[..m.n_used];
            let total: f32 = top.iter().map(|&i| row[i as usize]).sum();
            let div = if m.norm_weights { total.max(6.103_515_6e-5) } else { 1.0 };
            for &i in top {
                let wgt = row[i as usize] / div * m.weights_scale;
                self.by_expert[i as usize].push((j as u32, wgt));
            }
        }
    }

    /// `out[j] = sum over the experts row j chose of weight * expert(x[j])`,
    /// each chosen expert run once over all the rows that chose it (as
    /// llama.cpp's `mul_mat_id`): its weights are read once per pass. All
    /// the chosen experts' gated products share one dispatch, and their down
    /// products another: two fork/joins a layer, not two an expert (on two
    /// cores the difference is within run-to-run noise; it grows with
    /// threads). Grouping rows by expert costs nothing at one column and
    /// pays from two on: no expert is read twice. The experts' outputs are
    /// added in expert order, so a row's result does not depend on the other
    /// rows of the pass.
    #[allow(clippy::too_many_arguments)]
    fn experts(
        &mut self,
        pool: &Pool,
        x: &Experts,
        act: FfnActivation,
        h: &[f32],
        t: usize,
        e: usize,
        out: &mut [f32],
    ) {
        out[..t * e].iter_mut().for_each(|v| *v = 0.0);
        let MoeScratch { by_expert, xs, gx, ys, acts, gated, down, .. } = self;
        // The chosen rows, grouped by expert, back to back.
        let total: usize = by_expert.iter().map(Vec::len).sum();
        if total == 0 {
            return;
        }
        let f = x.gate[0].rows;
        xs.resize(total * e, 0.0);
        gx.resize(total * f, 0.0);
        ys.resize(total * e, 0.0);
        let mut at = 0;
        for rows in by_expert.iter() {
            for &(j, _) in rows {
                xs[at * e..(at + 1) * e].copy_from_slice(&h[j as usize * e..(j as usize + 1) * e]);
                at += 1;
            }
        }
        // The experts of one tensor share a format: each input is quantized once for all.
        acts.invalidate();
        let [a_gate, a_up] = acts.get_many(pool, [x.gate[0].input, x.up[0].input], xs, total, e);
        let (gb, ub) = (a_gate.len() / total, a_up.len() / total);
        let mut parts: Vec<GatedPart<'_>> = recycled!(std::mem::take(gated));
        let mut rest: &mut [f32] = &mut gx[..];
        let mut at = 0;
        for (ei, rows) in by_expert.iter().enumerate().filter(|(_, r)| !r.is_empty()) {
            let n = rows.len();
            let (o, r) = std::mem::take(&mut rest).split_at_mut(n * f);
            rest = r;
            parts.push(GatedPart {
                gate: &x.gate[ei],
                gate_acts: &a_gate[at * gb..(at + n) * gb],
                up: &x.up[ei],
                up_acts: &a_up[at * ub..(at + n) * ub],
                t: n,
                out: o,
            });
            at += n;
        }
        matmul_gated_set(pool, &mut parts, activation(act));
        *gated = recycled!(parts);
        acts.invalidate();
        let a_down = acts.get(pool, x.down[0].input, gx, total, f);
        let db = a_down.len() / total;
        let mut parts: Vec<Part<'_>> = recycled!(std::mem::take(down));
        let mut rest: &mut [f32] = &mut ys[..];
        let mut at = 0;
        for (ei, rows) in by_expert.iter().enumerate().filter(|(_, r)| !r.is_empty()) {
            let n = rows.len();
            let (o, r) = std::mem::take(&mut rest).split_at_mut(n * e);
            rest = r;
            parts.push(Part { w: &x.down[ei], acts: &a_down[at * db..(at + n) * db], t: n, out: o });
            at += n;
        }
        matmul_set(pool, &mut parts);
        *down = recycled!(parts);
        let mut at = 0;
        for (ei, rows) in by_expert.iter().enumerate() {
            let s = x.down_scale.as_ref().map_or(1.0, |s| s[ei]);
            for &(j, wgt) in rows {
                let dst = &mut out[j as usize * e..(j as usize + 1) * e];
                dst.iter_mut().zip(&ys[at * e..(at + 1) * e]).for_each(|(o, y)| *o += y * s * wgt);
                at += 1;
            }
        }
    }
}

/// Each row of `q` holds per head its query, then its gate (qwen35's
/// `attn_q`): the gates go to `gates` and the queries close up in `q`.
fn split_query_gates(q: &mut [f32], gates: &mut [f32], t: usize, n_head: usize, hd: usize) {
    let qw = n_head * hd;
    for r in 0..t {
        for h in 0..n_head {
            let src = r * 2 * qw + h * 2 * hd;
            gates[r * qw + h * hd..r * qw + (h + 1) * hd].copy_from_slice(&q[src + hd..src + 2 * hd]);
        }
        // Forward, so every query moves before anything overwrites it.
        for h in 0..n_head {
            let src = r * 2 * qw + h * 2 * hd;
            q.copy_within(src..src + hd, r * qw + h * hd);
        }
    }
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

fn norm_rows(pool: &Pool, x: &[f32], w: &[f32], eps: f32, out: &mut [f32], width: usize, t: usize) {
    pool.rows_mut(&mut out[..t * width], width, |j, o| ops::rms_norm(&x[j * width..(j + 1) * width], w, eps, o));
}

/// `x += norm(o)` (or `x += o` without a post-norm).
fn residual_add(
    pool: &Pool,
    x: &mut [f32],
    o: &mut [f32],
    post_norm: Option<&[f32]>,
    eps: f32,
    width: usize,
    t: usize,
) {
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

#[cfg(test)]
mod tests {
    #[test]
    fn a_recycled_list_keeps_its_allocation() {
        let mut owned = [1.0f32; 4];
        let mut first: Vec<&mut [f32]> = Vec::with_capacity(8);
        first.push(&mut owned[..2]);
        let (ptr, cap) = (first.as_ptr() as usize, first.capacity());
        let mut again: Vec<&mut [f32]> = recycled!(first);
        assert!(again.is_empty());
        again.push(&mut owned[2..]);
        assert_eq!((again.as_ptr() as usize, again.capacity()), (ptr, cap));
    }
}
