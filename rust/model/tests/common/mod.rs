//! Shared by the model tests: where the test models and llama.cpp's reference
//! outputs live, and how a difference from the reference is measured.

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::Arc;

use ember_model::{GenerateParams, LoadOptions, Model};
use ember_sample::SamplingParams;
use serde_json::Value;

pub const SMOLLM2: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
pub const GEMMA3: &str = "gemma-3-270m-q4_k_m.gguf";

/// A test model, or `None` when model tests are skipped on purpose
/// (`EMBER_SKIP_MODEL_TESTS=1`). A missing file is a failure that says how to fetch it.
pub fn model_path(file: &str) -> Option<PathBuf> {
    if std::env::var("EMBER_SKIP_MODEL_TESTS").is_ok_and(|v| v == "1") {
        return None;
    }
    let dir = std::env::var_os("EMBER_TEST_MODELS").map(PathBuf::from).unwrap_or_else(|| {
        let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_default();
        home.join(".cache/ember/models")
    });
    let p = dir.join(file);
    assert!(
        p.is_file(),
        "test model {} is missing: run `python tests/fetch_test_models.py` (or set EMBER_TEST_MODELS)",
        p.display()
    );
    Some(p)
}

/// A tiny random-weight model (`tests/fixtures/make_tiny_models.py` writes
/// them), or `None` when model tests are skipped on purpose.
/// Every tiny model `tests/fixtures/make_tiny_models.py` writes with
/// llama.cpp's reference beside it (`tests/fixtures/tiny`): all but the
/// type variant a device refuses (`llamaq8k`).
pub const TINY_ARCHS: [&str; 15] = [
    "llama",
    "qwen2",
    "qwen3",
    "gemma3",
    "llama31",
    "llamamoe",
    "qwen3moe",
    "gemma4",
    "gemma4moe",
    "phi3",
    "phi3long",
    "qwen3yarn",
    "qwen35",
    "qwen35f32",
    "qwen35moe",
];

pub fn tiny_model(arch: &str) -> Option<PathBuf> {
    if std::env::var("EMBER_SKIP_MODEL_TESTS").is_ok_and(|v| v == "1") {
        return None;
    }
    let dir = std::env::var_os("EMBER_TINY_MODELS").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/ember/tiny-models")
    });
    let p = dir.join(format!("tiny-{arch}.gguf"));
    assert!(p.is_file(), "{} is missing: run `python tests/fixtures/make_tiny_models.py`", p.display());
    Some(p)
}

pub fn golden(file: &str) -> Value {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden").join(file);
    serde_json::from_str(&std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))).unwrap()
}

pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

/// Below this gap between llama.cpp's own top two logits, the reference's
/// choice is decided by its summation order (ggml tiles some products and not
/// others): a kernel that adds the same terms in another order may pick the
/// runner-up, which says nothing about its correctness.
pub const TIE_MARGIN: f64 = 0.1;

/// Agreement with llama.cpp over teacher-forced positions.
#[derive(Default, Debug)]
pub struct Agreement {
    pub positions: usize,
    pub argmax_equal: usize,
    /// Positions where llama.cpp's top-1 leads its top-2 by 1.0 or more.
    pub confident: usize,
    pub confident_equal: usize,
    /// Positions where llama.cpp's top two are at least [`TIE_MARGIN`] apart.
    pub decided: usize,
    pub decided_equal: usize,
    pub abs_diff_sum: f64,
    pub abs_diff_n: usize,
    pub max_abs_diff: f64,
}

impl Agreement {
    /// Adds one position: `ours` is the full logit row, `reference` a golden `positions` entry.
    pub fn add(&mut self, ours: &[f32], reference: &Value) {
        let top_ids = ids(&reference["top_ids"]);
        let top: Vec<f64> = reference["top_logits"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
        let argmax =
            ours.iter().enumerate().fold((0usize, f32::NEG_INFINITY), |b, (i, &v)| if v > b.1 { (i, v) } else { b }).0;
        self.positions += 1;
        let equal = argmax as u32 == top_ids[0];
        self.argmax_equal += equal as usize;
        if top[0] - top[1] >= 1.0 {
            self.confident += 1;
            self.confident_equal += equal as usize;
        }
        if top[0] - top[1] >= TIE_MARGIN {
            self.decided += 1;
            self.decided_equal += equal as usize;
        }
        for (&id, &l) in top_ids.iter().zip(&top) {
            let d = (ours[id as usize] as f64 - l).abs();
            self.abs_diff_sum += d;
            self.abs_diff_n += 1;
            self.max_abs_diff = self.max_abs_diff.max(d);
        }
    }

    pub fn mean_abs_diff(&self) -> f64 {
        self.abs_diff_sum / self.abs_diff_n.max(1) as f64
    }
    pub fn argmax_rate(&self) -> f64 {
        self.argmax_equal as f64 / self.positions.max(1) as f64
    }
    pub fn decided_rate(&self) -> f64 {
        self.decided_equal as f64 / self.decided.max(1) as f64
    }

    pub fn report(&self, what: &str) -> String {
        format!(
            "{what}: argmax equal at {}/{} positions ({:.1}%), decided (top-2 gap >= {TIE_MARGIN}) {}/{}, confident {}/{}, mean |diff| over llama.cpp's top-20 {:.4} (max {:.3})",
            self.argmax_equal,
            self.positions,
            100.0 * self.argmax_rate(),
            self.decided_equal,
            self.decided,
            self.confident_equal,
            self.confident,
            self.mean_abs_diff(),
            self.max_abs_diff
        )
    }

    /// The parity gate: every confident position agrees, 97% of the decided
    /// ones (and 90% of all) agree, mean diff below 0.35.
    pub fn check(&self, what: &str) {
        self.check_within(what, 0.35)
    }

    /// [`Agreement::check`] with a tighter bound on the mean diff, for models
    /// whose reference sits well inside the general one (a part of the
    /// forward pass that moves every logit a little would pass 0.35).
    pub fn check_within(&self, what: &str, max_mean_diff: f64) {
        let r = self.report(what);
        println!("{r}");
        assert_eq!(self.confident_equal, self.confident, "{r}");
        assert!(self.decided_rate() >= 0.97, "{r}");
        assert!(self.argmax_rate() >= 0.90, "{r}");
        assert!(self.mean_abs_diff() < max_mean_diff, "{r}");
    }
}

/// llama.cpp's logits on a tiny model's fixture prompt
/// (`tests/fixtures/tiny/{arch}.json`, written by make_tiny_reference.py).
#[allow(dead_code)]
pub fn tiny_fixture(arch: &str) -> Value {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("../../tests/fixtures/tiny/{arch}.json"));
    serde_json::from_str(&std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))).unwrap()
}

/// A tiny model loaded (see [`tiny_model`]).
pub fn tiny(arch: &str) -> Option<Arc<Model>> {
    tiny_model(arch).map(|p| Arc::new(Model::load(p, LoadOptions::default()).unwrap()))
}

/// `n` prompt tokens of the vocabulary's first `n_vocab`, another run for each `salt`.
pub fn tokens(n: usize, salt: u32, n_vocab: usize) -> Vec<u32> {
    (0..n as u32).map(|i| (3 + i * 37 + salt * 211) % n_vocab as u32).collect()
}

/// Greedy draws of `max_tokens` (the end of generation ignored), each with
/// the log-probabilities of the `n_probs` most likely tokens.
pub fn greedy(max_tokens: usize, n_probs: usize) -> GenerateParams {
    GenerateParams {
        max_tokens,
        ignore_eos: true,
        n_probs,
        post_sampling_probs: false,
        sampling: SamplingParams { temperature: 0.0, ..Default::default() },
        grammar: None,
        grammar_trigger: None,
        thought_budget: None,
    }
}

/// A drawn token, its log-probability and the most likely ones'.
#[allow(dead_code)]
pub type Draw = (u32, Option<f32>, Vec<(u32, f32)>);

/// Starts `prompt` in `slot` of `b` and steps until that slot is done:
/// what it drew, and how its prompt met the slot (a failed request fails
/// the test).
#[allow(dead_code)]
pub fn ask_slot(
    b: &mut ember_model::batch::Batcher,
    slot: usize,
    prompt: &[u32],
    params: GenerateParams,
    hints: &[usize],
) -> (Vec<Draw>, ember_model::batch::Started) {
    let started = b.start(slot, prompt, params, true, hints).unwrap();
    let mut draws = Vec::new();
    while b.is_busy(slot) {
        for (s, ev) in b.step() {
            match ev {
                ember_model::batch::SlotEvent::Step(st) if s == slot => draws.push((st.token, st.logprob, st.top)),
                ember_model::batch::SlotEvent::Failed(e) => panic!("slot {s} failed: {e}"),
                _ => {}
            }
        }
    }
    (draws, started)
}

/// Steps `b` until no slot is busy: the tokens each of its slots drew (a
/// failed request fails the test).
#[allow(dead_code)]
pub fn step_until_idle(b: &mut ember_model::batch::Batcher) -> Vec<Vec<u32>> {
    step_until_idle_drawing(b).into_iter().map(|d| d.into_iter().map(|(t, ..)| t).collect()).collect()
}

/// [`step_until_idle`], with each token's log-probabilities.
#[allow(dead_code)]
pub fn step_until_idle_drawing(b: &mut ember_model::batch::Batcher) -> Vec<Vec<Draw>> {
    let mut drawn = vec![Vec::new(); b.n_slots()];
    while b.any_busy() {
        for (slot, ev) in b.step() {
            match ev {
                ember_model::batch::SlotEvent::Step(s) => drawn[slot].push((s.token, s.logprob, s.top)),
                ember_model::batch::SlotEvent::Failed(e) => panic!("slot {slot}: {e}"),
                ember_model::batch::SlotEvent::Done => {}
            }
        }
    }
    drawn
}
