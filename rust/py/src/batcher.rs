//! `ember._native.Batcher`: the slots of a server and the step that runs one
//! pass over all of them, for the engine thread to drive.

use std::sync::Mutex;

use ember_kv::CheckpointPolicy;
use ember_model::batch::{Batcher as Inner, Resume, SlotEvent};
use ember_model::StopReason;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::{map_err, GenerateOptions, InvalidRequestError, Model};

/// What one slot did in a step: drew `token` (its `text`, and `stop` on the
/// last), ended without drawing (`token` None), or failed (`error` set).
#[pyclass(module = "ember._native", frozen, get_all)]
pub(crate) struct SlotStep {
    slot: usize,
    token: Option<u32>,
    text: String,
    /// "stop", "length" or "context" on the last step
    stop: Option<&'static str>,
    logprob: Option<f32>,
    /// the most likely tokens with their log-probabilities, when asked for
    top: Vec<(u32, f32)>,
    error: Option<Py<PyAny>>,
}

impl SlotStep {
    fn ended(slot: usize, stop: Option<&'static str>, error: Option<Py<PyAny>>) -> SlotStep {
        SlotStep { slot, token: None, text: String::new(), stop, logprob: None, top: Vec::new(), error }
    }
}

/// How a slot took its prompt: the positions it reused, and (when it held
/// something) how the prompt met it, as the request's log line says it.
#[pyclass(module = "ember._native", frozen, get_all)]
pub(crate) struct Started {
    n_cached: usize,
    resume: Option<String>,
}

#[pyclass(module = "ember._native")]
pub(crate) struct Batcher {
    inner: Mutex<Inner>,
    n_ctx: usize,
    n_vocab: usize,
}

pub(crate) fn stop_name(r: StopReason) -> &'static str {
    match r {
        StopReason::EndOfGeneration => "stop",
        StopReason::Length => "length",
        StopReason::ContextFull => "context",
    }
}

#[pymethods]
impl Batcher {
    /// `n_slots` slots of `n_ctx` positions each over `model`'s weights
    /// (`unified`: sharing one context of `n_ctx` positions, see
    /// `ember_model::batch::Batcher::new_unified`); prompts are read `chunk`
    /// tokens per slot per pass.
    #[new]
    #[pyo3(signature = (model, n_slots, n_ctx, chunk, unified = false))]
    fn new(
        py: Python<'_>,
        model: &Model,
        n_slots: usize,
        n_ctx: usize,
        chunk: usize,
        unified: bool,
    ) -> PyResult<Batcher> {
        if n_slots == 0 || n_ctx == 0 || chunk == 0 {
            return Err(InvalidRequestError::new_err("n_slots, n_ctx and chunk must be at least 1"));
        }
        let (m, kv) = (model.inner.clone(), model.kv_type);
        let n_vocab = m.config.n_vocab;
        let inner = py
            .detach(move || {
                if unified {
                    Inner::new_unified(m, n_slots, n_ctx, chunk, kv)
                } else {
                    Inner::new(m, n_slots, n_ctx, chunk, kv)
                }
            })
            .map_err(map_err)?;
        Ok(Batcher { inner: Mutex::new(inner), n_ctx, n_vocab })
    }

    /// Ends the thought of the request in `slot` at its next draw; False
    /// where there is none to end (see `ember_model::batch::Batcher::end_thought`).
    fn end_thought(&self, slot: usize) -> bool {
        self.inner.lock().unwrap().end_thought(slot)
    }

    #[getter]
    fn n_slots(&self) -> usize {
        self.inner.lock().unwrap().n_slots()
    }

    /// Positions each slot holds at most.
    #[getter]
    fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// Bytes every slot's keys and values take, wherever they are held.
    #[getter]
    fn cache_bytes(&self) -> usize {
        self.inner.lock().unwrap().cache_bytes()
    }

    /// The free slot for `ids` (llama-server's rule), or None when all are busy.
    /// The free slot for `ids`; `owner` tells apart whose prompts a slot
    /// holds (0: everyone's, a server without keys), only its own counting.
    #[pyo3(signature = (ids, owner = 0))]
    fn choose_slot(&self, ids: Vec<u32>, owner: u64) -> Option<usize> {
        self.inner.lock().unwrap().choose_slot_of(owner, &ids)
    }

    fn is_busy(&self, slot: usize) -> bool {
        let b = self.inner.lock().unwrap();
        slot < b.n_slots() && b.is_busy(slot)
    }

    /// Copies what slot `from` holds into idle slot `to` (one prompt read
    /// once for several answers).
    fn fork(&self, py: Python<'_>, from: usize, to: usize) -> PyResult<()> {
        py.detach(|| self.inner.lock().unwrap().fork(from, to)).map_err(map_err)
    }

    fn any_busy(&self) -> bool {
        self.inner.lock().unwrap().any_busy()
    }

    /// Tokens slot `slot` holds in its cache.
    fn cached_tokens(&self, slot: usize) -> PyResult<usize> {
        let b = self.inner.lock().unwrap();
        if slot >= b.n_slots() {
            return Err(InvalidRequestError::new_err(format!("no slot {slot}")));
        }
        Ok(b.cached_tokens(slot).len())
    }

    /// Places a request in free slot `slot`; returns the prompt positions
    /// reused from its cache, and how they were (a line for the log; None
    /// when nothing was held). The prompt is read by the next steps; a
    /// hybrid's read takes a checkpoint at each of `hints`.
    #[pyo3(signature = (slot, ids, options, hints = Vec::new(), owner = 0))]
    fn start(
        &self,
        slot: usize,
        ids: Vec<u32>,
        options: &GenerateOptions,
        hints: Vec<usize>,
        owner: u64,
    ) -> PyResult<Started> {
        let params = options.params_for(self.n_vocab)?;
        let started = self
            .inner
            .lock()
            .unwrap()
            .start_as(owner, slot, &ids, params, options.cache_prompt, &hints)
            .map_err(map_err)?;
        let resume = (started.resume != Resume::Fresh || started.n_cached > 0).then(|| started.resume.to_string());
        Ok(Started { n_cached: started.n_cached, resume })
    }

    /// How many checkpoints of its recurrent states each slot keeps, every
    /// how many positions of a long prompt, and how far apart at least.
    fn set_checkpoints(&self, max: usize, interval: usize, min_step: usize) {
        self.inner.lock().unwrap().set_checkpoints(CheckpointPolicy { max, interval, min_step });
    }

    /// Prompt tokens one slot reads in a pass, at most the pass size the
    /// batcher was made with (its caches keep that layout).
    fn set_chunk(&self, chunk: usize) {
        self.inner.lock().unwrap().set_chunk(chunk);
    }

    /// The share of a prompt (0 to 1) a free slot must already hold to be
    /// chosen for it; 0 ignores what slots hold.
    fn set_slot_similarity(&self, share: f64) {
        self.inner.lock().unwrap().set_slot_similarity((share.clamp(0.0, 1.0) * 1000.0).round() as usize);
    }

    /// Bytes of one checkpoint (every recurrent state of a slot; 0 for a
    /// model without them).
    #[getter]
    fn checkpoint_bytes(&self) -> usize {
        self.inner.lock().unwrap().checkpoint_bytes()
    }

    /// Slot `slot`'s checkpoints: (position, why it was taken).
    fn checkpoints(&self, slot: usize) -> PyResult<Vec<(usize, &'static str)>> {
        let b = self.inner.lock().unwrap();
        if slot >= b.n_slots() {
            return Err(InvalidRequestError::new_err(format!("no slot {slot}")));
        }
        Ok(b.checkpoints(slot).into_iter().map(|(p, t)| (p, t.name())).collect())
    }

    /// What went into the last pass: (slot, tokens, whether they were prompt).
    fn last_pass(&self) -> Vec<(usize, usize, bool)> {
        self.inner.lock().unwrap().last_pass().iter().map(|p| (p.slot, p.tokens, p.prompt)).collect()
    }

    /// Idle slot `slot`'s cache and tokens as bytes, and the tokens saved.
    fn save_slot<'py>(&self, py: Python<'py>, slot: usize) -> PyResult<(Bound<'py, PyBytes>, usize)> {
        let (bytes, n) = py.detach(|| self.inner.lock().unwrap().save_slot(slot)).map_err(map_err)?;
        Ok((PyBytes::new(py, &bytes), n))
    }

    /// Loads bytes from `save_slot` into idle slot `slot`, as `owner`'s
    /// tokens; the tokens restored.
    #[pyo3(signature = (slot, state, owner = 0))]
    fn restore_slot(&self, py: Python<'_>, slot: usize, state: Vec<u8>, owner: u64) -> PyResult<usize> {
        py.detach(|| self.inner.lock().unwrap().restore_slot_as(owner, slot, &state)).map_err(map_err)
    }

    /// Forgets what idle slot `slot` holds; the tokens dropped.
    fn erase_slot(&self, slot: usize) -> PyResult<usize> {
        self.inner.lock().unwrap().erase_slot(slot).map_err(map_err)
    }

    /// Bytes of host memory for conversations whose slot went to another (0: none).
    fn set_host_cache(&self, bytes: usize) {
        self.inner.lock().unwrap().set_host_cache(bytes);
    }

    /// (conversations, bytes) held in the host prompt cache.
    fn host_cache_usage(&self) -> (usize, usize) {
        self.inner.lock().unwrap().host_cache_usage()
    }

    /// Ends slot `slot`'s request; its cache keeps what was fed.
    fn cancel(&self, slot: usize) {
        self.inner.lock().unwrap().cancel(slot);
    }

    /// One pass over every busy slot (the GIL released meanwhile): what each
    /// slot that drew, ended without drawing or failed did.
    fn step(&self, py: Python<'_>) -> Vec<SlotStep> {
        let events = py.detach(|| self.inner.lock().unwrap().step());
        events
            .into_iter()
            .map(|(slot, ev)| match ev {
                SlotEvent::Step(s) => SlotStep {
                    slot,
                    token: Some(s.token),
                    text: s.text,
                    stop: s.stop.map(stop_name),
                    logprob: s.logprob,
                    top: s.top,
                    error: None,
                },
                SlotEvent::Done => SlotStep::ended(slot, Some("length"), None),
                SlotEvent::Failed(e) => SlotStep::ended(slot, None, Some(map_err(e).into_value(py).into_any())),
            })
            .collect()
    }
}
