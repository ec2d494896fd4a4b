//! The loaded model: its configuration, tokenizer, weights bound in the
//! file's mapping, rope tables and worker pool. Its forward passes are in
//! `forward`; a conversation's state lives in a `Session`, so one model
//! serves many sequences.

use std::path::Path;
use std::sync::{Arc, OnceLock};

use ember_gguf::GgufFile;
use ember_grammar::TokenIndex;
use ember_tokenizer::Tokenizer;

use crate::config::{Arch, Config};
use crate::error::{ModelError, Result};
use crate::vision::{Pixels, Projector};
use crate::{pool, rope, weights};

#[derive(Default)]
pub struct LoadOptions {
    /// Worker threads; 0 picks the number of physical cores.
    pub threads: usize,
    /// Keep every matrix in the file's layout (no repacking for the tile
    /// kernels): slower, for measuring what repacking gains.
    pub no_repack: bool,
    /// A multimodal projector (mmproj file) to load beside the model,
    /// refused unless its rows fit the model.
    pub mmproj: Option<std::path::PathBuf>,
}

pub struct Model {
    pub config: Config,
    pub tokenizer: Tokenizer,
    // Declared before `file` so the weights, which borrow its mapping, drop first.
    pub(crate) weights: weights::Weights,
    /// One table per rope variant (`Config::ropes`).
    pub(crate) rope_tables: Vec<rope::RopeTable>,
    pub(crate) pool: pool::Pool,
    n_threads: usize,
    /// Rows of the per-layer token table read so far (gemma4's E models):
    /// the table stays in the mapping and only a pass's tokens are read.
    pub(crate) per_layer_rows_read: std::sync::atomic::AtomicUsize,
    /// The vocabulary indexed for grammar masks, built on first use.
    token_index: OnceLock<TokenIndex>,
    /// The device the layers run on, once placed there (`Model::place_on`).
    pub(crate) device: Option<crate::device::DeviceWeights>,
    projector: Option<Projector>,
    file: Arc<GgufFile>,
}

impl Model {
    pub fn load(path: impl AsRef<Path>, opts: LoadOptions) -> Result<Model> {
        // A kernel level ember cannot honour (EMBER_SIMD) is refused before anything runs.
        ember_quant::checked_level().map_err(ModelError::Invalid)?;
        let file = Arc::new(GgufFile::open(path)?);
        let config = Config::from_gguf(&file)?;
        let tokenizer = Tokenizer::from_gguf(&file)?;
        if tokenizer.n_vocab() != config.n_vocab {
            return Err(ModelError::Invalid(format!(
                "the tokenizer has {} tokens but the model's embedding has {}",
                tokenizer.n_vocab(),
                config.n_vocab
            )));
        }
        let weights = weights::bind(&file, &config, !opts.no_repack)?;
        if !weights.unread.is_empty() {
            return Err(ModelError::UnreadTensors { arch: config.arch.name(), names: weights.unread.clone() });
        }
        let projector = match &opts.mmproj {
            Some(path) => {
                let p = Projector::load(path, !opts.no_repack)?;
                p.check_fits(config.arch, config.n_embd)?;
                Some(p)
            }
            None => None,
        };
        let rope_tables = config.ropes.iter().map(|r| rope::RopeTable::new(r, &weights)).collect::<Result<Vec<_>>>()?;
        let n_threads = if opts.threads == 0 { physical_cores() } else { opts.threads };
        let pool = pool::Pool::new(n_threads)
            .map_err(|e| ModelError::Invalid(format!("cannot start {n_threads} worker threads: {e}")))?;
        Ok(Model {
            config,
            tokenizer,
            weights,
            rope_tables,
            pool,
            n_threads,
            per_layer_rows_read: Default::default(),
            token_index: OnceLock::new(),
            device: None,
            projector,
            file,
        })
    }

    /// The multimodal projector loaded beside the model, if any.
    pub fn projector(&self) -> Option<&Projector> {
        self.projector.as_ref()
    }

    /// One picture's rows for the prompt (`tokens_per_image` of `n_embd`),
    /// through the projector on this model's worker threads.
    pub fn encode_image(&self, px: &Pixels<'_>) -> Result<Vec<f32>> {
        let p = self.projector.as_ref().ok_or_else(|| {
            ModelError::Projector("the model has no projector loaded: it reads text only (load one with an mmproj file)".into())
        })?;
        p.encode(&self.pool, px)
    }

    pub fn file(&self) -> &GgufFile {
        &self.file
    }

    pub fn threads(&self) -> usize {
        self.n_threads
    }

    /// Rows of the per-layer token table that passes have read (0 without one).
    pub fn per_layer_rows_read(&self) -> usize {
        self.per_layer_rows_read.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Tensors in the file that this architecture never read.
    pub fn unread_tensors(&self) -> &[String] {
        &self.weights.unread
    }

    pub fn weights(&self) -> &weights::Weights {
        &self.weights
    }

    /// A reranker's scores for a sequence whose last position's final hidden
    /// state is `last` (llama.cpp's rank pooling of a causal model): one a
    /// label of its classification head, made probabilities by a softmax for
    /// Qwen3's, as llama.cpp makes them. None when the file has no head.
    pub fn rank(&self, last: &[f32]) -> Option<Vec<f32>> {
        let head = self.weights.classifier.as_ref()?;
        let mut scores = head.scores(last);
        if self.config.arch == Arch::Qwen3 {
            let max = scores.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
            let sum: f32 = scores.iter().map(|v| (v - max).exp()).sum();
            scores.iter_mut().for_each(|v| *v = (*v - max).exp() / sum);
        }
        Some(scores)
    }

    /// The vocabulary as grammars read it: each token's bytes, control and
    /// unused tokens left out (a grammar never produces them; the end of the
    /// turn is decided apart).
    pub fn token_index(&self) -> &TokenIndex {
        self.token_index.get_or_init(|| {
            let tok = &self.tokenizer;
            let pieces = (0..tok.n_vocab() as u32)
                .filter(|&id| !tok.is_control(id) && !tok.is_unused(id))
                .map(|id| (id, tok.token_to_piece(id, false)));
            TokenIndex::new(self.config.n_vocab, pieces)
        })
    }
}

/// Physical cores, not hardware threads: two threads on one core fight over
/// the same vector units and gain nothing on these kernels.
pub fn physical_cores() -> usize {
    let logical = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    #[cfg(target_os = "linux")]
    if let Ok(info) = std::fs::read_to_string("/proc/cpuinfo") {
        let mut cores = std::collections::BTreeSet::new();
        let (mut phys, mut core) = (None, None);
        for line in info.lines().chain(std::iter::once("")) {
            if line.trim().is_empty() {
                if let (Some(p), Some(c)) = (phys.take(), core.take()) {
                    cores.insert((p, c));
                }
                continue;
            }
            let mut kv = line.splitn(2, ':');
            match (kv.next().map(str::trim), kv.next().map(str::trim)) {
                (Some("physical id"), Some(v)) => phys = Some(v.to_string()),
                (Some("core id"), Some(v)) => core = Some(v.to_string()),
                _ => {}
            }
        }
        if !cores.is_empty() {
            return cores.len().min(logical);
        }
    }
    logical
}
