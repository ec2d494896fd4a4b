//! Hyperparameters read from the GGUF metadata, the handful of named ways in
//! which one family's forward pass differs from another's, and the table of
//! per-layer shapes (head counts and widths, window, rope, cache, feed-forward)
//! that a file may vary from layer to layer.
//!
//! Adding a family means filling in a [`FamilyOptions`], not copying a model.
//! Facts follow llama.cpp's loader for each family (`src/models/<family>.cpp`,
//! `src/llama-model.cpp`, `src/llama-hparams.cpp`).

use ember_gguf::GgufHeader;

use crate::delta_net::DeltaNet;
use crate::error::{ModelError, Result};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    Llama,
    Qwen2,
    Qwen3,
    Qwen3Moe,
    Gemma3,
    Gemma4,
    Phi3,
    Qwen35,
    Qwen35Moe,
}

impl Arch {
    pub const ALL: [Arch; 9] = [
        Arch::Llama,
        Arch::Qwen2,
        Arch::Qwen3,
        Arch::Qwen3Moe,
        Arch::Gemma3,
        Arch::Gemma4,
        Arch::Phi3,
        Arch::Qwen35,
        Arch::Qwen35Moe,
    ];

    pub fn parse(name: &str) -> Option<Arch> {
        Arch::ALL.into_iter().find(|a| a.name() == name)
    }
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Qwen3Moe => "qwen3moe",
            Arch::Gemma3 => "gemma3",
            Arch::Gemma4 => "gemma4",
            Arch::Phi3 => "phi3",
            Arch::Qwen35 => "qwen35",
            Arch::Qwen35Moe => "qwen35moe",
        }
    }
}

/// How rotary embeddings pair up the dimensions of a head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent pairs (x[2i], x[2i+1]): llama.cpp's LLAMA_ROPE_TYPE_NORM. The
    /// converter permutes Llama's q/k weights so that this pairing is right.
    Adjacent,
    /// Halves (x[i], x[i + n_rot/2]): llama.cpp's LLAMA_ROPE_TYPE_NEOX.
    Halves,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FfnActivation {
    Silu,
    GeluTanh,
}

/// What a mixture's router reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RouterInput {
    /// The feed-forward block's normed input (qwen3moe, llama's mixtures).
    FfnInput,
    /// The block's un-normed input, RMS-normed without a weight, scaled by
    /// 1/sqrt(n_embd) and by the router's own scale vector (gemma4).
    ScaledResidual,
}

/// Which sliding-window layout a family reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WindowLayout {
    None,
    /// Every `n`th layer attends globally, the others use the window (gemma3: 6).
    Period(usize),
    /// `attention.sliding_window_pattern`, one bool per layer (gemma4).
    PatternArray,
}

/// The places where families differ. Everything else is shared.
#[derive(Clone, Debug)]
pub struct FamilyOptions {
    pub rope: RopeStyle,
    pub activation: FfnActivation,
    /// Per-head RMS norm of q and k before rope (qwen3, gemma).
    pub qk_norm: bool,
    /// RMS norms after the attention and FFN blocks, before the residual add (gemma).
    pub post_norms: bool,
    /// Embeddings multiplied by sqrt(n_embd) (gemma).
    pub embed_scale: bool,
    pub windows: WindowLayout,
    /// Rope base of the sliding-window layers when the file does not give
    /// `rope.freq_base_swa` (gemma3 and gemma4: llama.cpp's default 10000).
    pub swa_rope_base: Option<f32>,
    /// Values RMS-normed per head without a weight, and taken from the keys
    /// (before the key norm) in layers without `attn_v` (gemma4).
    pub value_norm: bool,
    /// Final logits capped as `cap * tanh(logits / cap)`; the cap when the
    /// file does not say (gemma4: 30).
    pub logit_softcap: Option<f32>,
    pub router: RouterInput,
    /// The last `attention.shared_kv_layers` layers read an earlier layer's cache (gemma4).
    pub shared_kv: bool,
    /// Query scale fixed by the family instead of 1/sqrt(head width) (gemma4: 1).
    pub attn_scale: Option<f32>,
    /// `ffn_up` holds the gate's rows and then the up rows (phi3).
    pub fused_gate_up: bool,
    /// Gated DeltaNet layers beside the attention layers, whose queries
    /// carry a gate per head (`attn_q` rows: each head's query, then its
    /// gate) that scales the attention output through a sigmoid (qwen35).
    pub hybrid: bool,
    /// The feed-forward block's input norm (qwen35 names it `post_attention_norm`).
    pub ffn_norm: &'static str,
}

impl FamilyOptions {
    pub fn of(arch: Arch) -> FamilyOptions {
        let base = FamilyOptions {
            rope: RopeStyle::Halves,
            activation: FfnActivation::Silu,
            qk_norm: false,
            post_norms: false,
            embed_scale: false,
            windows: WindowLayout::None,
            swa_rope_base: None,
            value_norm: false,
            logit_softcap: None,
            router: RouterInput::FfnInput,
            shared_kv: false,
            attn_scale: None,
            fused_gate_up: false,
            hybrid: false,
            ffn_norm: "ffn_norm.weight",
        };
        match arch {
            Arch::Llama => FamilyOptions { rope: RopeStyle::Adjacent, ..base },
            Arch::Qwen2 => base,
            Arch::Qwen3 | Arch::Qwen3Moe => FamilyOptions { qk_norm: true, ..base },
            Arch::Gemma3 => FamilyOptions {
                activation: FfnActivation::GeluTanh,
                qk_norm: true,
                post_norms: true,
                embed_scale: true,
                windows: WindowLayout::Period(6),
                // Gemma 3 trains its local layers with base 10000; the file
                // stores only the global base, so llama.cpp fixes this one too.
                swa_rope_base: Some(10_000.0),
                ..base
            },
            Arch::Gemma4 => FamilyOptions {
                activation: FfnActivation::GeluTanh,
                qk_norm: true,
                post_norms: true,
                embed_scale: true,
                windows: WindowLayout::PatternArray,
                swa_rope_base: Some(10_000.0),
                value_norm: true,
                logit_softcap: Some(30.0),
                router: RouterInput::ScaledResidual,
                shared_kv: true,
                attn_scale: Some(1.0),
                ..base
            },
            // Phi-3's sliding window is in its files but llama.cpp reads every
            // layer as full (its SWA is disabled there), so ember does too.
            Arch::Phi3 => FamilyOptions { fused_gate_up: true, ..base },
            Arch::Qwen35 | Arch::Qwen35Moe => {
                FamilyOptions { qk_norm: true, hybrid: true, ffn_norm: "post_attention_norm.weight", ..base }
            }
        }
    }
}

/// One rope variant: the layers that share it share a table of angles.
#[derive(Clone, Debug, PartialEq)]
pub struct RopeConfig {
    pub base: f32,
    /// Position scale (1 / linear scaling factor; YaRN's interpolation).
    pub freq_scale: f32,
    /// Dimensions of a head that rope rotates.
    pub n_rot: usize,
    pub factors: RopeFactors,
    /// YaRN's blend of interpolated and extrapolated frequencies.
    pub yarn: Option<Yarn>,
    /// cos and sin multiplied by this (llama.cpp's attention factor:
    /// `rope.scaling.attn_factor`, and YaRN's magnitude correction).
    pub mscale: f32,
}

/// Divisors of each rotated pair's frequency, from the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeFactors {
    None,
    /// `rope_freqs.weight`: Llama 3.1's llama3 scaling, Gemma 4's proportional rope.
    Freqs,
    /// LongRoPE (phi3): `rope_factors_short.weight` for a sequence of at most
    /// `original_ctx` positions, `rope_factors_long.weight` beyond, chosen by
    /// the sequence's context size as llama.cpp chooses by `n_ctx_seq`.
    LongShort {
        original_ctx: usize,
    },
}

/// YaRN's correction range (llama.cpp's `ggml_rope_yarn_corr_dims`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Yarn {
    pub original_ctx: usize,
    pub beta_fast: f32,
    pub beta_slow: f32,
}

/// Where a layer's keys and values live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvSource {
    /// The layer writes its own keys and values, at this layer of the cache.
    Own(usize),
    /// The layer writes none and reads those of an earlier layer's cache layer.
    Shared(usize),
    /// A recurrent layer: no keys or values, its state at this index of the cache's states.
    Recurrent(usize),
}

impl KvSource {
    /// The cache layer an attention layer reads.
    pub fn cache_layer(self) -> usize {
        match self {
            KvSource::Own(i) | KvSource::Shared(i) => i,
            KvSource::Recurrent(_) => unreachable!("a recurrent layer has no keys and values"),
        }
    }
}

/// A gated DeltaNet layer's shape (qwen35): the projections' widths follow
/// from the rule's heads, and its state is the convolution's last
/// `d_conv - 1` inputs, then the rule's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeltaLayer {
    pub net: DeltaNet,
    pub d_conv: usize,
}

impl DeltaLayer {
    pub fn key_dim(&self) -> usize {
        self.net.n_k_heads * self.net.head_dim
    }
    pub fn value_dim(&self) -> usize {
        self.net.n_v_heads * self.net.head_dim
    }
    /// Channels of the convolution: queries, keys, values.
    pub fn conv_dim(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }
    pub fn conv_state_len(&self) -> usize {
        (self.d_conv - 1) * self.conv_dim()
    }
    /// Floats of one sequence's state of this layer.
    pub fn state_len(&self) -> usize {
        self.conv_state_len() + self.net.state_len()
    }
}

/// A layer's feed-forward block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FfnShape {
    /// One gated feed-forward of `n_ff` rows.
    Dense { n_ff: usize },
    /// A mixture of experts, each `n_ff_exp` wide.
    Experts { n_ff_exp: usize },
    /// A dense feed-forward beside a mixture, their outputs added (gemma4's shared expert).
    DenseAndExperts { n_ff: usize, n_ff_exp: usize },
}

impl FfnShape {
    pub fn n_ff(self) -> usize {
        match self {
            FfnShape::Dense { n_ff } | FfnShape::DenseAndExperts { n_ff, .. } => n_ff,
            FfnShape::Experts { .. } => 0,
        }
    }
    pub fn n_ff_exp(self) -> usize {
        match self {
            FfnShape::Experts { n_ff_exp } | FfnShape::DenseAndExperts { n_ff_exp, .. } => n_ff_exp,
            FfnShape::Dense { .. } => 0,
        }
    }
    pub fn has_experts(self) -> bool {
        !matches!(self, FfnShape::Dense { .. })
    }
}

/// The shape of one layer.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerConfig {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim_k: usize,
    pub head_dim_v: usize,
    /// Keys visible to a query: the last `window` positions, or all.
    pub window: Option<usize>,
    /// Index into [`Config::ropes`].
    pub rope: usize,
    pub kv: KvSource,
    pub ffn: FfnShape,
    pub attn_scale: f32,
    /// Queries carry a gate per head (see [`FamilyOptions::hybrid`]).
    pub attn_gate: bool,
    /// A gated DeltaNet layer in place of attention.
    pub delta: Option<DeltaLayer>,
}

impl LayerConfig {
    pub fn q_width(&self) -> usize {
        self.n_head * self.head_dim_k
    }
    /// Rows of the query projection: the queries, and their gates where the layer has them.
    pub fn q_rows(&self) -> usize {
        if self.attn_gate {
            2 * self.q_width()
        } else {
            self.q_width()
        }
    }
    pub fn k_width(&self) -> usize {
        self.n_head_kv * self.head_dim_k
    }
    pub fn v_width(&self) -> usize {
        self.n_head_kv * self.head_dim_v
    }
    pub fn att_width(&self) -> usize {
        self.n_head * self.head_dim_v
    }
    pub fn is_swa(&self) -> bool {
        self.window.is_some()
    }
}

/// How a mixture picks and weighs its experts (softmax over the router's
/// logits, the top `n_used`, as llama.cpp's `build_moe_ffn`).
#[derive(Clone, Debug, PartialEq)]
pub struct MoeConfig {
    pub n_expert: usize,
    pub n_used: usize,
    /// The chosen experts' weights divided by their sum.
    pub norm_weights: bool,
    /// Every weight multiplied by this (1 when the file gives none).
    pub weights_scale: f32,
}

/// Hyperparameters of a model.
#[derive(Clone, Debug)]
pub struct Config {
    pub arch: Arch,
    pub name: String,
    pub n_vocab: usize,
    pub n_embd: usize,
    pub n_layer: usize,
    pub layers: Vec<LayerConfig>,
    /// Layers that hold a cache of their own (the first ones).
    pub n_layer_kv: usize,
    pub ropes: Vec<RopeConfig>,
    /// Context length the model was trained for.
    pub n_ctx_train: usize,
    pub rms_eps: f32,
    pub sliding_window: Option<usize>,
    pub moe: Option<MoeConfig>,
    /// Width of each layer's slice of the per-layer token embeddings (gemma4's
    /// E models), 0 without them.
    pub n_embd_per_layer: usize,
    pub logit_softcap: Option<f32>,
    pub opts: FamilyOptions,
}

impl Config {
    pub fn from_gguf(h: &GgufHeader) -> Result<Config> {
        let arch_name = h.architecture()?;
        let arch = Arch::parse(arch_name).ok_or_else(|| ModelError::UnsupportedArchitecture(arch_name.to_string()))?;
        let opts = FamilyOptions::of(arch);
        let key = |k: &str| format!("{arch_name}.{k}");
        let bad = |k: &str, problem: String| ModelError::BadMetadata { key: key(k), problem };
        let req = |k: &str| -> Result<usize> {
            match h.get_u64_opt(&key(k))? {
                Some(v) if v > 0 && v < (1 << 31) => Ok(v as usize),
                Some(v) => Err(bad(k, format!("{v} is out of range"))),
                None => Err(bad(k, "missing".into())),
            }
        };
        let opt = |k: &str| -> Result<Option<usize>> {
            match h.get_u64_opt(&key(k))? {
                Some(v) if v >= (1 << 31) => Err(bad(k, format!("{v} is out of range"))),
                v => Ok(v.map(|v| v as usize)),
            }
        };
        let n_embd = req("embedding_length")?;
        let n_layer = req("block_count")?;
        let n_ctx_train = opt("context_length")?.unwrap_or(2048);
        if n_layer > 1024 {
            return Err(bad("block_count", format!("{n_layer} layers")));
        }
        let n_head = per_layer(h, &key("attention.head_count"), n_layer, None)?;
        let n_head_kv = per_layer(h, &key("attention.head_count_kv"), n_layer, Some(&n_head))?;
        for (il, (&q, &kv)) in n_head.iter().zip(&n_head_kv).enumerate() {
            if q == 0 || kv == 0 || q % kv != 0 {
                return Err(bad(
                    "attention.head_count_kv",
                    format!("layer {il}: {q} query heads are not a multiple of {kv} key/value heads"),
                ));
            }
        }
        // Head widths and rotated dimensions of full layers, and of
        // sliding-window layers where the file says they differ.
        let head_dim_k = opt("attention.key_length")?.unwrap_or(n_embd / n_head[0]);
        let head_dim_v = opt("attention.value_length")?.unwrap_or(n_embd / n_head[0]);
        let head_dim_k_swa = opt("attention.key_length_swa")?.unwrap_or(head_dim_k);
        let head_dim_v_swa = opt("attention.value_length_swa")?.unwrap_or(head_dim_v);
        let n_rot = opt("rope.dimension_count")?.unwrap_or(head_dim_k);
        let n_rot_swa = opt("rope.dimension_count_swa")?.unwrap_or(n_rot);
        let rms_eps = h.get_f64_opt(&key("attention.layer_norm_rms_epsilon"))?.unwrap_or(1e-5) as f32;
        let rope_base = h.get_f64_opt(&key("rope.freq_base"))?.unwrap_or(10_000.0) as f32;
        let scaling = h.get_str_opt(&key("rope.scaling.type"))?;
        let factor = h.get_f64_opt(&key("rope.scaling.factor"))?.filter(|&f| f != 0.0);
        if let Some(f) = factor.filter(|f| !f.is_finite() || *f < 0.0) {
            return Err(bad("rope.scaling.factor", format!("{f} is not a positive number")));
        }
        let yarn = match scaling {
            None | Some("none") | Some("linear") => None,
            Some("yarn") => Some(Yarn {
                original_ctx: opt("rope.scaling.original_context_length")?.unwrap_or(n_ctx_train),
                beta_fast: h.get_f64_opt(&key("rope.scaling.yarn_beta_fast"))?.unwrap_or(32.0) as f32,
                beta_slow: h.get_f64_opt(&key("rope.scaling.yarn_beta_slow"))?.unwrap_or(1.0) as f32,
            }),
            Some(other) => return Err(bad("rope.scaling.type", format!("{other:?} scaling is not supported"))),
        };
        let rope_freq_scale = match (scaling, factor) {
            (Some("none"), _) | (_, None) => 1.0,
            (_, Some(f)) => (1.0 / f) as f32,
        };
        let attn_factor = h.get_f64_opt(&key("rope.scaling.attn_factor"))?.unwrap_or(1.0) as f32;
        // YaRN's cos and sin grow by 1 + 0.1 ln(factor) (ggml's rope_yarn;
        // llama.cpp's context cancels its own copy of the same factor).
        let yarn_mscale = if yarn.is_some() { 1.0 + 0.1 * (1.0 / rope_freq_scale).ln() } else { 1.0 };
        let swa_rope_base = match h.get_f64_opt(&key("rope.freq_base_swa"))? {
            Some(b) => Some(b as f32),
            None => opts.swa_rope_base,
        };
        for (k, v) in [
            ("rope.freq_base", rope_base),
            ("attention.layer_norm_rms_epsilon", rms_eps),
            ("rope.scaling.attn_factor", attn_factor),
        ]
        .into_iter()
        .chain(swa_rope_base.map(|b| ("rope.freq_base_swa", b)))
        {
            if !v.is_finite() || v <= 0.0 {
                return Err(bad(k, format!("{v} is not a positive number")));
            }
        }

        // Which layers use the sliding window.
        let is_swa: Vec<bool> = match opts.windows {
            WindowLayout::None => vec![false; n_layer],
            WindowLayout::Period(p) => (0..n_layer).map(|il| il % p < p - 1).collect(),
            WindowLayout::PatternArray => {
                let k = "attention.sliding_window_pattern";
                let items = h
                    .get(&key(k))
                    .and_then(|v| v.as_array())
                    .ok_or_else(|| bad(k, "missing or not an array".into()))?;
                if items.len() != n_layer {
                    return Err(bad(k, format!("{} entries for {n_layer} layers", items.len())));
                }
                items.iter().map(|v| v.as_bool().ok_or_else(|| bad(k, "not booleans".into()))).collect::<Result<_>>()?
            }
        };
        let sliding_window = if is_swa.iter().any(|&s| s) { Some(req("attention.sliding_window")?) } else { None };

        // Rope variants: full layers, then sliding-window layers when they differ.
        let factors = if ["rope_factors_long.weight", "rope_factors_short.weight"].iter().any(|n| h.tensor(n).is_some())
        {
            let original_ctx = opt("rope.scaling.original_context_length")?.unwrap_or(n_ctx_train);
            RopeFactors::LongShort { original_ctx }
        } else if h.tensor("rope_freqs.weight").is_some() {
            RopeFactors::Freqs
        } else {
            RopeFactors::None
        };
        let full_rope = RopeConfig {
            base: rope_base,
            freq_scale: rope_freq_scale,
            n_rot,
            factors,
            yarn,
            mscale: attn_factor * yarn_mscale,
        };
        let mut ropes = vec![full_rope.clone()];
        let swa_rope = match swa_rope_base {
            // A base of their own: unscaled (llama.cpp's freq_scale_swa of 1),
            // and in gemma4 without the full layers' proportional factors.
            Some(base) => RopeConfig {
                base,
                freq_scale: 1.0,
                n_rot: n_rot_swa,
                factors: if arch == Arch::Gemma4 { RopeFactors::None } else { factors },
                yarn: None,
                mscale: attn_factor,
            },
            None => RopeConfig { n_rot: n_rot_swa, ..full_rope.clone() },
        };
        let swa_rope_index = if swa_rope == full_rope {
            0
        } else {
            ropes.push(swa_rope);
            1
        };

        // Layers whose cache is shared: the last `shared_kv_layers` read the
        // last earlier layer of their own kind (sliding or full) that has a
        // cache, as llama.cpp's gemma3n/gemma4 `reuse` does.
        let n_shared = if opts.shared_kv { opt("attention.shared_kv_layers")?.unwrap_or(0) } else { 0 };
        if n_shared >= n_layer {
            return Err(bad("attention.shared_kv_layers", format!("{n_shared} of {n_layer} layers")));
        }
        let n_layer_kv = n_layer - n_shared;

        // Feed-forward shapes: dense, experts, or both.
        let n_expert = opt("expert_count")?.unwrap_or(0);
        let moe = if n_expert > 0 {
            let n_used = opt("expert_used_count")?.unwrap_or(0);
            if n_used == 0 || n_used > n_expert {
                return Err(bad("expert_used_count", format!("{n_used} of {n_expert} experts")));
            }
            // Expert groups (one group is none) and shared experts by count
            // (DeepSeek, Qwen2-MoE) change the routing; none of ember's families have them.
            for (k, most) in [("expert_group_count", 1), ("expert_shared_count", 0)] {
                if opt(k)?.unwrap_or(0) > most {
                    return Err(bad(k, "expert groups and shared experts by count are not supported".into()));
                }
            }
            if let Some(g) = opt("expert_gating_func")? {
                // LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX is 1.
                if g != 1 {
                    return Err(bad(
                        "expert_gating_func",
                        format!("gating function {g} is not supported (softmax is)"),
                    ));
                }
            }
            // llama and qwen3moe ask build_moe_ffn to normalise the chosen
            // weights always; gemma4 too. Their scale is read only by
            // families that read it (none of these: llama.cpp leaves it at 0).
            Some(MoeConfig { n_expert, n_used, norm_weights: true, weights_scale: 1.0 })
        } else {
            None
        };
        let n_ff = match h.get(&key("feed_forward_length")) {
            Some(_) => per_layer(h, &key("feed_forward_length"), n_layer, None)?,
            None if moe.is_some() => vec![0; n_layer],
            None => return Err(bad("feed_forward_length", "missing".into())),
        };
        let n_ff_shared = if arch == Arch::Qwen35Moe { opt("expert_shared_feed_forward_length")? } else { None };
        let n_ff_exp = match h.get(&key("expert_feed_forward_length")) {
            Some(_) => per_layer(h, &key("expert_feed_forward_length"), n_layer, None)?,
            None => vec![0; n_layer],
        };

        // Hybrids: which layers are gated DeltaNet, and its shape.
        let (recurrent, delta) =
            if opts.hybrid { hybrid_layers(h, arch_name, n_layer)? } else { (vec![false; n_layer], None) };
        if opts.hybrid {
            check_rope_sections(h, arch_name, n_rot)?;
        }
        let n_layer_kv = n_layer_kv - recurrent.iter().filter(|&&r| r).count();
        let (mut n_own, mut n_states) = (0, 0);

        let mut layers = Vec::with_capacity(n_layer);
        for il in 0..n_layer {
            let swa = is_swa[il];
            let (hk, hv, rot) =
                if swa { (head_dim_k_swa, head_dim_v_swa, n_rot_swa) } else { (head_dim_k, head_dim_v, n_rot) };
            if rot > hk || rot % 2 != 0 {
                return Err(bad("rope.dimension_count", format!("{rot} for heads of {hk} (layer {il})")));
            }
            let kv = if recurrent[il] {
                n_states += 1;
                KvSource::Recurrent(n_states - 1)
            } else if n_own < n_layer_kv {
                n_own += 1;
                KvSource::Own(n_own - 1)
            } else {
                let src = (0..n_layer_kv).rev().find(|&j| is_swa[j] == swa).ok_or_else(|| {
                    bad(
                        "attention.shared_kv_layers",
                        format!("layer {il} shares a cache, but no earlier layer of its kind has one"),
                    )
                })?;
                KvSource::Shared(src)
            };
            let ffn = match (&moe, arch) {
                (None, _) => FfnShape::Dense { n_ff: nonzero(n_ff[il], "feed_forward_length", il)? },
                // gemma4: a layer with a router has experts beside its dense block.
                (Some(m), Arch::Gemma4) if h.tensor(&format!("blk.{il}.ffn_gate_inp.weight")).is_some() => {
                    FfnShape::DenseAndExperts {
                        n_ff: nonzero(n_ff[il], "feed_forward_length", il)?,
                        n_ff_exp: expert_width(n_ff_exp[il], 0, m)?,
                    }
                }
                (Some(_), Arch::Gemma4) => FfnShape::Dense { n_ff: nonzero(n_ff[il], "feed_forward_length", il)? },
                // qwen35moe: a shared expert beside the mixture, behind a sigmoid gate.
                (Some(m), Arch::Qwen35Moe) => FfnShape::DenseAndExperts {
                    n_ff: nonzero(n_ff_shared.unwrap_or(n_ff[il]), "expert_shared_feed_forward_length", il)?,
                    n_ff_exp: expert_width(n_ff_exp[il], n_ff[il], m)?,
                },
                // llama's mixtures (Mixtral) make each expert feed_forward_length wide.
                (Some(_), Arch::Llama) => FfnShape::Experts { n_ff_exp: nonzero(n_ff[il], "feed_forward_length", il)? },
                // qwen3moe's experts are expert_feed_forward_length wide; files
                // without it split feed_forward_length among the used experts.
                (Some(m), _) => FfnShape::Experts { n_ff_exp: expert_width(n_ff_exp[il], n_ff[il], m)? },
            };
            let attn_scale = match opts.attn_scale {
                Some(s) => s,
                // Gemma 3 27B alone scales queries by its hidden size per head instead of the head width.
                None if arch == Arch::Gemma3 && n_layer == 62 => 1.0 / ((n_embd / n_head[il]) as f32).sqrt(),
                None => 1.0 / (hk as f32).sqrt(),
            };
            layers.push(LayerConfig {
                n_head: n_head[il],
                n_head_kv: n_head_kv[il],
                head_dim_k: hk,
                head_dim_v: hv,
                window: if swa { sliding_window } else { None },
                rope: if swa { swa_rope_index } else { 0 },
                kv,
                ffn,
                attn_scale,
                attn_gate: opts.hybrid && !recurrent[il],
                delta: if recurrent[il] { delta } else { None },
            });
        }
        // Keys that change the forward pass of the families that write them,
        // which ember does not implement: a file that has one is refused,
        // not run as if it had not.
        for k in [
            "attn_logit_softcapping",
            "router_logit_softcapping",
            "logit_scale",
            "residual_scale",
            "embedding_scale",
            "attention.scale",
            "attention.temperature_length",
            "attention.temperature_scale",
            "attention.key_length_mla",
            "rope.dimension_sections",
            "rope.scaling.yarn_log_multiplier",
            "expert_shared_feed_forward_length",
        ] {
            // The hybrids' sections were checked to come to plain rope above,
            // and qwen35moe's shared expert is read.
            if opts.hybrid && k == "rope.dimension_sections"
                || arch == Arch::Qwen35Moe && k == "expert_shared_feed_forward_length"
            {
                continue;
            }
            if h.get(&key(k)).is_some() {
                return Err(bad(k, format!("changes the {arch_name} forward pass in a way ember does not implement")));
            }
        }
        if h.get(&key("attention.causal")).and_then(|v| v.as_bool()) == Some(false) {
            return Err(bad("attention.causal", "false: ember runs causal attention only".into()));
        }
        let n_embd_per_layer =
            if arch == Arch::Gemma4 { opt("embedding_length_per_layer_input")?.unwrap_or(0) } else { 0 };
        let logit_softcap = match h.get_f64_opt(&key("final_logit_softcapping"))? {
            Some(c) if c > 0.0 && c.is_finite() => Some(c as f32),
            Some(c) if opts.logit_softcap.is_some() => {
                return Err(bad("final_logit_softcapping", format!("{c} is not a positive number")))
            }
            _ => opts.logit_softcap,
        };
        let n_vocab = match h.get("tokenizer.ggml.tokens").and_then(|v| v.as_array()) {
            Some(a) => a.len(),
            None => req("vocab_size")?,
        };
        let name = h.get_str_opt("general.name")?.unwrap_or("").to_string();
        Ok(Config {
            arch,
            name,
            n_vocab,
            n_embd,
            n_layer,
            layers,
            n_layer_kv,
            ropes,
            n_ctx_train,
            rms_eps,
            sliding_window,
            moe,
            n_embd_per_layer,
            logit_softcap,
            opts,
        })
    }

    /// The widest of each per-layer width, which sizes a pass's scratch.
    pub fn max_widths(&self) -> MaxWidths {
        let mut m = MaxWidths::default();
        for l in &self.layers {
            m.q = m.q.max(l.q_rows());
            m.k = m.k.max(l.k_width());
            m.v = m.v.max(l.v_width());
            m.att = m.att.max(l.att_width());
            m.ff = m.ff.max(l.ffn.n_ff());
            m.ff_exp = m.ff_exp.max(l.ffn.n_ff_exp());
        }
        m.half_rot = self.ropes.iter().map(|r| r.n_rot / 2).max().unwrap_or(0);
        m
    }

    /// Whether layer `il` uses the sliding window.
    pub fn is_swa_layer(&self, il: usize) -> bool {
        self.layers[il].is_swa()
    }

    /// Floats of each recurrent layer's state of one sequence, in state order.
    pub fn state_lens(&self) -> Vec<usize> {
        self.layers.iter().filter_map(|l| l.delta.map(|d| d.state_len())).collect()
    }

    /// f16 key and value bytes one position costs across the layers that hold a cache.
    pub fn kv_bytes_per_position(&self) -> usize {
        self.layers.iter().filter(|l| matches!(l.kv, KvSource::Own(_))).map(|l| 2 * (l.k_width() + l.v_width())).sum()
    }
}

#[derive(Clone, Copy, Debug, Default)]
pub struct MaxWidths {
    pub q: usize,
    pub k: usize,
    pub v: usize,
    pub att: usize,
    pub ff: usize,
    pub ff_exp: usize,
    pub half_rot: usize,
}

/// Which of a hybrid's layers are gated DeltaNet (`attention.recurrent_layers`,
/// one per layer, as llama.cpp's converter writes it; else every layer but
/// each `full_attention_interval`th, by default 4), and the rule's shape
/// from the `ssm.*` keys.
fn hybrid_layers(h: &GgufHeader, arch: &str, n_layer: usize) -> Result<(Vec<bool>, Option<DeltaLayer>)> {
    let key = |k: &str| format!("{arch}.{k}");
    let bad = |k: &str, problem: String| ModelError::BadMetadata { key: key(k), problem };
    let recurrent: Vec<bool> = match h.get(&key("attention.recurrent_layers")) {
        Some(v) => {
            let k = "attention.recurrent_layers";
            let items = v.as_array().ok_or_else(|| bad(k, "not an array".into()))?;
            if items.len() != n_layer {
                return Err(bad(k, format!("{} entries for {n_layer} layers", items.len())));
            }
            items
                .iter()
                .map(|x| {
                    x.as_bool().or_else(|| x.as_u64().map(|n| n != 0)).ok_or_else(|| bad(k, "not booleans".into()))
                })
                .collect::<Result<_>>()?
        }
        None => {
            let every = match h.get_u64_opt(&key("full_attention_interval"))? {
                None => 4,
                Some(n) if n > 0 && n < 1 << 16 => n as usize,
                Some(n) => return Err(bad("full_attention_interval", format!("{n} is out of range"))),
            };
            (0..n_layer).map(|il| (il + 1) % every != 0).collect()
        }
    };
    let get = |k: &str| -> Result<usize> {
        match h.get_u64_opt(&key(k))? {
            Some(v) if v > 0 && v < 1 << 20 => Ok(v as usize),
            Some(v) => Err(bad(k, format!("{v} is out of range"))),
            None => Err(bad(k, "missing".into())),
        }
    };
    let (d_conv, inner, d_state, n_v, n_k) = (
        get("ssm.conv_kernel")?,
        get("ssm.inner_size")?,
        get("ssm.state_size")?,
        get("ssm.time_step_rank")?,
        get("ssm.group_count")?,
    );
    if inner != d_state * n_v {
        return Err(bad("ssm.inner_size", format!("{inner} is not {d_state} (state_size) x {n_v} (time_step_rank)")));
    }
    if n_v % n_k != 0 {
        return Err(bad("ssm.group_count", format!("{n_v} value heads are not a multiple of {n_k} key heads")));
    }
    let delta = DeltaLayer { net: DeltaNet { n_k_heads: n_k, n_v_heads: n_v, head_dim: d_state }, d_conv };
    Ok((recurrent, Some(delta)))
}

/// qwen35's rope is llama.cpp's interleaved multi-section rope: rotated pair
/// `i` turns with the position component its section names (pairs past the
/// sections take a fourth component). Text gives every component but the
/// fourth the token's position, and the fourth 0; so where every pair falls
/// in the first three sections it is plain rope over halves, which is what
/// ember runs. A layout that sends a pair to the fourth is refused.
fn check_rope_sections(h: &GgufHeader, arch: &str, n_rot: usize) -> Result<()> {
    let k = format!("{arch}.rope.dimension_sections");
    let bad = |problem: String| ModelError::BadMetadata { key: k.clone(), problem };
    let v = h.get(&k).ok_or_else(|| bad("missing".into()))?;
    let items = v.as_array().ok_or_else(|| bad("not an array".into()))?;
    let s: Vec<usize> = items
        .iter()
        .map(|x| x.as_u64().or_else(|| x.as_i64().filter(|&n| n >= 0).map(|n| n as u64)).map(|n| n as usize))
        .collect::<Option<_>>()
        .filter(|s: &Vec<usize>| s.len() == 4)
        .ok_or_else(|| bad("not four non-negative integers".into()))?;
    let total: usize = s.iter().sum();
    if total == 0 {
        return Err(bad("all sections empty".into()));
    }
    for pair in 0..n_rot / 2 {
        let sector = pair % total;
        let covered = (sector.is_multiple_of(3) && sector < 3 * s[0])
            || (sector % 3 == 1 && sector < 3 * s[1])
            || (sector % 3 == 2 && sector < 3 * s[2]);
        if !covered {
            return Err(bad(format!(
                "{s:?} leaves rotated pair {pair} of {} on the fourth position component, which ember does not implement",
                n_rot / 2
            )));
        }
    }
    Ok(())
}

fn nonzero(n: usize, what: &str, il: usize) -> Result<usize> {
    if n == 0 {
        return Err(ModelError::BadMetadata { key: what.to_string(), problem: format!("0 for layer {il}") });
    }
    Ok(n)
}

fn expert_width(n_ff_exp: usize, n_ff: usize, m: &MoeConfig) -> Result<usize> {
    match (n_ff_exp, n_ff / m.n_used) {
        (0, 0) => Err(ModelError::BadMetadata { key: "expert_feed_forward_length".into(), problem: "missing".into() }),
        (0, w) => Ok(w),
        (w, _) => Ok(w),
    }
}

/// A hyperparameter that files store as one value or one per layer.
/// Without the key, `default` (when given) stands in.
fn per_layer(h: &GgufHeader, key: &str, n_layer: usize, default: Option<&[usize]>) -> Result<Vec<usize>> {
    let bad = |problem: String| ModelError::BadMetadata { key: key.to_string(), problem };
    let Some(v) = h.get(key) else {
        return default.map(|d| d.to_vec()).ok_or_else(|| bad("missing".into()));
    };
    let values: Vec<u64> = match v.as_array() {
        Some(items) => {
            if items.len() != n_layer {
                return Err(bad(format!("{} entries for {n_layer} layers", items.len())));
            }
            items.iter().map(|x| x.as_u64().ok_or_else(|| bad("not integers".into()))).collect::<Result<_>>()?
        }
        None => vec![v.as_u64().ok_or_else(|| bad(format!("is {}, expected an integer", v.type_name())))?; n_layer],
    };
    if let Some(n) = values.iter().find(|&&n| n >= 1 << 24) {
        return Err(bad(format!("{n} is out of range")));
    }
    Ok(values.into_iter().map(|n| n as usize).collect())
}
