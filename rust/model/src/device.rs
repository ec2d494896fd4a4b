//! The forward pass on a GPU (`ember-gpu`): every family's blocks, the
//! dense attention families' first, with every weight uploaded once in its file format
//! ([`Model::place_on`]), each conversation's keys and values in f16 rings
//! on the device beside a position ledger on the host (the session's
//! cache, [held elsewhere](ember_kv::KvCache::held_elsewhere)), several
//! conversations in one pass, and the logits read back. The CPU pass
//! (`forward.rs`) is its reference: the same family options in the same
//! order, the embedding rows and the rope angles still computed on the
//! host, where they cost a row per token.
//!
//! A mixture's router, expert products and their sum run on the device
//! too (`ember_gpu::DeviceExperts`): the choice of experts never comes back
//! to the host.
//!
//! Gemma 4's parts run there as well: values taken from the keys and
//! RMS-normed, layers reading an earlier layer's rings, the per-layer
//! inputs (their table's rows for the pass's tokens dequantized on the host,
//! as the embedding rows are) and the per-layer output scales.
//!
//! Qwen3.5's hybrids run there: the gated DeltaNet layers (their
//! convolution and rule token after token, each sequence's recurrent states
//! kept on the device from pass to pass and crossing only when one side
//! needs the other's: written before a pass when the host's have changed (a
//! restored checkpoint, a cleared slot), read back when a checkpoint or a
//! save reads them, so the host's cache serves both as on the CPU), gated
//! attention and the shared expert's gate.
//!
//! A model with a layer the device cannot run yet (heads or a convolution
//! wider than its kernels hold, a matrix type without a product) is refused
//! at upload, naming what is missing; the caller runs it on the CPU and
//! says why.

use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use ember_gpu::{
    Activation, AttentionShape, DeltaShape, DeviceBuffer, DeviceExperts, DeviceKvLayer, DeviceMatrix, Gpu, GpuError, KvFormat,
    Rotation, Routing, StackedMatrix,
};
use ember_gguf::GgmlType;
use ember_kv::{KvCache, KvType};

use crate::config::{DeltaLayer, FfnActivation, KvSource, LayerConfig};
use crate::error::{ModelError, Result};
use crate::forward::Logits;
use crate::weights::{DeltaNetWeights, Experts, Matrix, PerLayerEmbeddings};
use crate::Model;

fn device_error(e: GpuError) -> ModelError {
    ModelError::Device(e.to_string())
}

/// A conversation whose host states are stale, and whose rings do not hold
/// the newer ones: never made by a pass, refused rather than read.
fn states_held_elsewhere() -> ModelError {
    ModelError::Device("a conversation's recurrent states are held by other rings".into())
}

fn tensor_error(m: &Matrix, e: GpuError) -> ModelError {
    ModelError::Device(format!("tensor {}: {e}", m.name))
}

/// One attention block and its feed-forward block on the device: dense, a
/// mixture, or both side by side.
struct DeviceLayer {
    attn_norm: DeviceBuffer,
    /// None in a gated DeltaNet layer, which has `delta` instead.
    qkv: Option<Qkv>,
    /// Ones of a value head's width, where values are RMS-normed (gemma4).
    value_norm: Option<DeviceBuffer>,
    bq: Option<DeviceBuffer>,
    bk: Option<DeviceBuffer>,
    bv: Option<DeviceBuffer>,
    q_norm: Option<DeviceBuffer>,
    k_norm: Option<DeviceBuffer>,
    wo: Option<DeviceMatrix>,
    delta: Option<DeviceDelta>,
    post_attn_norm: Option<DeviceBuffer>,
    ffn_norm: DeviceBuffer,
    ffn: Option<DeviceFfn>,
    moe: Option<DeviceMoe>,
    /// Qwen3.5's mixtures: the dense block is a shared expert scaled by
    /// sigmoid(gate · h), a matrix of one row.
    shared_gate: Option<DeviceMatrix>,
    post_ffn_norm: Option<DeviceBuffer>,
    per_layer: Option<DevicePerLayer>,
    out_scale: Option<f32>,
}

/// A gated DeltaNet layer on the device (the CPU's `DeltaNetWeights`).
struct DeviceDelta {
    shape: DeltaLayer,
    qkv: DeviceMatrix,
    z: DeviceMatrix,
    beta: DeviceMatrix,
    alpha: DeviceMatrix,
    conv: DeviceBuffer,
    dt_bias: DeviceBuffer,
    a: DeviceBuffer,
    norm: DeviceBuffer,
    out: DeviceMatrix,
    /// Where this layer's state (convolution, then rule) starts in a
    /// sequence's states.
    state_at: usize,
}

/// gemma4's per-layer input of one layer (the CPU's `PerLayerInput`).
struct DevicePerLayer {
    gate: DeviceMatrix,
    proj: DeviceMatrix,
    post_norm: DeviceBuffer,
}

/// What mixes gemma4's per-layer token rows with the residual before the
/// first layer (the CPU's `PerLayerEmbeddings`, its table left on the host).
struct DevicePerLayerInputs {
    model_proj: DeviceMatrix,
    proj_norm: DeviceBuffer,
}

struct DeviceFfn {
    gate_up: GateUp,
    down: DeviceMatrix,
}

impl DeviceFfn {
    /// Rows of the gate (and up) projection.
    fn rows(&self) -> usize {
        match &self.gate_up {
            GateUp::Pair(pair) => pair.parts()[0],
            GateUp::Apart { gate, .. } => gate.rows,
        }
    }
}

/// An attention layer's query, key and value projections.
enum Qkv {
    /// The three stacked (one type and width, one binding): one kernel
    /// takes the three products.
    Stacked(StackedMatrix),
    Apart {
        wq: DeviceMatrix,
        /// None where the layer reads an earlier layer's rings (gemma4).
        wk: Option<DeviceMatrix>,
        /// None where the values are the keys before their norm (gemma4).
        wv: Option<DeviceMatrix>,
    },
}

/// A gated feed-forward's gate and up projections: held as one where they
/// share a type and fit one binding (one kernel takes both products and the
/// activation), else apart.
enum GateUp {
    Pair(StackedMatrix),
    Apart { gate: DeviceMatrix, up: DeviceMatrix },
}

/// A mixture's weights on the device (the CPU's [`Experts`]).
struct DeviceMoe {
    router: DeviceMatrix,
    gate: DeviceExperts,
    up: DeviceExperts,
    down: DeviceExperts,
    /// Each expert's output scale (ones where the file gives none).
    down_scale: DeviceBuffer,
    /// gemma4, beside a dense block: the router reads the residual normed
    /// with this weight (its scale over sqrt(n_embd), folded in at upload),
    /// the experts read it normed by `pre_norm`, the dense output is normed
    /// by `post_norm_dense` and the mixture's by `post_norm`.
    beside_dense: Option<BesideDense>,
}

struct BesideDense {
    router_norm: DeviceBuffer,
    pre_norm: DeviceBuffer,
    post_norm_dense: Option<DeviceBuffer>,
    post_norm: DeviceBuffer,
}

/// A model's weights on a device ([`Model::place_on`]), and the working
/// buffers of its passes.
pub struct DeviceWeights {
    gpu: Arc<Gpu>,
    layers: Vec<DeviceLayer>,
    per_layer_inputs: Option<DevicePerLayerInputs>,
    output_norm: DeviceBuffer,
    output: DeviceMatrix,
    bytes: u64,
    /// One set of working buffers for every session, sized for the widest
    /// pass yet, as the CPU's [`Workspace`](crate::Workspace): the device
    /// runs one pass at a time.
    work: Mutex<Option<Work>>,
    logits_read: AtomicU64,
    kernels: AtomicU64,
    states_written: AtomicU64,
    states_read: AtomicU64,
}

/// The most of a row's largest logits read back in place of the row: past
/// it, the kernel's rounds (one read of the row each) cost more than the
/// row's transfer saves.
const MAX_TOP: usize = 256;

/// What the head reads of one sequence's rows.
#[derive(Clone, Copy)]
enum Head {
    /// The last row's `k` largest logits.
    Top(usize),
    Logits,
    /// Normed rows, not put through the head.
    Hidden,
}

impl Head {
    fn order(self) -> u8 {
        match self {
            Head::Top(_) => 0,
            Head::Logits => 1,
            Head::Hidden => 2,
        }
    }
}

/// Where one sequence's answer lies among a pass's read values.
enum Answer {
    Nothing,
    /// Whole rows (of logits, or normed), in order.
    Rows { values: Vec<std::ops::Range<usize>>, logits: bool },
    /// (token, value bits) pairs, the largest first.
    Top(std::ops::Range<usize>),
}

impl Answer {
    /// Adds the next of its rows, `logits` or normed ones.
    fn add_rows(&mut self, more: std::ops::Range<usize>, logits: bool) {
        match self {
            Answer::Rows { values, .. } => values.push(more),
            _ => *self = Answer::Rows { values: vec![more], logits },
        }
    }
}

/// One sequence's part of a device pass ([`DeviceWeights::pass`]).
pub(crate) struct DeviceSeq<'a> {
    /// Its positions, and (a hybrid's) recurrent states, which the pass
    /// carries forward.
    pub cache: &'a mut KvCache,
    pub rings: &'a DeviceRings,
    pub tokens: &'a [u32],
    pub want: Logits,
    pub out: &'a mut Vec<f32>,
}

/// One conversation's keys and values on the device: a ring per layer of
/// the cache (a layer that reads an earlier layer's has none of its own),
/// its rows where the session's position ledger (a cache
/// [held elsewhere](ember_kv::KvCache::held_elsewhere)) puts them.
pub struct DeviceRings {
    layers: Vec<DeviceKvLayer>,
    /// A hybrid's recurrent states, every layer's in the cache's order, as
    /// the conversation's last pass left them.
    states: Option<DeviceBuffer>,
    /// The stamp ([`KvCache::states_stamp`]) of the states `states` holds
    /// (0: unknown, or none yet): the host's when a pass wrote them, the
    /// one a pass gave the states it carried forward otherwise. A pass
    /// writes the host's only when their stamp differs (a restored
    /// checkpoint, a cleared slot).
    states_synced: AtomicU64,
}

/// How a device's rings keep a cache of type `kv`; None where a device keeps
/// no such cache (f32 and bf16 caches are the CPU's only).
pub fn device_kv_format(kv: KvType) -> Option<KvFormat> {
    match kv {
        KvType::F16 => Some(KvFormat::F16),
        KvType::Q8_0 => Some(KvFormat::Q8_0),
        KvType::F32 | KvType::BF16 => None,
    }
}

/// Why a model's layers cannot all run on the device, or None when they can.
pub fn device_refusal(model: &Model) -> Option<String> {
    let c = &model.config;
    let w = model.weights();
    for (il, (l, lc)) in w.layers.iter().zip(&c.layers).enumerate() {
        let why = if let Some(d) = lc.delta {
            if d.net.head_dim > ember_gpu::MAX_DELTA_HEAD_DIM || d.d_conv > ember_gpu::MAX_CONV || d.d_conv < 2 {
                "its DeltaNet heads or convolution are wider than the device's kernels hold"
            } else {
                continue;
            }
        } else if matches!(lc.kv, KvSource::Own(_)) != l.wk.is_some() || (l.wv.is_none() && lc.k_width() != lc.v_width())
            || (l.ffn.is_none() && l.experts.is_none())
        {
            "this layer's shape has no device kernels yet"
        } else if lc.head_dim_k.max(lc.head_dim_v) > ember_gpu::MAX_HEAD_DIM
            || lc.k_width() % 2 != 0
            || lc.v_width() % 2 != 0
        {
            "its heads are wider or odder than the device's attention holds"
        } else {
            continue;
        };
        return Some(format!("layer {il}: {why}"));
    }
    let matrices = w.layers.iter().flat_map(|l| {
        let f = l.ffn.as_ref();
        let x = l.experts.as_ref();
        let pl = l.per_layer.as_ref();
        // One expert of each tensor stands for all: they share a type.
        let dn = l.delta.as_ref();
        [
            dn.map(|d| &d.qkv),
            dn.map(|d| &d.z),
            dn.map(|d| &d.beta),
            dn.map(|d| &d.alpha),
            dn.map(|d| &d.out),
            l.wq.as_ref(),
            l.wk.as_ref(),
            l.wv.as_ref(),
            l.wo.as_ref(),
            f.map(|f| &f.gate),
            f.map(|f| &f.up),
            f.map(|f| &f.down),
            x.map(|x| &x.router),
            x.map(|x| &x.gate[0]),
            x.map(|x| &x.up[0]),
            x.map(|x| &x.down[0]),
            pl.map(|p| &p.gate),
            pl.map(|p| &p.proj),
        ]
    });
    let model_proj = w.per_layer.as_ref().map(|pe| &pe.model_proj);
    without_kernel(matrices.flatten().chain(model_proj).chain([w.output()]))
}

/// The first matrix whose type has no device product, said as a refusal.
fn without_kernel<'a>(mut matrices: impl Iterator<Item = &'a Matrix>) -> Option<String> {
    let m = matrices.find(|m| !ember_gpu::matmul_supports(m.ty))?;
    Some(format!("tensor {}: type {} has no device kernel yet", m.name, m.ty.name()))
}

impl Model {
    /// Uploads every layer and the output head to `gpu`: from here on every
    /// session of this model holds its keys and values there and every pass
    /// runs there. Refused (the model as it was) when a layer or a matrix
    /// type has no device kernel yet, or the device cannot hold it.
    pub fn place_on(&mut self, gpu: Arc<Gpu>) -> Result<()> {
        if self.device.is_some() {
            return Err(ModelError::Invalid("the model is already placed on a device".into()));
        }
        self.device = Some(DeviceWeights::upload(self, gpu)?);
        Ok(())
    }

    /// The device the model runs on, once placed there.
    pub fn placement(&self) -> Option<&DeviceWeights> {
        self.device.as_ref()
    }
}

impl DeviceWeights {
    fn upload(model: &Model, gpu: Arc<Gpu>) -> Result<DeviceWeights> {
        if let Some(why) = device_refusal(model) {
            return Err(ModelError::Device(format!("the model cannot run on {}: {why}", gpu.info().name)));
        }
        let (mut bytes, mut stacked_bytes) = (0u64, 0u64);
        let mut matrix = |m: &Matrix| -> Result<DeviceMatrix> {
            let d = gpu.upload_matrix(&m.name, m.ty, m.rows, m.cols, m.bytes()).map_err(|e| tensor_error(m, e))?;
            bytes += d.bytes();
            Ok(d)
        };
        let w = model.weights();
        let mut layers = Vec::with_capacity(w.layers.len());
        for (l, lc) in w.layers.iter().zip(&model.config.layers) {
            let ffn = match &l.ffn {
                Some(f) => {
                    let pair = if (f.gate.ty, f.gate.rows, f.gate.cols) == (f.up.ty, f.up.rows, f.up.cols) {
                        let parts = [(f.gate.rows, f.gate.bytes()), (f.up.rows, f.up.bytes())];
                        gpu.upload_stacked(&f.gate.name, f.gate.ty, f.gate.cols, &parts).map_err(|e| tensor_error(&f.gate, e))?
                    } else {
                        None
                    };
                    let gate_up = match pair {
                        Some(pair) => {
                            stacked_bytes += pair.bytes();
                            GateUp::Pair(pair)
                        }
                        None => GateUp::Apart { gate: matrix(&f.gate)?, up: matrix(&f.up)? },
                    };
                    Some(DeviceFfn { gate_up, down: matrix(&f.down)? })
                }
                None => None,
            };
            let moe = l.experts.as_ref().map(|x| DeviceMoe::upload(&gpu, model, x, l.ffn.is_some() && l.shared_gate.is_none())).transpose()?;
            let per_layer = match &l.per_layer {
                Some(p) => Some(DevicePerLayer {
                    gate: matrix(&p.gate)?,
                    proj: matrix(&p.proj)?,
                    post_norm: vector(&gpu, &p.post_norm)?,
                }),
                None => None,
            };
            let value_norm =
                if model.config.opts.value_norm { Some(vector(&gpu, &vec![1.0; lc.head_dim_v])?) } else { None };
            let delta = match (&l.delta, lc.delta, lc.kv) {
                (Some(dw), Some(shape), KvSource::Recurrent(si)) => {
                    let state_at = model.config.state_lens()[..si].iter().sum();
                    Some(DeviceDelta::upload(&gpu, &mut matrix, dw, shape, state_at)?)
                }
                _ => None,
            };
            let shared_gate = match &l.shared_gate {
                Some(g) => {
                    let bytes: Vec<u8> = g.iter().flat_map(|v| v.to_le_bytes()).collect();
                    Some(gpu.upload_matrix("ffn_gate_inp_shexp", GgmlType::F32, 1, g.len(), &bytes).map_err(device_error)?)
                }
                None => None,
            };
            layers.push(DeviceLayer {
                attn_norm: vector(&gpu, &l.attn_norm)?,
                qkv: match (&l.wq, &l.wk, &l.wv) {
                    (Some(q), Some(k), Some(v)) if [k, v].iter().all(|m| (m.ty, m.cols) == (q.ty, q.cols)) => {
                        let parts = [q, k, v].map(|m| (m.rows, m.bytes()));
                        match gpu.upload_stacked(&q.name, q.ty, q.cols, &parts).map_err(|e| tensor_error(q, e))? {
                            Some(m) => {
                                stacked_bytes += m.bytes();
                                Some(Qkv::Stacked(m))
                            }
                            None => Some(Qkv::Apart { wq: matrix(q)?, wk: Some(matrix(k)?), wv: Some(matrix(v)?) }),
                        }
                    }
                    (Some(q), k, v) => Some(Qkv::Apart {
                        wq: matrix(q)?,
                        wk: k.as_ref().map(&mut matrix).transpose()?,
                        wv: v.as_ref().map(&mut matrix).transpose()?,
                    }),
                    (None, ..) => None,
                },
                value_norm,
                bq: optional(&gpu, &l.bq)?,
                bk: optional(&gpu, &l.bk)?,
                bv: optional(&gpu, &l.bv)?,
                q_norm: optional(&gpu, &l.q_norm)?,
                k_norm: optional(&gpu, &l.k_norm)?,
                wo: l.wo.as_ref().map(&mut matrix).transpose()?,
                delta,
                post_attn_norm: optional(&gpu, &l.post_attn_norm)?,
                ffn_norm: vector(&gpu, &l.ffn_norm)?,
                ffn,
                moe,
                shared_gate,
                post_ffn_norm: optional(&gpu, &l.post_ffn_norm)?,
                per_layer,
                out_scale: l.out_scale,
            });
        }
        let per_layer_inputs = match &w.per_layer {
            Some(pe) => Some(DevicePerLayerInputs { model_proj: matrix(&pe.model_proj)?, proj_norm: vector(&gpu, &pe.proj_norm)? }),
            None => None,
        };
        let output_norm = vector(&gpu, &w.output_norm)?;
        let output = matrix(w.output())?;
        bytes += stacked_bytes + layers.iter().filter_map(|l| l.moe.as_ref()).map(DeviceMoe::bytes).sum::<u64>();
        Ok(DeviceWeights {
            gpu,
            layers,
            per_layer_inputs,
            output_norm,
            output,
            bytes,
            work: Mutex::new(None),
            logits_read: AtomicU64::new(0),
            kernels: AtomicU64::new(0),
            states_written: AtomicU64::new(0),
            states_read: AtomicU64::new(0),
        })
    }

    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// Bytes of weights on the device.
    pub fn weight_bytes(&self) -> u64 {
        self.bytes
    }

    /// Bytes of the working buffers on the device (the widest pass's so far).
    pub fn work_bytes(&self) -> u64 {
        self.work.lock().unwrap_or_else(|e| e.into_inner()).as_ref().map_or(0, |w| w.bytes)
    }

    /// The rings of a conversation whose positions `cache` keeps: one per
    /// layer of the cache, as many rows as the ledger's layer has, in the
    /// cache's type.
    pub(crate) fn rings(&self, model: &Model, cache: &KvCache) -> Result<DeviceRings> {
        let format = device_kv_format(cache.kv_type()).ok_or_else(|| {
            ModelError::Invalid(format!(
                "the model is on {}, whose cache is f16 or q8_0; a cache of type {} is held on the CPU only",
                self.gpu.info().name,
                cache.kv_type().name()
            ))
        })?;
        let own = model.config.layers.iter().filter_map(|lc| match lc.kv {
            KvSource::Own(ci) => Some((ci, lc)),
            _ => None,
        });
        let mut layers = Vec::new();
        for (ci, lc) in own {
            debug_assert_eq!(ci, layers.len(), "cache layers are numbered in layer order");
            layers.push(self.gpu.kv_layer(cache.layer_rows(ci), lc.k_width(), lc.v_width(), format).map_err(device_error)?);
        }
        let floats: usize = model.config.state_lens().iter().sum();
        let states = if floats > 0 { Some(self.gpu.zeros("recurrent states", floats).map_err(device_error)?) } else { None };
        Ok(DeviceRings { layers, states, states_synced: AtomicU64::new(0) })
    }

    /// `cache`'s state ([`KvCache::save_state`]'s format), its rows read
    /// back from `rings`.
    pub(crate) fn save_state(&self, cache: &KvCache, rings: &DeviceRings) -> Result<Vec<u8>> {
        // States the device holds are saved from a copy of the ledger (no
        // rows: those stay on the device) that takes them back.
        let cache = if cache.states_elsewhere() {
            let mut copy = cache.clone();
            self.take_states_back(&mut copy, rings)?;
            Cow::Owned(copy)
        } else {
            Cow::Borrowed(cache)
        };
        cache
            .save_state_with(|il, used| {
                let (k, v) = self.gpu.read_kv(&rings.layers[il], used)?;
                Ok((Cow::Owned(k), Cow::Owned(v)))
            })
            .map_err(device_error)
    }

    /// Reads back the recurrent states a conversation's passes left on the
    /// device, where the host's cache holds older ones: before a checkpoint
    /// or a save reads them.
    pub(crate) fn take_states_back(&self, cache: &mut KvCache, rings: &DeviceRings) -> Result<()> {
        let Some(states) = rings.states.as_ref().filter(|_| cache.states_elsewhere()) else {
            return Ok(());
        };
        if rings.states_synced.load(Ordering::Relaxed) != cache.states_stamp() {
            return Err(states_held_elsewhere());
        }
        let back = self.gpu.read(states).map_err(device_error)?;
        self.states_read.fetch_add(back.len() as u64, Ordering::Relaxed);
        cache.states_back(&back);
        Ok(())
    }

    /// Restores a state of `cache`'s shape, its rows written to `rings`.
    pub(crate) fn restore_state(&self, cache: &mut KvCache, rings: &DeviceRings, state: &[u8]) -> Result<()> {
        cache.restore_state_with(state, |il, k, v| self.gpu.write_kv(&rings.layers[il], k, v).map_err(|e| e.to_string()))?;
        Ok(())
    }

    /// Working buffers for passes of up to `rows` tokens, made (or remade
    /// wider) on first need.
    fn work_for<'w>(&self, model: &Model, slot: &'w mut Option<Work>, rows: usize) -> Result<&'w mut Work> {
        if slot.as_ref().is_none_or(|w| w.rows < rows) {
            // The old set first, so the device never holds both.
            *slot = None;
            *slot = Some(Work::new(&self.gpu, model, self, rows)?);
        }
        Ok(slot.as_mut().expect("made above"))
    }

    /// One pass over `seqs`, each appending its tokens after the positions
    /// its ledger holds, its keys and values in its rings: their rows go
    /// through every matrix together (one read of the weights for all), a
    /// row's arithmetic the same whatever rows are beside it, and attention
    /// runs per sequence over its own rings. Each gets the rows its `want`
    /// asks for in `out` (logits `n_vocab` a row, or the normed hidden states
    /// `n_embd` a row). The caller has checked each part fits, and commits
    /// their positions.
    ///
    /// A hybrid's recurrent states stay on the device after the pass, the
    /// host's cache marked as holding older ones
    /// ([`KvCache::states_moved_elsewhere`]) until the host needs them
    /// ([`take_states_back`](Self::take_states_back)). A pass that fails
    /// once it has begun to run leaves the device's states unknown: a
    /// conversation whose only current states were there is cleared (as
    /// the batcher drops a failed pass's slots), one whose host holds them
    /// has them written again by its next pass.
    pub(crate) fn pass(&self, model: &Model, seqs: &mut [DeviceSeq<'_>]) -> Result<()> {
        let ran = self.run_pass(model, seqs);
        for q in seqs.iter_mut().filter(|q| q.rings.states.is_some()) {
            match ran {
                Ok(()) => q.rings.states_synced.store(q.cache.states_moved_elsewhere(), Ordering::Relaxed),
                Err(_) if q.rings.states_synced.load(Ordering::Relaxed) == 0 && q.cache.states_elsewhere() => q.cache.clear(),
                Err(_) => {}
            }
        }
        ran
    }

    fn run_pass(&self, model: &Model, seqs: &mut [DeviceSeq<'_>]) -> Result<()> {
        let c = &model.config;
        let w = model.weights();
        let t: usize = seqs.iter().map(|q| q.tokens.len()).sum();
        let mut held = self.work.lock().unwrap_or_else(|e| e.into_inner());
        let s = self.work_for(model, &mut held, t)?;
        let g = &*self.gpu;
        let e = c.n_embd;

        // The embedding rows and the rope angles, on the host.
        let scale = if c.opts.embed_scale { (e as f32).sqrt() } else { 1.0 };
        let host = &mut s.host;
        host.x.resize(t * e, 0.0);
        for (row, &id) in host.x.chunks_mut(e).zip(seqs.iter().flat_map(|q| q.tokens)) {
            ember_quant::dequantize_row(w.token_embd.ty, w.token_embd.row(id as usize), row)
                .expect("embedding row bound at load");
            if scale != 1.0 {
                row.iter_mut().for_each(|v| *v *= scale);
            }
        }
        g.write(&s.x, &host.x).map_err(device_error)?;
        if let (Some(pe), Some(pl)) = (&w.per_layer, &s.per_layer) {
            per_layer_token_rows(model, pe, seqs, &mut host.per_layer);
            g.write(&pl.tok, &host.per_layer).map_err(device_error)?;
        }
        for (variant, table) in model.rope_tables.iter().enumerate() {
            let half = table.half();
            host.cos.resize(t * half, 0.0);
            host.sin.resize(t * half, 0.0);
            let rows = seqs.iter().flat_map(|q| (0..q.tokens.len()).map(|j| (q.cache.len() + j, q.cache.n_ctx())));
            for (j, (pos, n_ctx)) in rows.enumerate() {
                let at = j * half..(j + 1) * half;
                table.angles(pos, n_ctx, &mut host.cos[at.clone()], &mut host.sin[at]);
            }
            g.write(&s.cos[variant], &host.cos).map_err(device_error)?;
            g.write(&s.sin[variant], &host.sin).map_err(device_error)?;
        }

        for q in seqs.iter() {
            if let Some(states) = &q.rings.states {
                if q.rings.states_synced.load(Ordering::Relaxed) != q.cache.states_stamp() {
                    if q.cache.states_elsewhere() {
                        return Err(states_held_elsewhere());
                    }
                    host.states.clear();
                    q.cache.copy_states_into(&mut host.states);
                    g.write(states, &host.states).map_err(device_error)?;
                    self.states_written.fetch_add(host.states.len() as u64, Ordering::Relaxed);
                }
            }
        }
        let mut p = g.pass();
        if let (Some(pi), Some(pl)) = (&self.per_layer_inputs, &s.per_layer) {
            self.per_layer_inputs(model, &mut p, pi, pl, s, t).map_err(device_error)?;
        }
        for (il, (l, lc)) in self.layers.iter().zip(&c.layers).enumerate() {
            match &l.delta {
                Some(d) => self.delta_block(model, &mut p, l, d, seqs, s, t),
                None => self.attention_block(model, &mut p, l, lc, seqs, s, t),
            }
            .map_err(device_error)?;
            self.ffn_block(model, &mut p, l, s, t).map_err(device_error)?;
            if let (Some(d), Some(pl)) = (&l.per_layer, &s.per_layer) {
                self.per_layer_block(model, &mut p, d, il, pl, s, t).map_err(device_error)?;
            }
            if let Some(scale) = l.out_scale {
                p.scale(&s.x, scale, t * c.n_embd).map_err(device_error)?;
            }
        }
        let answers = self.record_heads(model, &mut p, s, seqs).map_err(device_error)?;
        // From here the device's states are neither those the host's stamp
        // names nor, until the pass has run, the ones it carries forward.
        seqs.iter().for_each(|q| q.rings.states_synced.store(0, Ordering::Relaxed));
        let (kernels, read) = p.submit_and_read().map_err(device_error)?;
        self.count_kernels(kernels);
        for (q, answer) in seqs.iter_mut().zip(answers) {
            self.answer(model, answer, &read, q.out);
        }
        Ok(())
    }

    /// Records, after the layers, what each sequence's `want` asks of the
    /// head: the output norm over the rows it reads (its last, or all of
    /// them), the output head over those that want logits (as many rows at
    /// a time as the logits buffer holds), the top of the rows a draw
    /// reads only the top of, and the reads of it all. So a step's
    /// sequences are answered by one submit and one wait, however many
    /// there are.
    fn record_heads(&self, model: &Model, p: &mut ember_gpu::Pass<'_>, s: &Work, seqs: &[DeviceSeq<'_>]) -> ember_gpu::Result<Vec<Answer>> {
        let c = &model.config;
        let (e, n_vocab) = (c.n_embd, c.n_vocab);
        // Each sequence's rows of the pass that the head reads, ordered as
        // they are normed: the tops first (so that one top kernel covers
        // them), then whole rows of logits, then normed states.
        let mut heads: Vec<(usize, std::ops::Range<usize>, Head)> = Vec::new();
        let mut r0 = 0;
        for (i, q) in seqs.iter().enumerate() {
            let n = q.tokens.len();
            let last = r0 + n - 1..r0 + n;
            match q.want {
                Logits::None => {}
                Logits::Top(k) if k < n_vocab && k <= MAX_TOP => heads.push((i, last, Head::Top(k))),
                Logits::Last | Logits::Top(_) => heads.push((i, last, Head::Logits)),
                Logits::All => heads.push((i, r0..r0 + n, Head::Logits)),
                Logits::Hidden => heads.push((i, r0..r0 + n, Head::Hidden)),
            }
            r0 += n;
        }
        heads.sort_by_key(|h| h.2.order());
        let mut answers: Vec<Answer> = seqs.iter().map(|_| Answer::Nothing).collect();
        let normed: usize = heads.iter().map(|h| h.1.len()).sum();
        if normed == 0 {
            return Ok(answers);
        }
        // Rows already where they would be gathered (a lone conversation's
        // decoded token, a step of decoded tokens each wanting its row) are
        // normed in place; others are gathered first.
        let mut at = 0;
        let in_place = heads.iter().all(|h| std::mem::replace(&mut at, h.1.end) == h.1.start);
        let rows = if in_place {
            &s.x
        } else {
            let mut at = 0;
            for h in &heads {
                p.copy(&s.x, h.1.start * e, &s.o, at * e, h.1.len() * e)?;
                at += h.1.len();
            }
            &s.o
        };
        p.rms_norm(rows, &self.output_norm, &s.h, normed, c.rms_eps)?;

        let tops = heads.iter().filter(|h| matches!(h.2, Head::Top(_))).count();
        let widest_top = heads.iter().filter_map(|h| if let Head::Top(k) = h.2 { Some(k) } else { None }).max().unwrap_or(0);
        let with_logits: usize = heads.iter().filter(|h| !matches!(h.2, Head::Hidden)).map(|h| h.1.len()).sum();
        let mut read = 0;
        let mut read_back = |p: &mut ember_gpu::Pass<'_>, from: &DeviceBuffer, at: usize, n: usize| {
            p.read_back(from, at, n).map(|()| {
                read += n;
                read - n..read
            })
        };
        for first in (0..with_logits).step_by(s.logit_rows) {
            let n = s.logit_rows.min(with_logits - first);
            let input = if first == 0 {
                &s.h
            } else {
                p.copy(&s.h, first * e, &s.o, 0, n * e)?;
                &s.o
            };
            p.matmul(&self.output, input, n, &s.logits)?;
            let tops_here = tops.saturating_sub(first).min(n);
            if tops_here > 0 {
                p.top_k(&s.logits, n_vocab, tops_here, widest_top, &s.top)?;
            }
            let mut at = 0;
            for (i, rows, head) in &heads {
                let (from, to) = (at.max(first), (at + rows.len()).min(first + n));
                at += rows.len();
                if from >= to {
                    continue;
                }
                match head {
                    Head::Top(k) => {
                        answers[*i] = Answer::Top(read_back(p, &s.top, (from - first) * widest_top * 2, k * 2)?);
                    }
                    Head::Logits => {
                        let got = read_back(p, &s.logits, (from - first) * n_vocab, (to - from) * n_vocab)?;
                        answers[*i].add_rows(got, true);
                    }
                    Head::Hidden => {}
                }
            }
        }
        let mut at = 0;
        for (i, rows, head) in &heads {
            if let Head::Hidden = head {
                answers[*i].add_rows(read_back(p, &s.h, at * e, rows.len() * e)?, false);
            }
            at += rows.len();
        }
        Ok(answers)
    }

    /// Fills a sequence's `out` with what the pass read for it.
    fn answer(&self, model: &Model, answer: Answer, read: &[f32], out: &mut Vec<f32>) {
        out.clear();
        match answer {
            Answer::Nothing => {}
            Answer::Rows { values, logits } => {
                values.into_iter().for_each(|r| out.extend_from_slice(&read[r]));
                if logits {
                    self.logits_read.fetch_add(out.len() as u64, Ordering::Relaxed);
                    if model.config.logit_softcap.is_some() {
                        out.iter_mut().for_each(|v| *v = soft_capped(model, *v));
                    }
                }
            }
            Answer::Top(at) => {
                self.logits_read.fetch_add(at.len() as u64 / 2, Ordering::Relaxed);
                out.resize(model.config.n_vocab, f32::NEG_INFINITY);
                for pair in read[at].chunks_exact(2) {
                    // A row with NaNs may leave places unfilled (id past the vocabulary).
                    if let Some(slot) = out.get_mut(pair[0].to_bits() as usize) {
                        *slot = soft_capped(model, pair[1]);
                    }
                }
            }
        }
    }

    /// Floats of recurrent states written to the device so far.
    pub fn states_written(&self) -> u64 {
        self.states_written.load(Ordering::Relaxed)
    }

    /// Floats of recurrent states read back from the device so far.
    pub fn states_read(&self) -> u64 {
        self.states_read.load(Ordering::Relaxed)
    }

    /// Kernels the device has run for the passes so far.
    pub fn kernels(&self) -> u64 {
        self.kernels.load(Ordering::Relaxed)
    }

    fn count_kernels(&self, n: usize) {
        self.kernels.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Logit values read back from the device so far: a whole row's
    /// `n_vocab` each, or `k` where a draw needs only the top `k`.
    pub fn logits_read(&self) -> u64 {
        self.logits_read.load(Ordering::Relaxed)
    }

    /// x += post_norm(wo · attention(rope(norm(q)), cache)), the block's
    /// keys and values stored first.
    #[allow(clippy::too_many_arguments)]
    fn attention_block(
        &self,
        model: &Model,
        p: &mut ember_gpu::Pass<'_>,
        l: &DeviceLayer,
        lc: &LayerConfig,
        seqs: &[DeviceSeq<'_>],
        s: &Work,
        t: usize,
    ) -> ember_gpu::Result<()> {
        let c = &model.config;
        let (e, eps) = (c.n_embd, c.rms_eps);
        let (hk, qw, kw, vw) = (lc.head_dim_k, lc.q_width(), lc.k_width(), lc.v_width());
        p.rms_norm(&s.x, &l.attn_norm, &s.h, t, eps)?;
        // Each head's query, then its gate (qwen35), split apart below.
        let queries = if lc.attn_gate { &s.q_raw } else { &s.q };
        let own_keys = match l.qkv.as_ref().expect("an attention layer has queries") {
            Qkv::Stacked(m) => {
                p.matmul_split(m, &s.h, t, [queries, &s.k, &s.v])?;
                true
            }
            Qkv::Apart { wq, wk, wv } => {
                p.matmul(wq, &s.h, t, queries)?;
                if let Some(wk) = wk {
                    p.matmul(wk, &s.h, t, &s.k)?;
                    match wv {
                        Some(wv) => p.matmul(wv, &s.h, t, &s.v)?,
                        // Values are the keys before their norm (gemma4's attention_k_eq_v).
                        None => p.copy(&s.k, 0, &s.v, 0, t * vw)?,
                    }
                }
                wk.is_some()
            }
        };
        if lc.attn_gate {
            p.split_gates(&s.q_raw, &s.q, &s.gates, t * lc.n_head, hk)?;
        }
        for (buf, bias, width) in [(&s.q, &l.bq, qw), (&s.k, &l.bk, kw), (&s.v, &l.bv, vw)] {
            if let Some(b) = bias {
                p.add_to(buf, b, t * width)?;
            }
        }
        let rope = &c.ropes[lc.rope];
        let halves = matches!(c.opts.rope, crate::config::RopeStyle::Halves);
        let (cos, sin) = (&s.cos[lc.rope], &s.sin[lc.rope]);
        // Each head normed (qwen3, gemma) into its own buffer, then rotated in place.
        let q = normed_heads(p, &s.q, &s.qn, l.q_norm.as_ref(), t * lc.n_head, eps)?;
        let rotation = Rotation { head_dim: hk, half: rope.n_rot / 2, halves };
        // A layer with keys of its own rotates them and stores them with its
        // values, each sequence's with its queries' rotation (one kernel); one
        // that reads an earlier layer's rings finds its positions there
        // already, and only rotates its queries.
        let own = if own_keys {
            let k = normed_heads(p, &s.k, &s.kn, l.k_norm.as_ref(), t * lc.n_head_kv, eps)?;
            let v = normed_heads(p, &s.v, &s.vn, l.value_norm.as_ref(), t * lc.n_head_kv, eps)?;
            Some((k, v))
        } else {
            p.rope(q, cos, sin, t, lc.n_head, hk, rotation.half, halves)?;
            None
        };
        let wo = l.wo.as_ref().expect("an attention layer has an output");
        let ci = lc.kv.cache_layer();
        let mut row0 = 0;
        for seq in seqs {
            let (kv, n, start) = (&seq.rings.layers[ci], seq.tokens.len(), seq.cache.len());
            if let Some((k, v)) = own {
                p.rope_and_store(kv, q, lc.n_head, k, v, cos, sin, rotation, row0, n, start)?;
            }
            let shape = AttentionShape {
                t: n,
                start,
                row0,
                n_head: lc.n_head,
                n_head_kv: lc.n_head_kv,
                head_dim_k: hk,
                head_dim_v: lc.head_dim_v,
                scale: lc.attn_scale,
                window: lc.window,
            };
            match lc.attn_gate {
                false => p.attention_laid_out(&shape, q, kv, &s.att, p.inputs_block(wo, t))?,
                // The gate reads the outputs as they are.
                true => p.attention(&shape, q, kv, &s.att)?,
            }
            row0 += n;
        }
        if lc.attn_gate {
            p.gated(Activation::Sigmoid, &s.gates, &s.att, &s.att_gated, t * lc.att_width())?;
            p.matmul(wo, &s.att_gated, t, &s.o)?;
        } else {
            // Each sequence's rows were written laid out for this product.
            p.inputs_laid_out(&s.att, t, wo.cols, p.inputs_block(wo, t));
            p.matmul(wo, &s.att, t, &s.o)?;
        }
        residual(p, &s.x, &s.o, &s.h, l.post_attn_norm.as_ref(), eps, e, t)
    }

    /// x += post_norm(out(gated_norm(rule(conv(qkv · norm(x)))))): a gated
    /// DeltaNet layer (the CPU's `delta_block`), the projections over every
    /// sequence's rows at once, the convolution and the rule per sequence
    /// over its own states.
    #[allow(clippy::too_many_arguments)]
    fn delta_block(
        &self,
        model: &Model,
        p: &mut ember_gpu::Pass<'_>,
        l: &DeviceLayer,
        d: &DeviceDelta,
        seqs: &[DeviceSeq<'_>],
        s: &Work,
        t: usize,
    ) -> ember_gpu::Result<()> {
        let c = &model.config;
        let (e, eps) = (c.n_embd, c.rms_eps);
        let dl = d.shape;
        let (cd, vd, kd, nv, hd) = (dl.conv_dim(), dl.value_dim(), dl.key_dim(), dl.net.n_v_heads, dl.net.head_dim);
        let dn = s.delta.as_ref().expect("a hybrid's working buffers");
        p.rms_norm(&s.x, &l.attn_norm, &s.h, t, eps)?;
        p.matmul(&d.qkv, &s.h, t, &dn.mixed)?;
        p.matmul(&d.z, &s.h, t, &dn.z)?;
        p.matmul(&d.beta, &s.h, t, &dn.beta)?;
        p.matmul(&d.alpha, &s.h, t, &dn.gate)?;
        p.delta_gates(&dn.beta, &dn.gate, &d.dt_bias, &d.a, t * nv)?;
        let mut row0 = 0;
        for q in seqs {
            let states = q.rings.states.as_ref().expect("a hybrid's sequence has states");
            p.delta_conv(&dn.mixed, &d.conv, states, d.state_at, &dn.conv, row0, q.tokens.len(), cd, dl.d_conv)?;
            row0 += q.tokens.len();
        }
        p.l2_norm_heads(&dn.conv, t, 2 * kd / hd, hd, cd, eps)?;
        let mut row0 = 0;
        for q in seqs {
            let states = q.rings.states.as_ref().expect("a hybrid's sequence has states");
            let shape = DeltaShape {
                n: q.tokens.len(),
                row0,
                head_dim: hd,
                n_v_heads: nv,
                n_k_heads: dl.net.n_k_heads,
                qkv_stride: cd,
                key_dim: kd,
                state_at: d.state_at + dl.conv_state_len(),
            };
            p.delta_rule(&shape, &dn.conv, &dn.gate, &dn.beta, states, &dn.heads)?;
            row0 += q.tokens.len();
        }
        // Each head normed, then gated by SiLU of z.
        p.rms_norm(&dn.heads, &d.norm, &dn.normed, t * nv, eps)?;
        p.gated(Activation::Silu, &dn.z, &dn.normed, &dn.heads, t * vd)?;
        p.matmul(&d.out, &dn.heads, t, &s.o)?;
        residual(p, &s.x, &s.o, &s.h, l.post_attn_norm.as_ref(), eps, e, t)
    }

    /// x += post_norm(the block's output over norm(x)): a dense gated
    /// feed-forward `down(act(gate h) * up h)`, a mixture of them, or both
    /// side by side (gemma4), as the CPU's `ffn_block`.
    fn ffn_block(&self, model: &Model, p: &mut ember_gpu::Pass<'_>, l: &DeviceLayer, s: &Work, t: usize) -> ember_gpu::Result<()> {
        let c = &model.config;
        let (e, eps) = (c.n_embd, c.rms_eps);
        let act = match c.opts.activation {
            FfnActivation::Silu => Activation::Silu,
            FfnActivation::GeluTanh => Activation::GeluTanh,
        };
        p.rms_norm(&s.x, &l.ffn_norm, &s.h, t, eps)?;
        if let Some(f) = &l.ffn {
            match &f.gate_up {
                // Written laid out for the down product, which reads them in place.
                GateUp::Pair(pair) => p.matmul_gated_laid_out(pair, act, &s.h, t, &s.act, p.inputs_block(&f.down, t))?,
                GateUp::Apart { gate, up } => {
                    p.matmul(gate, &s.h, t, &s.gate)?;
                    p.matmul(up, &s.h, t, &s.up)?;
                    p.gated(act, &s.gate, &s.up, &s.act, t * gate.rows)?;
                }
            }
            p.matmul(&f.down, &s.act, t, &s.o)?;
        }
        let out = match (&l.moe, &s.moe) {
            (Some(m), Some(ms)) => match &m.beside_dense {
                None if l.shared_gate.is_some() => {
                    // The shared expert (in `o`), scaled by its gate, then the mixture added.
                    let g = l.shared_gate.as_ref().expect("matched");
                    p.matmul(g, &s.h, t, &ms.shared_gate)?;
                    p.row_gate(&s.o, &ms.shared_gate, t, e)?;
                    m.route(p, c, &s.h, ms, t)?;
                    m.experts(p, act, &s.h, ms, t, e, &s.o, true)?;
                    &s.o
                }
                None => {
                    m.route(p, c, &s.h, ms, t)?;
                    m.experts(p, act, &s.h, ms, t, e, &s.o, false)?;
                    &s.o
                }
                Some(b) => {
                    // The dense block's output (in `o`), normed on its own.
                    let dense = match &b.post_norm_dense {
                        Some(n) => {
                            p.rms_norm(&s.o, n, &ms.dense, t, eps)?;
                            &ms.dense
                        }
                        None => &s.o,
                    };
                    p.rms_norm(&s.x, &b.router_norm, &s.h, t, eps)?;
                    m.route(p, c, &s.h, ms, t)?;
                    p.rms_norm(&s.x, &b.pre_norm, &s.h, t, eps)?;
                    m.experts(p, act, &s.h, ms, t, e, &ms.mixed, false)?;
                    p.rms_norm(&ms.mixed, &b.post_norm, &s.h, t, eps)?;
                    p.add_to(dense, &s.h, t * e)?;
                    dense
                }
            },
            _ => &s.o,
        };
        residual(p, &s.x, out, &s.h, l.post_ffn_norm.as_ref(), eps, e, t)
    }
}

impl DeviceWeights {
    /// gemma4's per-layer inputs of the pass, before the first layer (the
    /// CPU's `per_layer_inputs`): the projection of the scaled embedding,
    /// scaled by 1/sqrt(n_embd) and normed per layer, plus the token's rows
    /// (`pl.tok`, scaled on the host); the sum scaled by 1/sqrt(2), into
    /// `pl.inputs`.
    fn per_layer_inputs(
        &self,
        model: &Model,
        p: &mut ember_gpu::Pass<'_>,
        pi: &DevicePerLayerInputs,
        pl: &PerLayerWork,
        s: &Work,
        t: usize,
    ) -> ember_gpu::Result<()> {
        let c = &model.config;
        let (e, npl) = (c.n_embd, c.n_embd_per_layer);
        let n = t * c.n_layer * npl;
        p.matmul(&pi.model_proj, &s.x, t, &pl.projected)?;
        p.scale(&pl.projected, 1.0 / (e as f32).sqrt(), n)?;
        p.rms_norm(&pl.projected, &pi.proj_norm, &pl.inputs, t * c.n_layer, c.rms_eps)?;
        p.add_to(&pl.inputs, &pl.tok, n)?;
        p.scale(&pl.inputs, std::f32::consts::FRAC_1_SQRT_2, n)
    }

    /// `x += post_norm(proj(gelu(gate x) * layer il's per-layer input))`.
    #[allow(clippy::too_many_arguments)]
    fn per_layer_block(
        &self,
        model: &Model,
        p: &mut ember_gpu::Pass<'_>,
        d: &DevicePerLayer,
        il: usize,
        pl: &PerLayerWork,
        s: &Work,
        t: usize,
    ) -> ember_gpu::Result<()> {
        let c = &model.config;
        let (e, npl) = (c.n_embd, c.n_embd_per_layer);
        p.matmul(&d.gate, &s.x, t, &pl.gate)?;
        p.gated_rows(Activation::GeluTanh, &pl.gate, &pl.inputs, c.n_layer * npl, il * npl, &pl.act, t, npl)?;
        p.matmul(&d.proj, &pl.act, t, &s.o)?;
        residual(p, &s.x, &s.o, &s.h, Some(&d.post_norm), c.rms_eps, e, t)
    }
}

/// Each token's row of gemma4's per-layer table, scaled by
/// sqrt(n_embd_per_layer) as the CPU scales it, into `out` ([t, n_layer *
/// n_embd_per_layer]): read from the mapping for these tokens alone.
fn per_layer_token_rows(model: &Model, pe: &PerLayerEmbeddings, seqs: &[DeviceSeq<'_>], out: &mut Vec<f32>) {
    let c = &model.config;
    let width = c.n_layer * c.n_embd_per_layer;
    let scale = (c.n_embd_per_layer as f32).sqrt();
    let t: usize = seqs.iter().map(|q| q.tokens.len()).sum();
    out.resize(t * width, 0.0);
    for (row, &id) in out.chunks_mut(width).zip(seqs.iter().flat_map(|q| q.tokens)) {
        ember_quant::dequantize_row(pe.table.ty, pe.table.row(id as usize), row).expect("table row bound at load");
        row.iter_mut().for_each(|v| *v *= scale);
    }
    model.per_layer_rows_read.fetch_add(t, std::sync::atomic::Ordering::Relaxed);
}

impl DeviceDelta {
    fn upload(
        gpu: &Gpu,
        matrix: &mut impl FnMut(&Matrix) -> Result<DeviceMatrix>,
        dw: &DeltaNetWeights,
        shape: DeltaLayer,
        state_at: usize,
    ) -> Result<DeviceDelta> {
        Ok(DeviceDelta {
            shape,
            qkv: matrix(&dw.qkv)?,
            z: matrix(&dw.z)?,
            beta: matrix(&dw.beta)?,
            alpha: matrix(&dw.alpha)?,
            conv: vector(gpu, &dw.conv)?,
            dt_bias: vector(gpu, &dw.dt_bias)?,
            a: vector(gpu, &dw.a)?,
            norm: vector(gpu, &dw.norm)?,
            out: matrix(&dw.out)?,
            state_at,
        })
    }
}

impl DeviceMoe {
    fn upload(gpu: &Gpu, model: &Model, x: &Experts, beside_dense: bool) -> Result<DeviceMoe> {
        let m = model.config.moe.as_ref().expect("experts in a model with a mixture");
        let experts = |ms: &[Matrix]| -> Result<DeviceExperts> {
            let first = &ms[0];
            gpu.upload_experts(&first.name, first.ty, ms.len(), first.rows, first.cols, |e| ms[e].bytes())
                .map_err(|e| ModelError::Device(format!("tensor {}: {e}", first.name)))
        };
        let router = gpu
            .upload_matrix(&x.router.name, x.router.ty, x.router.rows, x.router.cols, x.router.bytes())
            .map_err(|e| ModelError::Device(format!("tensor {}: {e}", x.router.name)))?;
        let ones = vec![1.0; m.n_expert];
        let beside_dense = if beside_dense {
            let e = model.config.n_embd;
            let inv = 1.0 / (e as f32).sqrt();
            let scale = x.router_scale.as_deref().expect("bound with the mixture");
            let router_norm: Vec<f32> = scale.iter().map(|s| s * inv).collect();
            Some(BesideDense {
                router_norm: vector(gpu, &router_norm)?,
                pre_norm: vector(gpu, x.pre_norm.as_deref().expect("bound with the mixture"))?,
                post_norm_dense: optional(gpu, &x.post_norm_dense)?,
                post_norm: vector(gpu, x.post_norm.as_deref().expect("bound with the mixture"))?,
            })
        } else {
            None
        };
        Ok(DeviceMoe {
            router,
            gate: experts(&x.gate)?,
            up: experts(&x.up)?,
            down: experts(&x.down)?,
            down_scale: vector(gpu, x.down_scale.as_deref().unwrap_or(&ones))?,
            beside_dense,
        })
    }

    fn bytes(&self) -> u64 {
        self.router.bytes() + self.gate.bytes() + self.up.bytes() + self.down.bytes()
    }

    /// The router's logits of the `t` rows of `h`, and each row's experts
    /// and weights chosen from them (into `ms.ids` and `ms.weights`).
    fn route(&self, p: &mut ember_gpu::Pass<'_>, c: &crate::config::Config, h: &DeviceBuffer, ms: &MoeWork, t: usize) -> ember_gpu::Result<()> {
        let m = c.moe.as_ref().expect("experts in a model with a mixture");
        p.matmul(&self.router, h, t, &ms.logits)?;
        let routing = Routing { rows: t, n_expert: m.n_expert, n_used: m.n_used, normalise: m.norm_weights, scale: m.weights_scale };
        p.moe_route(&routing, &ms.logits, &ms.ids, &ms.weights)
    }

    /// out (=, or += where `accumulate`) the chosen experts' gated
    /// feed-forwards of the `t` rows of `h`, summed by their weights (the
    /// routing `route` recorded).
    #[allow(clippy::too_many_arguments)]
    fn experts(
        &self,
        p: &mut ember_gpu::Pass<'_>,
        act: Activation,
        h: &DeviceBuffer,
        ms: &MoeWork,
        t: usize,
        e: usize,
        out: &DeviceBuffer,
        accumulate: bool,
    ) -> ember_gpu::Result<()> {
        let n_used = ms.n_used;
        let pairs = t * n_used;
        p.matmul_id(&self.gate, h, n_used, &ms.ids, pairs, &ms.gate)?;
        p.matmul_id(&self.up, h, n_used, &ms.ids, pairs, &ms.up)?;
        p.gated(act, &ms.gate, &ms.up, &ms.act, pairs * self.gate.rows)?;
        p.matmul_id(&self.down, &ms.act, 1, &ms.ids, pairs, &ms.y)?;
        p.moe_combine(&ms.y, &ms.ids, &ms.weights, &self.down_scale, t, n_used, e, out, accumulate)
    }
}

/// A logit as the model caps it (`final_logit_softcapping`), or as it is.
fn soft_capped(model: &Model, v: f32) -> f32 {
    match model.config.logit_softcap {
        Some(cap) => (v / cap).tanh() * cap,
        None => v,
    }
}

/// The buffer holding the `rows` heads to rotate: each head RMS-normed
/// into `normed` where the layer has a per-head norm (qwen3, gemma), else
/// `raw` as it is.
fn normed_heads<'b>(
    p: &mut ember_gpu::Pass<'_>,
    raw: &'b DeviceBuffer,
    normed: &'b DeviceBuffer,
    norm: Option<&DeviceBuffer>,
    rows: usize,
    eps: f32,
) -> ember_gpu::Result<&'b DeviceBuffer> {
    match norm {
        Some(w) => {
            p.rms_norm(raw, w, normed, rows, eps)?;
            Ok(normed)
        }
        None => Ok(raw),
    }
}

/// x += norm(o) (into `spare` first), or x += o without a post-norm.
#[allow(clippy::too_many_arguments)]
fn residual(
    p: &mut ember_gpu::Pass<'_>,
    x: &DeviceBuffer,
    o: &DeviceBuffer,
    spare: &DeviceBuffer,
    post_norm: Option<&DeviceBuffer>,
    eps: f32,
    e: usize,
    t: usize,
) -> ember_gpu::Result<()> {
    match post_norm {
        Some(w) => {
            p.rms_norm(o, w, spare, t, eps)?;
            p.add_to(x, spare, t * e)
        }
        None => p.add_to(x, o, t * e),
    }
}

fn vector(gpu: &Gpu, v: &[f32]) -> Result<DeviceBuffer> {
    gpu.upload("vector", v).map_err(device_error)
}

fn optional(gpu: &Gpu, v: &Option<Vec<f32>>) -> Result<Option<DeviceBuffer>> {
    v.as_deref().map(|v| vector(gpu, v)).transpose()
}

/// The working buffers of passes of up to `rows` tokens.
struct Work {
    rows: usize,
    bytes: u64,
    x: DeviceBuffer,
    h: DeviceBuffer,
    o: DeviceBuffer,
    q: DeviceBuffer,
    qn: DeviceBuffer,
    k: DeviceBuffer,
    kn: DeviceBuffer,
    v: DeviceBuffer,
    vn: DeviceBuffer,
    att: DeviceBuffer,
    gate: DeviceBuffer,
    up: DeviceBuffer,
    act: DeviceBuffer,
    cos: Vec<DeviceBuffer>,
    sin: Vec<DeviceBuffer>,
    logits: DeviceBuffer,
    logit_rows: usize,
    /// The top of as many rows as `logits` holds, as (token, value) word pairs.
    top: DeviceBuffer,
    moe: Option<MoeWork>,
    per_layer: Option<PerLayerWork>,
    delta: Option<DeltaWork>,
    /// Gated attention (qwen35): the query projection's rows before they
    /// are split, the gates, and the gated outputs.
    q_raw: DeviceBuffer,
    gates: DeviceBuffer,
    att_gated: DeviceBuffer,
    host: HostRows,
}

/// A gated DeltaNet layer's working buffers: the projections, the
/// convolution's output, the per-head terms, and the rule's outputs before
/// and after their norm.
struct DeltaWork {
    mixed: DeviceBuffer,
    conv: DeviceBuffer,
    z: DeviceBuffer,
    beta: DeviceBuffer,
    gate: DeviceBuffer,
    heads: DeviceBuffer,
    normed: DeviceBuffer,
}

/// gemma4's per-layer inputs: the token rows from the host, the
/// projection before and after its norm (the inputs every layer reads its
/// slice of, [t, n_layer * n_embd_per_layer]), and one layer's gate and
/// activation.
struct PerLayerWork {
    tok: DeviceBuffer,
    projected: DeviceBuffer,
    inputs: DeviceBuffer,
    gate: DeviceBuffer,
    act: DeviceBuffer,
}

/// A mixture's working buffers: the router's logits, each row's chosen
/// experts (u32) and weights, the chosen pairs' gated products and outputs,
/// and (beside a dense block) the two outputs before they are summed.
struct MoeWork {
    n_used: usize,
    logits: DeviceBuffer,
    ids: DeviceBuffer,
    weights: DeviceBuffer,
    gate: DeviceBuffer,
    up: DeviceBuffer,
    act: DeviceBuffer,
    y: DeviceBuffer,
    dense: DeviceBuffer,
    mixed: DeviceBuffer,
    /// A shared expert's gate, one a row.
    shared_gate: DeviceBuffer,
}

/// What the host computes for a pass before the device runs it, allocated
/// with the working buffers: the embedding rows, and one rope variant's
/// angles at a time.
struct HostRows {
    x: Vec<f32>,
    cos: Vec<f32>,
    sin: Vec<f32>,
    per_layer: Vec<f32>,
    /// One sequence's recurrent states at a time.
    states: Vec<f32>,
}

impl Work {
    fn new(g: &Gpu, model: &Model, dw: &DeviceWeights, rows: usize) -> Result<Work> {
        let c = &model.config;
        let t = rows.max(1);
        let m = c.max_widths();
        let widest_q = c.layers.iter().map(LayerConfig::q_width).max().unwrap_or(0);
        let widest_att = c.layers.iter().map(LayerConfig::att_width).max().unwrap_or(0);
        let widest_ff = dw.layers.iter().filter_map(|l| l.ffn.as_ref()).map(DeviceFfn::rows).max().unwrap_or(0);
        let widest_expert = dw.layers.iter().filter_map(|l| l.moe.as_ref()).map(|m| m.gate.rows).max().unwrap_or(0);
        let mut bytes = 0u64;
        let mut buf = |name: &str, n: usize| {
            bytes += 4 * n.max(1) as u64;
            g.zeros(name, n.max(1)).map_err(device_error)
        };
        let e = c.n_embd;
        // Rows of logits one buffer holds (with the word `zeros` adds).
        let logit_rows = ((g.info().max_binding_bytes.saturating_sub(8) / 4) as usize / c.n_vocab).clamp(1, t);
        let moe = match &c.moe {
            Some(m) if widest_expert > 0 => {
                let pairs = t * m.n_used;
                Some(MoeWork {
                    n_used: m.n_used,
                    logits: buf("router logits", t * m.n_expert)?,
                    ids: buf("chosen experts", pairs)?,
                    weights: buf("expert weights", pairs)?,
                    gate: buf("expert gate", pairs * widest_expert)?,
                    up: buf("expert up", pairs * widest_expert)?,
                    act: buf("expert activation", pairs * widest_expert)?,
                    y: buf("expert outputs", pairs * e)?,
                    dense: buf("dense output", t * e)?,
                    mixed: buf("mixture output", t * e)?,
                    shared_gate: buf("shared expert gate", t)?,
                })
            }
            _ => None,
        };
        let per_layer = if dw.per_layer_inputs.is_some() {
            let (width, npl) = (c.n_layer * c.n_embd_per_layer, c.n_embd_per_layer);
            Some(PerLayerWork {
                tok: buf("per-layer token rows", t * width)?,
                projected: buf("per-layer projection", t * width)?,
                inputs: buf("per-layer inputs", t * width)?,
                gate: buf("per-layer gate", t * npl)?,
                act: buf("per-layer activation", t * npl)?,
            })
        } else {
            None
        };
        let deltas = c.layers.iter().filter_map(|l| l.delta);
        let (cd, vd, nv) = deltas.fold((0, 0, 0), |(a, b, n), d| (a.max(d.conv_dim()), b.max(d.value_dim()), n.max(d.net.n_v_heads)));
        let delta = if cd > 0 {
            Some(DeltaWork {
                mixed: buf("delta projection", t * cd)?,
                conv: buf("delta convolution", t * cd)?,
                z: buf("delta output gate", t * vd)?,
                beta: buf("delta beta", t * nv)?,
                gate: buf("delta decay", t * nv)?,
                heads: buf("delta heads", t * vd)?,
                normed: buf("delta heads normed", t * vd)?,
            })
        } else {
            None
        };
        let gated = c.layers.iter().any(|l| l.attn_gate);
        let widest_raw_q = if gated { 2 * widest_q } else { 0 };
        Ok(Work {
            rows: t,
            x: buf("x", t * e)?,
            h: buf("h", t * e)?,
            o: buf("o", t * e)?,
            q: buf("q", t * widest_q)?,
            qn: buf("q normed", t * widest_q)?,
            k: buf("k", t * m.k)?,
            kn: buf("k normed", t * m.k)?,
            v: buf("v", t * m.v)?,
            vn: buf("v normed", t * m.v)?,
            att: buf("attention", t * widest_att)?,
            gate: buf("gate", t * widest_ff)?,
            up: buf("up", t * widest_ff)?,
            act: buf("activation", t * widest_ff)?,
            cos: (0..c.ropes.len()).map(|_| buf("cos", t * m.half_rot)).collect::<Result<_>>()?,
            sin: (0..c.ropes.len()).map(|_| buf("sin", t * m.half_rot)).collect::<Result<_>>()?,
            logits: buf("logits", logit_rows * c.n_vocab)?,
            logit_rows,
            top: buf("top logits", logit_rows * 2 * MAX_TOP)?,
            moe,
            per_layer,
            delta,
            q_raw: buf("queries and gates", t * widest_raw_q)?,
            gates: buf("attention gates", if gated { t * widest_q } else { 0 })?,
            att_gated: buf("gated attention", if gated { t * widest_att } else { 0 })?,
            host: HostRows {
                x: Vec::with_capacity(t * e),
                cos: Vec::with_capacity(t * m.half_rot),
                sin: Vec::with_capacity(t * m.half_rot),
                per_layer: Vec::new(),
                states: Vec::new(),
            },
            bytes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_matrix_of_a_type_without_a_device_kernel_is_named() {
        let q4 = Matrix::for_test(GgmlType::Q4_0, 1, 32, vec![0; 18], false);
        let q8k = Matrix::for_test(GgmlType::Q8_K, 1, 256, vec![0; 292], false);
        assert_eq!(without_kernel([&q4].into_iter()), None);
        assert_eq!(
            without_kernel([&q4, &q8k].into_iter()).as_deref(),
            Some("tensor test.Q8_K: type Q8_K has no device kernel yet")
        );
    }
}
