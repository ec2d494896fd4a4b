//! `ember._native`: the Python face of the Rust crates. It converts types,
//! releases the GIL around long work and maps each crate's errors onto the
//! small exception hierarchy that `ember.errors` re-exports. Nothing else.

use std::sync::Arc;

use ember_gguf::{GgufFile, Value};
use ember_model::generate::ThoughtBudget;
use ember_model::{GenerateParams, Generation, KvType, LoadOptions, Logits, ModelError, Slot};
use ember_sample::{SamplingParams, Stage};
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};

create_exception!(_native, EmberError, PyException, "Base of every error ember raises.");
create_exception!(_native, ModelLoadError, EmberError, "The model file cannot be read or run.");
create_exception!(_native, InvalidRequestError, EmberError, "A request carries a value ember cannot use.");
create_exception!(_native, ContextFullError, InvalidRequestError, "The tokens do not fit in the context.");
create_exception!(_native, GrammarError, InvalidRequestError, "A grammar or JSON Schema that cannot be compiled.");
create_exception!(
    _native,
    InvalidSchemaError,
    GrammarError,
    "A JSON Schema that is malformed or contradictory, not merely outside the supported subset."
);
create_exception!(_native, DeviceError, EmberError, "The GPU failed, or cannot hold or run what was asked of it.");

mod batcher;
mod grammar;

pub(crate) fn map_err(e: ModelError) -> PyErr {
    match e {
        ModelError::Kv(ember_kv::KvError::ContextFull { .. }) => ContextFullError::new_err(e.to_string()),
        ModelError::Grammar(_) => GrammarError::new_err(e.to_string()),
        ModelError::Device(_) => DeviceError::new_err(e.to_string()),
        ModelError::BadToken { .. } | ModelError::Sample(_) | ModelError::Invalid(_) | ModelError::Kv(_) => {
            InvalidRequestError::new_err(e.to_string())
        }
        _ => ModelLoadError::new_err(e.to_string()),
    }
}

/// `reasoning_budget` as Python passes it: (tokens of thought, opener,
/// closer, the ids of the close to force, whether the prompt left a thought open).
pub(crate) type ThoughtBudgetArg = (usize, String, String, Vec<u32>, bool);

/// Sampling and stopping parameters for `Model.generate` and
/// `Batcher.start`, read once from keywords with llama.cpp's defaults.
#[pyclass(module = "ember._native", frozen)]
pub struct GenerateOptions {
    pub(crate) params: GenerateParams,
    pub(crate) cache_prompt: bool,
}

impl GenerateOptions {
    /// The parameters, checked against a vocabulary of `n_vocab` tokens.
    pub(crate) fn params_for(&self, n_vocab: usize) -> PyResult<GenerateParams> {
        let n_probs = self.params.n_probs;
        if n_probs > n_vocab {
            return Err(InvalidRequestError::new_err(format!("n_probs {n_probs} exceeds the vocabulary")));
        }
        Ok(self.params.clone())
    }
}

#[pymethods]
impl GenerateOptions {
    #[new]
    #[pyo3(signature = (max_tokens = 128, ignore_eos = false, temperature = 0.8, top_k = 40, top_p = 0.95, min_p = 0.05,
        typical_p = 1.0, repeat_penalty = 1.0, repeat_last_n = 64, frequency_penalty = 0.0, presence_penalty = 0.0,
        logit_bias = Vec::new(), seed = None, n_probs = 0, cache_prompt = true, grammar = None, grammar_trigger = None,
        thought_budget = None, post_sampling_probs = false, samplers = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        max_tokens: usize,
        ignore_eos: bool,
        temperature: f32,
        top_k: i32,
        top_p: f32,
        min_p: f32,
        typical_p: f32,
        repeat_penalty: f32,
        repeat_last_n: i32,
        frequency_penalty: f32,
        presence_penalty: f32,
        logit_bias: Vec<(u32, f32)>,
        seed: Option<u64>,
        n_probs: usize,
        cache_prompt: bool,
        grammar: Option<PyRef<'_, grammar::Grammar>>,
        grammar_trigger: Option<String>,
        thought_budget: Option<ThoughtBudgetArg>,
        post_sampling_probs: bool,
        samplers: Option<Vec<String>>,
    ) -> PyResult<GenerateOptions> {
        if grammar_trigger.is_some() && grammar.is_none() {
            return Err(InvalidRequestError::new_err("grammar_trigger: given without a grammar"));
        }
        let chain = samplers.map(|names| names.iter().map(|n| stage(n)).collect::<PyResult<Vec<Stage>>>()).transpose()?;
        let sampling = SamplingParams {
            temperature,
            top_k,
            top_p,
            min_p,
            typical_p,
            repeat_penalty,
            repeat_last_n,
            frequency_penalty,
            presence_penalty,
            logit_bias,
            seed,
            chain,
        };
        let thought_budget = thought_budget.map(|(budget, opener, closer, close_ids, in_thought)| ThoughtBudget {
            budget,
            opener: opener.into_bytes(),
            closer: closer.into_bytes(),
            close_ids,
            in_thought,
        });
        let params = GenerateParams {
            max_tokens,
            ignore_eos,
            n_probs,
            post_sampling_probs,
            sampling,
            grammar: grammar.map(|g| g.inner.clone()),
            grammar_trigger: grammar_trigger.map(String::into_bytes),
            thought_budget,
        };
        Ok(GenerateOptions { params, cache_prompt })
    }
}

/// A stage of a named chain by llama.cpp's name for it.
fn stage(name: &str) -> PyResult<Stage> {
    Ok(match name {
        "penalties" => Stage::Penalties,
        "top_k" => Stage::TopK,
        "typ_p" => Stage::TypicalP,
        "top_p" => Stage::TopP,
        "min_p" => Stage::MinP,
        "temperature" => Stage::Temperature,
        "infill" => Stage::Infill,
        _ => return Err(InvalidRequestError::new_err(format!("samplers: no sampler named {name:?} runs here"))),
    })
}

fn kv_type(s: &str) -> PyResult<KvType> {
    KvType::parse(s)
        .ok_or_else(|| InvalidRequestError::new_err(format!("kv_type {s:?}: expected \"f16\", \"bf16\", \"f32\" or \"q8_0\"")))
}

/// A metadata value as a Python object; long arrays (vocabularies) come back whole.
fn value_to_py<'py>(py: Python<'py>, v: &Value) -> PyResult<Bound<'py, PyAny>> {
    Ok(match v {
        Value::Bool(b) => b.into_pyobject(py)?.to_owned().into_any(),
        Value::F32(f) => f.into_pyobject(py)?.into_any(),
        Value::F64(f) => f.into_pyobject(py)?.into_any(),
        Value::String(s) => s.into_pyobject(py)?.into_any(),
        Value::Array(items) => {
            let list = PyList::empty(py);
            for it in items {
                list.append(value_to_py(py, it)?)?;
            }
            list.into_any()
        }
        other => other.as_i64().unwrap_or_default().into_pyobject(py)?.into_any(),
    })
}

/// Header facts of a GGUF file, read without binding any weights: metadata
/// (arrays longer than `max_array` replaced by their length) and the tensor table.
#[pyfunction]
#[pyo3(signature = (path, max_array = 64))]
fn inspect<'py>(py: Python<'py>, path: &str, max_array: usize) -> PyResult<Bound<'py, PyDict>> {
    let path = path.to_string();
    let file = py.detach(move || GgufFile::open(&path)).map_err(|e| ModelLoadError::new_err(e.to_string()))?;
    let out = PyDict::new(py);
    let meta = PyDict::new(py);
    for (k, v) in &file.metadata {
        match v {
            Value::Array(a) if a.len() > max_array => meta.set_item(k, format!("[{} values]", a.len()))?,
            _ => meta.set_item(k, value_to_py(py, v)?)?,
        }
    }
    out.set_item("version", file.version)?;
    out.set_item("metadata", meta)?;
    let tensors = PyList::empty(py);
    for t in &file.tensors {
        tensors.append((t.name.as_str(), t.ty.name(), t.dims.clone(), t.n_bytes))?;
    }
    out.set_item("tensors", tensors)?;
    out.set_item("file_size", file.file_len())?;
    // What a position of the cache costs, as the forward pass will lay it
    // out (per-layer widths, layers that share a cache); None where ember
    // cannot read the file's shape.
    let per_pos = ember_model::Config::from_gguf(&file).ok().map(|c| c.kv_bytes_per_position());
    out.set_item("kv_bytes_per_position", per_pos)?;
    Ok(out)
}

/// The instruction set the quantized dot-product kernels run on here
/// (for example "avx2"), as chosen at start-up.
#[pyfunction]
fn simd_level() -> &'static str {
    ember_quant::simd_level()
}

/// The Vulkan devices this machine has: name (what `--device` takes),
/// description, kind, driver and the largest buffer one binding may hold.
#[pyfunction]
fn list_devices(py: Python<'_>) -> PyResult<Vec<Bound<'_, PyDict>>> {
    let devices = py.detach(ember_gpu::list_devices);
    devices
        .into_iter()
        .map(|d| {
            let out = PyDict::new(py);
            out.set_item("name", d.name)?;
            out.set_item("description", d.description)?;
            out.set_item("kind", d.kind.as_str())?;
            out.set_item("driver", d.driver)?;
            out.set_item("max_binding_bytes", d.max_binding_bytes)?;
            Ok(out)
        })
        .collect()
}

#[pyclass(frozen, module = "ember._native")]
pub(crate) struct Model {
    pub(crate) inner: Arc<ember_model::Model>,
    n_ctx: usize,
    pub(crate) max_batch: usize,
    pub(crate) kv_type: KvType,
    /// The session of the last generation and the tokens it holds.
    slot: Arc<std::sync::Mutex<Option<Slot>>>,
    /// Why a device was asked for and the model runs on the CPU all the same.
    device_note: Option<String>,
    /// The last bench test's context, kept for its next run.
    bench: std::sync::Mutex<Option<ember_model::bench::Context>>,
}

#[pymethods]
impl Model {
    /// `device`: None runs the model on the CPU; a device's name (or "" for
    /// the one `list_devices` ranks first) puts every layer and the output
    /// head there, `gpu_layers` (-1: all) being the layers asked for. Where
    /// the device cannot be opened or cannot hold or run the model, `strict`
    /// raises `DeviceError`; otherwise the model runs on the CPU and
    /// `device_note` says why.
    #[new]
    #[pyo3(signature = (path, n_ctx = 0, threads = 0, kv_type = "f16", max_batch = 512, device = None, gpu_layers = -1, strict = true))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        path: &str,
        n_ctx: usize,
        threads: usize,
        kv_type: &str,
        max_batch: usize,
        device: Option<String>,
        gpu_layers: i64,
        strict: bool,
    ) -> PyResult<Model> {
        let kv = self::kv_type(kv_type)?;
        if max_batch == 0 {
            return Err(InvalidRequestError::new_err("max_batch must be at least 1"));
        }
        let path = path.to_string();
        let mut inner = py
            .detach(move || ember_model::Model::load(&path, LoadOptions { threads, ..Default::default() }))
            .map_err(map_err)?;
        inner.check_kv_type(kv).map_err(map_err)?;
        let device_note = match device {
            Some(name) => py.detach(|| place(&mut inner, &name, gpu_layers, kv, strict))?,
            None => None,
        };
        let n_ctx = if n_ctx == 0 { inner.config.n_ctx_train } else { n_ctx };
        Ok(Model { inner: Arc::new(inner), n_ctx, max_batch, kv_type: kv, slot: Default::default(), device_note,
                   bench: Default::default() })
    }

    /// Where the model runs: None on the CPU, else the device's name,
    /// description and kind, and the bytes its weights and the working
    /// buffers of the widest pass so far take there.
    fn placement<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let Some(dw) = self.inner.placement() else { return Ok(None) };
        let info = dw.gpu().info();
        let d = PyDict::new(py);
        d.set_item("name", &info.name)?;
        d.set_item("description", &info.description)?;
        d.set_item("kind", info.kind.as_str())?;
        d.set_item("weight_bytes", dw.weight_bytes())?;
        d.set_item("work_bytes", dw.work_bytes())?;
        Ok(Some(d))
    }

    /// Why a device was asked for and the model runs on the CPU, or None.
    #[getter]
    fn device_note(&self) -> Option<String> {
        self.device_note.clone()
    }

    /// Makes the device's next pass fail with `why`, as a lost device's
    /// would (for tests of what the server does then).
    fn inject_device_fault(&self, why: String) -> PyResult<()> {
        let dw = self.inner.placement().ok_or_else(|| InvalidRequestError::new_err("the model is not on a device"))?;
        dw.gpu().inject_fault(ember_gpu::GpuError::Lost(why));
        Ok(())
    }

    #[getter]
    fn n_vocab(&self) -> usize {
        self.inner.config.n_vocab
    }
    #[getter]
    fn n_ctx(&self) -> usize {
        self.n_ctx
    }
    #[getter]
    fn n_ctx_train(&self) -> usize {
        self.inner.config.n_ctx_train
    }
    #[getter]
    fn architecture(&self) -> &'static str {
        self.inner.config.arch.name()
    }
    #[getter]
    fn name(&self) -> &str {
        &self.inner.config.name
    }
    #[getter]
    fn threads(&self) -> usize {
        self.inner.threads()
    }
    #[getter]
    fn bos_id(&self) -> Option<u32> {
        self.inner.tokenizer.bos()
    }
    #[getter]
    fn eos_id(&self) -> Option<u32> {
        self.inner.tokenizer.eos()
    }
    #[getter]
    fn eog_ids(&self) -> Vec<u32> {
        self.inner.tokenizer.eog_ids().to_vec()
    }
    /// The fill-in-the-middle tokens the vocabulary names (or llama.cpp
    /// infers from their spellings), by llama.cpp's names: pre, suf, mid,
    /// pad, rep, sep; those it lacks are left out.
    #[getter]
    fn fim_ids(&self) -> std::collections::BTreeMap<&'static str, u32> {
        let ids = self.inner.tokenizer.special_ids();
        [("pre", ids.fim_pre), ("suf", ids.fim_suf), ("mid", ids.fim_mid), ("pad", ids.fim_pad),
         ("rep", ids.fim_rep), ("sep", ids.fim_sep)]
            .into_iter()
            .filter_map(|(name, id)| id.map(|id| (name, id)))
            .collect()
    }
    /// Whether a prompt's tokenization starts with the BOS (the model's flag, and a BOS to add).
    #[getter]
    fn add_bos(&self) -> bool {
        self.inner.tokenizer.add_bos()
    }

    /// Hyperparameters as a dict.
    fn config<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let c = &self.inner.config;
        let d = PyDict::new(py);
        d.set_item("architecture", c.arch.name())?;
        d.set_item("n_vocab", c.n_vocab)?;
        d.set_item("n_embd", c.n_embd)?;
        d.set_item("n_layer", c.n_layer)?;
        // Layer 0's shape, as llama.cpp prints it, and every layer's where they differ.
        let l0 = &c.layers[0];
        d.set_item("n_head", l0.n_head)?;
        d.set_item("n_head_kv", l0.n_head_kv)?;
        d.set_item("head_dim", l0.head_dim_k)?;
        d.set_item("n_ff", l0.ffn.n_ff())?;
        d.set_item("n_ctx_train", c.n_ctx_train)?;
        d.set_item("rope_base", c.ropes[0].base)?;
        d.set_item("n_layer_kv", c.n_layer_kv)?;
        d.set_item("kv_bytes_per_position", c.kv_bytes_per_position())?;
        let states = c.state_lens();
        d.set_item("n_layer_recurrent", states.len())?;
        d.set_item("recurrent_state_bytes", 4 * states.iter().sum::<usize>())?;
        d.set_item("n_expert", c.moe.as_ref().map_or(0, |m| m.n_expert))?;
        d.set_item("n_expert_used", c.moe.as_ref().map_or(0, |m| m.n_used))?;
        d.set_item("n_embd_per_layer", c.n_embd_per_layer)?;
        d.set_item("swa_layers", c.layers.iter().map(|l| l.is_swa()).collect::<Vec<_>>())?;
        d.set_item("sliding_window", c.sliding_window)?;
        Ok(d)
    }

    fn unread_tensors(&self) -> Vec<String> {
        self.inner.unread_tensors().to_vec()
    }

    /// A metadata value of the file, or None.
    fn metadata<'py>(&self, py: Python<'py>, key: &str) -> PyResult<Option<Bound<'py, PyAny>>> {
        self.inner.file().get(key).map(|v| value_to_py(py, v)).transpose()
    }

    /// `literal`: byte ranges of `text` whose spellings of control tokens
    /// stay text even with `parse_special` (a client's words in a prompt).
    #[pyo3(signature = (text, add_special = true, parse_special = false, literal = Vec::new()))]
    fn tokenize(
        &self,
        py: Python<'_>,
        text: &str,
        add_special: bool,
        parse_special: bool,
        literal: Vec<(usize, usize)>,
    ) -> Vec<u32> {
        let text = text.to_string();
        py.detach(|| self.inner.tokenizer.tokenize_guarded(&text, add_special, parse_special, &literal))
    }

    /// The spellings of the control (and unknown) tokens: the text that
    /// `tokenize` with `parse_special` turns into them.
    fn control_spellings(&self) -> Vec<String> {
        self.inner.tokenizer.control_spellings()
    }

    #[pyo3(signature = (ids, special = false))]
    fn detokenize(&self, ids: Vec<u32>, special: bool) -> PyResult<String> {
        self.check_ids(&ids)?;
        Ok(self.inner.tokenizer.detokenize(&ids, special))
    }

    #[pyo3(signature = (id, special = false))]
    fn token_to_piece<'py>(&self, py: Python<'py>, id: u32, special: bool) -> PyResult<Bound<'py, PyBytes>> {
        self.check_ids(&[id])?;
        Ok(PyBytes::new(py, self.inner.tokenizer.token_to_piece(id, special)))
    }

    fn is_eog(&self, id: u32) -> bool {
        self.inner.tokenizer.is_eog(id)
    }

    /// Teacher-forced logits of every position, as little-endian f32 bytes
    /// (rows of n_vocab); `ember.Model.logits` wraps them in a numpy array.
    fn logits<'py>(&self, py: Python<'py>, ids: Vec<u32>) -> PyResult<Bound<'py, PyBytes>> {
        self.check_ids(&ids)?;
        if ids.is_empty() {
            return Err(InvalidRequestError::new_err("ids is empty"));
        }
        let n_ctx = self.n_ctx.max(ids.len());
        let out = py
            .detach(|| {
                let mut s = self.inner.try_new_session(n_ctx, self.max_batch, self.kv_type)?;
                self.inner.prefill(&mut s, &ids, Logits::All)
            })
            .map_err(map_err)?;
        let bytes: Vec<u8> = out.iter().flat_map(|v| v.to_le_bytes()).collect();
        Ok(PyBytes::new(py, &bytes))
    }

    /// The final hidden state of every position (after the output norm, what
    /// the head reads), as little-endian f32 bytes in rows of n_embd: what
    /// `ember.Model.embed` pools.
    fn hidden_states<'py>(&self, py: Python<'py>, ids: Vec<u32>) -> PyResult<Bound<'py, PyBytes>> {
        self.check_ids(&ids)?;
        if ids.is_empty() {
            return Err(InvalidRequestError::new_err("ids is empty"));
        }
        let out = py
            .detach(|| {
                let mut s = self.inner.try_new_session(ids.len(), self.max_batch, self.kv_type)?;
                self.inner.prefill(&mut s, &ids, Logits::Hidden)
            })
            .map_err(map_err)?;
        let bytes: Vec<u8> = out.iter().flat_map(|v| v.to_le_bytes()).collect();
        Ok(PyBytes::new(py, &bytes))
    }

    /// A reranker's scores of `ids` (see `ember_model::Model::rank`): its
    /// classification head over the last position, one score a label.
    fn rank(&self, py: Python<'_>, ids: Vec<u32>) -> PyResult<Vec<f32>> {
        self.check_ids(&ids)?;
        if ids.is_empty() {
            return Err(InvalidRequestError::new_err("ids is empty"));
        }
        if self.inner.weights().classifier.is_none() {
            return Err(InvalidRequestError::new_err(
                "this model has no classification head (cls.output.weight): a reranker's file has one",
            ));
        }
        let n_embd = self.inner.config.n_embd;
        py.detach(|| {
            let mut s = self.inner.try_new_session(ids.len(), self.max_batch, self.kv_type)?;
            let rows = self.inner.prefill(&mut s, &ids, Logits::Hidden)?;
            Ok(self.inner.rank(&rows[rows.len() - n_embd..]).expect("the head was checked"))
        })
        .map_err(map_err)
    }

    /// How many labels a reranker's classification head scores; None without a head.
    #[getter]
    fn n_rank_labels(&self) -> Option<usize> {
        self.inner.weights().classifier.as_ref().map(|c| c.n_labels)
    }

    /// Starts a generation: reads the prompt, then yields (token, text, stop) per draw.
    fn generate(&self, py: Python<'_>, ids: Vec<u32>, options: &GenerateOptions) -> PyResult<Generator> {
        self.check_ids(&ids)?;
        let params = options.params_for(self.inner.config.n_vocab)?;
        let cache_prompt = options.cache_prompt;
        let model = self.inner.clone();
        let (n_ctx, max_batch, kv) = (self.n_ctx, self.max_batch, self.kv_type);
        // The slot the last generation left (taken, so two generations at
        // once never share a cache; the second simply starts fresh).
        let held = self.slot.lock().unwrap().take();
        let gen = py
            .detach(move || {
                let slot = match held {
                    Some(slot) => slot,
                    None => Slot::new(model.try_new_session(n_ctx, max_batch, kv)?),
                };
                if cache_prompt {
                    Generation::resume(model, slot, &ids, params)
                } else {
                    Generation::new(model, slot.session, &ids, params)
                }
            })
            .map_err(map_err)?;
        Ok(Generator { inner: std::sync::Mutex::new(Some(gen)), home: self.slot.clone() })
    }

    /// Forgets the tokens the cache holds: the next generation reads its whole prompt.
    fn clear_cache(&self) {
        *self.slot.lock().unwrap() = None;
    }

    /// Positions of the last conversation kept for the next request to reuse.
    #[getter]
    fn cached_tokens(&self) -> usize {
        self.slot.lock().unwrap().as_ref().map(|s| s.tokens.len()).unwrap_or(0)
    }

    /// Seconds to read `ids` (logits of the last position only) into a
    /// context already holding `depth`, read before the clock starts, as
    /// llama-bench's `pp` measures it; as llama-bench keeps its context from
    /// run to run, the context is kept for the next run of the same test.
    #[pyo3(signature = (ids, depth = Vec::new()))]
    fn bench_prompt(&self, py: Python<'_>, ids: Vec<u32>, depth: Vec<u32>) -> PyResult<f64> {
        self.check_ids(&ids)?;
        self.check_ids(&depth)?;
        let (max_batch, kv) = (self.max_batch, self.kv_type);
        py.detach(|| {
            let mut kept = self.bench.lock().unwrap();
            ember_model::bench::prompt_processing(&self.inner, &mut kept, &depth, &ids, max_batch, kv)
        })
            .map(|t| t.seconds)
            .map_err(map_err)
    }

    /// (weight bytes, cache bytes) that decoding a token reads after `depth`
    /// held positions, in this model's cache type.
    fn token_bytes(&self, depth: usize) -> (u64, u64) {
        let b = ember_model::bench::token_bytes(&self.inner, depth, self.kv_type);
        (b.weights, b.cache)
    }

    /// Multiply-adds of the products a pass of `n` tokens after `depth` held
    /// positions takes in attention: (scores, values).
    fn attention_work(&self, depth: usize, n: usize) -> (u64, u64) {
        let w = ember_model::bench::attention_work(&self.inner, depth, n);
        (w.scores, w.values)
    }

    /// Multiply-adds a second this model's threads issue at best in the
    /// instruction a prompt's attention meets this model's cache with
    /// (`None` for a Q8_0 cache).
    fn product_rate(&self, py: Python<'_>) -> Option<f64> {
        let kv = self.kv_type;
        py.detach(|| ember_model::bench::product_rate(&self.inner, kv))
    }

    /// Multiply-adds of the weights' products in a pass of `n` tokens that
    /// asks for the last one's logits.
    fn weight_work(&self, n: usize) -> u64 {
        ember_model::bench::weight_work(&self.inner, n)
    }

    /// Multiply-adds a second this model's threads issue at best in the
    /// instruction the weight products take their 8-bit activations with.
    fn byte_product_rate(&self, py: Python<'_>) -> f64 {
        py.detach(|| ember_model::bench::byte_product_rate(&self.inner))
    }

    /// Bytes a second this model's threads re-read a buffer of `bytes` at best.
    fn stream_rate(&self, py: Python<'_>, bytes: u64) -> f64 {
        py.detach(|| ember_model::bench::stream_rate(&self.inner, bytes))
    }

    /// Seconds to decode `n` tokens one at a time after `depth`, as
    /// llama-bench's `tg` measures it.
    #[pyo3(signature = (first, n, depth = Vec::new()))]
    fn bench_generation(&self, py: Python<'_>, first: u32, n: usize, depth: Vec<u32>) -> PyResult<f64> {
        self.check_ids(&[first])?;
        self.check_ids(&depth)?;
        let (max_batch, kv) = (self.max_batch, self.kv_type);
        py.detach(|| {
            let mut kept = self.bench.lock().unwrap();
            ember_model::bench::text_generation(&self.inner, &mut kept, &depth, first, n, max_batch, kv)
        })
            .map(|t| t.seconds)
            .map_err(map_err)
    }
}

/// Puts every layer of `model` on the device named `name` ("" for the
/// preferred one). Returns why it stays on the CPU where that is allowed
/// (`strict` false), or raises.
fn place(model: &mut ember_model::Model, name: &str, gpu_layers: i64, kv: KvType, strict: bool) -> PyResult<Option<String>> {
    let n_layer = model.config.n_layer;
    if gpu_layers >= 0 && (gpu_layers as usize) < n_layer {
        return Err(InvalidRequestError::new_err(format!(
            "gpu_layers {gpu_layers}: ember runs every layer of a model on the device or none, and this model has \
             {n_layer} (give all, -1 or {n_layer} and up for the device, 0 for the CPU)"
        )));
    }
    if ember_model::device_kv_format(kv).is_none() {
        return Err(InvalidRequestError::new_err(format!(
            "a KV cache of type {} is held on the CPU only; on a device the cache is f16 or q8_0",
            kv.name()
        )));
    }
    let refuse_or_note = |why: String| if strict { Err(DeviceError::new_err(why)) } else { Ok(Some(why)) };
    let gpu = match ember_gpu::Gpu::open((!name.is_empty()).then_some(name)) {
        Ok(g) => Arc::new(g),
        Err(e) => return refuse_or_note(e.to_string()),
    };
    let info = gpu.info();
    if name.is_empty() && info.kind == ember_model::DeviceKind::Cpu {
        // A Vulkan device that is itself the CPU (Mesa's lavapipe) runs the
        // model far slower than ember's own kernels: taken only by name.
        return Ok(Some(format!(
            "the only Vulkan device, {} ({}), runs on the CPU itself, slower than ember's CPU kernels; \
             name it with --device {} to use it all the same",
            info.name, info.description, info.name
        )));
    }
    match model.place_on(gpu) {
        Ok(()) => Ok(None),
        Err(ModelError::Device(why)) => refuse_or_note(why),
        Err(e) => Err(map_err(e)),
    }
}

impl Model {
    fn check_ids(&self, ids: &[u32]) -> PyResult<()> {
        let n = self.inner.config.n_vocab;
        match ids.iter().find(|&&id| id as usize >= n) {
            Some(id) => Err(InvalidRequestError::new_err(format!(
                "token id {id} is out of range (the vocabulary has {n} tokens)"
            ))),
            None => Ok(()),
        }
    }
}

/// Iterator of (token id, text, stop reason or None, logprob or None, top logprobs).
/// When it is dropped, its session goes back to the model's slot with the
/// tokens it holds, for the next generation to reuse.
#[pyclass(module = "ember._native")]
struct Generator {
    inner: std::sync::Mutex<Option<Generation>>,
    home: Arc<std::sync::Mutex<Option<Slot>>>,
}

impl Drop for Generator {
    fn drop(&mut self) {
        let gen = self.inner.get_mut().map(Option::take).unwrap_or(None);
        if let (Some(gen), Ok(mut home)) = (gen, self.home.lock()) {
            *home = Some(gen.into_slot());
        }
    }
}

#[pymethods]
impl Generator {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Option<Draw>> {
        if let Err(e) = py.check_signals() {
            *self.inner.lock().unwrap() = None;
            return Err(e);
        }
        let mut guard = self.inner.lock().unwrap();
        let Some(gen) = guard.as_mut() else {
            return Ok(None);
        };
        let step = py.detach(|| gen.next_step()).map_err(map_err)?;
        Ok(step.map(|s| Draw { token: s.token, text: s.text, stop: s.stop.map(batcher::stop_name), logprob: s.logprob, top: s.top }))
    }

    #[getter]
    fn n_prompt(&self) -> usize {
        self.inner.lock().unwrap().as_ref().map(|g| g.n_prompt()).unwrap_or(0)
    }
    #[getter]
    fn n_generated(&self) -> usize {
        self.inner.lock().unwrap().as_ref().map(|g| g.n_generated()).unwrap_or(0)
    }
    /// Prompt positions reused from the cache instead of read.
    #[getter]
    fn n_cached(&self) -> usize {
        self.inner.lock().unwrap().as_ref().map(|g| g.n_cached()).unwrap_or(0)
    }
}

/// One drawn token of a generation: its `text`, and `stop` on the last.
#[pyclass(module = "ember._native", frozen, get_all)]
struct Draw {
    token: u32,
    text: String,
    /// "stop", "length" or "context" on the last draw
    stop: Option<&'static str>,
    logprob: Option<f32>,
    /// the most likely tokens with their log-probabilities, when asked for
    top: Vec<(u32, f32)>,
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<Model>()?;
    m.add_class::<Generator>()?;
    m.add_class::<batcher::Batcher>()?;
    m.add_class::<batcher::SlotStep>()?;
    m.add_class::<batcher::Started>()?;
    m.add_class::<Draw>()?;
    m.add_class::<grammar::Grammar>()?;
    m.add_class::<GenerateOptions>()?;
    m.add_function(wrap_pyfunction!(grammar::json_schema_to_gbnf, m)?)?;
    m.add_function(wrap_pyfunction!(grammar::json_schema_rules, m)?)?;
    m.add_function(wrap_pyfunction!(inspect, m)?)?;
    m.add_function(wrap_pyfunction!(simd_level, m)?)?;
    m.add_function(wrap_pyfunction!(list_devices, m)?)?;
    // The longest close (and message) a thought budget may force: one run of forced tokens.
    m.add("MAX_FORCED_RUN", ember_model::generate::MAX_FORCED_RUN)?;
    m.add("EmberError", py.get_type::<EmberError>())?;
    m.add("ModelLoadError", py.get_type::<ModelLoadError>())?;
    m.add("InvalidRequestError", py.get_type::<InvalidRequestError>())?;
    m.add("ContextFullError", py.get_type::<ContextFullError>())?;
    m.add("GrammarError", py.get_type::<GrammarError>())?;
    m.add("InvalidSchemaError", py.get_type::<InvalidSchemaError>())?;
    m.add("DeviceError", py.get_type::<DeviceError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
