//! Hyperparameters read from the GGUF metadata, and the handful of named ways
//! in which one family's forward pass differs from another's.
//!
//! Adding a family means filling in a [`FamilyOptions`], not copying a model.

use ember_gguf::GgufHeader;

use crate::error::{ModelError, Result};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    Llama,
    Qwen2,
    Qwen3,
    Gemma3,
}

impl Arch {
    pub fn parse(name: &str) -> Option<Arch> {
        Some(match name {
            "llama" => Arch::Llama,
            "qwen2" => Arch::Qwen2,
            "qwen3" => Arch::Qwen3,
            "gemma3" => Arch::Gemma3,
            _ => return None,
        })
    }
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Gemma3 => "gemma3",
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

/// The places where families differ. Everything else is shared.
#[derive(Clone, Debug)]
pub struct FamilyOptions {
    pub rope: RopeStyle,
    pub activation: FfnActivation,
    /// Per-head RMS norm of q and k before rope (qwen3, gemma3).
    pub qk_norm: bool,
    /// RMS norms after the attention and FFN blocks, before the residual add (gemma).
    pub post_norms: bool,
    /// Embeddings multiplied by sqrt(n_embd) (gemma).
    pub embed_scale: bool,
    /// Every `n`th layer attends globally; the others use the sliding window (gemma3: 6).
    pub swa_period: Option<usize>,
    /// Rope base of the sliding-window layers when it differs from the global one.
    pub swa_rope_base: Option<f32>,
}

impl FamilyOptions {
    pub fn of(arch: Arch) -> FamilyOptions {
        let base = FamilyOptions {
            rope: RopeStyle::Halves,
            activation: FfnActivation::Silu,
            qk_norm: false,
            post_norms: false,
            embed_scale: false,
            swa_period: None,
            swa_rope_base: None,
        };
        match arch {
            Arch::Llama => FamilyOptions { rope: RopeStyle::Adjacent, ..base },
            Arch::Qwen2 => base,
            Arch::Qwen3 => FamilyOptions { qk_norm: true, ..base },
            Arch::Gemma3 => FamilyOptions {
                activation: FfnActivation::GeluTanh,
                qk_norm: true,
                post_norms: true,
                embed_scale: true,
                swa_period: Some(6),
                // Gemma 3 trains its local layers with base 10000; the file
                // stores only the global base, so llama.cpp fixes this one too.
                swa_rope_base: Some(10_000.0),
                ..base
            },
        }
    }
}

/// Hyperparameters of a model.
#[derive(Clone, Debug)]
pub struct Config {
    pub arch: Arch,
    pub name: String,
    pub n_vocab: usize,
    pub n_embd: usize,
    pub n_layer: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim_k: usize,
    pub head_dim_v: usize,
    pub n_ff: usize,
    /// Context length the model was trained for.
    pub n_ctx_train: usize,
    pub rms_eps: f32,
    pub rope_base: f32,
    /// Position scale of the global layers (1 / linear scaling factor).
    pub rope_freq_scale: f32,
    /// Dimensions of a head that rope rotates.
    pub n_rot: usize,
    pub sliding_window: Option<usize>,
    pub attn_scale: f32,
    pub opts: FamilyOptions,
}

impl Config {
    pub fn from_gguf(h: &GgufHeader) -> Result<Config> {
        let arch_name = h.architecture()?;
        let arch = Arch::parse(arch_name).ok_or_else(|| ModelError::UnsupportedArchitecture(arch_name.to_string()))?;
        let opts = FamilyOptions::of(arch);
        let key = |k: &str| format!("{arch_name}.{k}");
        let req = |k: &str| -> Result<usize> {
            let full = key(k);
            match h.get_u64_opt(&full)? {
                Some(v) if v > 0 && v < (1 << 31) => Ok(v as usize),
                Some(v) => Err(ModelError::BadMetadata { key: full, problem: format!("{v} is out of range") }),
                None => Err(ModelError::BadMetadata { key: full, problem: "missing".into() }),
            }
        };
        let opt = |k: &str| -> Result<Option<usize>> { Ok(h.get_u64_opt(&key(k))?.map(|v| v as usize)) };
        let n_embd = req("embedding_length")?;
        let n_layer = req("block_count")?;
        if n_layer > 1024 {
            return Err(ModelError::BadMetadata { key: key("block_count"), problem: format!("{n_layer} layers") });
        }
        let n_head = per_layer_scalar(h, &key("attention.head_count"))?;
        let n_head_kv = match h.get(&key("attention.head_count_kv")) {
            None => n_head,
            Some(_) => per_layer_scalar(h, &key("attention.head_count_kv"))?,
        };
        if n_head % n_head_kv != 0 {
            return Err(ModelError::BadMetadata {
                key: key("attention.head_count_kv"),
                problem: format!("{n_head} query heads are not a multiple of {n_head_kv} key/value heads"),
            });
        }
        let head_dim_k = opt("attention.key_length")?.unwrap_or(n_embd / n_head);
        let head_dim_v = opt("attention.value_length")?.unwrap_or(n_embd / n_head);
        let n_ff = per_layer_scalar(h, &key("feed_forward_length"))?;
        let n_rot = opt("rope.dimension_count")?.unwrap_or(head_dim_k);
        if n_rot > head_dim_k || n_rot % 2 != 0 {
            return Err(ModelError::BadMetadata { key: key("rope.dimension_count"), problem: format!("{n_rot} for heads of {head_dim_k}") });
        }
        let rms_eps = h.get_f64_opt(&key("attention.layer_norm_rms_epsilon"))?.unwrap_or(1e-5) as f32;
        let rope_base = h.get_f64_opt(&key("rope.freq_base"))?.unwrap_or(10_000.0) as f32;
        let rope_freq_scale = match (h.get_str_opt(&key("rope.scaling.type"))?, h.get_f64_opt(&key("rope.scaling.factor"))?) {
            (None | Some("none"), _) | (_, None) => 1.0,
            (Some("linear"), Some(f)) if f > 0.0 => (1.0 / f) as f32,
            (Some(other), _) => {
                return Err(ModelError::BadMetadata { key: key("rope.scaling.type"), problem: format!("{other:?} scaling is not supported") })
            }
        };
        let n_ctx_train = opt("context_length")?.unwrap_or(2048);
        let sliding_window = if opts.swa_period.is_some() { Some(req("attention.sliding_window")?) } else { None };
        // Gemma 3 27B alone scales queries by its hidden size per head instead of the head width.
        let attn_scale = if arch == Arch::Gemma3 && n_layer == 62 {
            1.0 / ((n_embd / n_head) as f32).sqrt()
        } else {
            1.0 / (head_dim_k as f32).sqrt()
        };
        let n_vocab = match h.get("tokenizer.ggml.tokens").and_then(|v| v.as_array()) {
            Some(a) => a.len(),
            None => req("vocab_size")?,
        };
        let name = h.get_str_opt("general.name")?.unwrap_or("").to_string();
        for (k, v) in [("rope.freq_base", rope_base), ("attention.layer_norm_rms_epsilon", rms_eps)] {
            if !v.is_finite() || v <= 0.0 {
                return Err(ModelError::BadMetadata { key: key(k), problem: format!("{v} is not a positive number") });
            }
        }
        Ok(Config {
            arch,
            name,
            n_vocab,
            n_embd,
            n_layer,
            n_head,
            n_head_kv,
            head_dim_k,
            head_dim_v,
            n_ff,
            n_ctx_train,
            rms_eps,
            rope_base,
            rope_freq_scale,
            n_rot,
            sliding_window,
            attn_scale,
            opts,
        })
    }

    /// Whether layer `il` uses the sliding window.
    pub fn is_swa_layer(&self, il: usize) -> bool {
        match (self.opts.swa_period, self.sliding_window) {
            (Some(p), Some(_)) => il % p < p - 1,
            _ => false,
        }
    }

    /// Rope base and position scale of layer `il`.
    pub fn rope_of(&self, il: usize) -> (f32, f32) {
        match self.opts.swa_rope_base {
            Some(b) if self.is_swa_layer(il) => (b, 1.0),
            _ => (self.rope_base, self.rope_freq_scale),
        }
    }
}

/// A hyperparameter that some files store per layer: ember needs one value for all.
fn per_layer_scalar(h: &GgufHeader, key: &str) -> Result<usize> {
    let bad = |problem: String| ModelError::BadMetadata { key: key.to_string(), problem };
    let v = h.get(key).ok_or_else(|| bad("missing".into()))?;
    let n = match v.as_array() {
        Some(items) => {
            let first = items.first().and_then(|x| x.as_u64()).ok_or_else(|| bad("empty or not integers".into()))?;
            if items.iter().any(|x| x.as_u64() != Some(first)) {
                return Err(bad("differs between layers, which ember does not support".into()));
            }
            first
        }
        None => v.as_u64().ok_or_else(|| bad(format!("is {}, expected an integer", v.type_name())))?,
    };
    if n == 0 || n >= 1 << 24 {
        return Err(bad(format!("{n} is out of range")));
    }
    Ok(n as usize)
}
