//! The prompt cache of a slot: a request that shares a prefix with what the
//! slot holds reads only the rest, and gets what a fresh read would give.
//! Tiny gemma3 (window 8) makes the sliding-window ring wrap within a few
//! passes, so both a rewind the ring allows and one it does not are covered.

mod common;

use common::tiny_model;

use std::sync::Arc;

use ember_model::{GenerateParams, Generation, KvType, LoadOptions, Logits, Model, Slot};
use ember_sample::SamplingParams;

fn tokens(n: usize, salt: u32, n_vocab: usize) -> Vec<u32> {
    (0..n as u32).map(|i| (7 + i * 31 + salt * 101) % n_vocab as u32).collect()
}

/// A slot that read `held`, then cut back for `prompt` and read the rest,
/// against a fresh read of `prompt`: the last logits, bit for bit, and the
/// positions that were reused.
fn resume_vs_fresh(model: &Model, held: &[u32], prompt: &[u32], max_batch: usize) -> (usize, f32) {
    let mut slot = Slot::new(model.new_session(64, max_batch, KvType::F16));
    model.prefill(&mut slot.session, held, Logits::None).unwrap();
    slot.tokens = held.to_vec();
    let kept = slot.reuse_prefix(prompt);
    let resumed = model.prefill(&mut slot.session, &prompt[kept..], Logits::Last).unwrap();
    let mut fresh = model.new_session(64, max_batch, KvType::F16);
    let want = model.prefill(&mut fresh, prompt, Logits::Last).unwrap();
    let diff = resumed.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
    (kept, diff)
}

#[test]
fn a_shared_prefix_is_reused_and_gives_a_fresh_reads_logits() {
    for arch in ["llama", "gemma3", "qwen3moe", "gemma4"] {
        let Some(path) = tiny_model(arch) else { return };
        let model = Model::load(&path, LoadOptions::default()).unwrap();
        let n_vocab = model.config.n_vocab;
        let held = tokens(30, 0, n_vocab);
        // Grows the conversation: everything held is reused.
        let mut grown = held.clone();
        grown.extend(tokens(9, 1, n_vocab));
        let (kept, diff) = resume_vs_fresh(&model, &held, &grown, 7);
        assert_eq!((kept, diff), (30, 0.0), "{arch}: appending");
        // Parts from it at 25: within gemma3's ring (window 8 + batch 7 rows).
        let mut parted = held[..25].to_vec();
        parted.extend(tokens(6, 2, n_vocab));
        let (kept, diff) = resume_vs_fresh(&model, &held, &parted, 7);
        assert_eq!((kept, diff), (25, 0.0), "{arch}: rewinding within the window");
        // The same prompt again: its last token is read again for its logits.
        let (kept, diff) = resume_vs_fresh(&model, &held, &held, 7);
        assert_eq!((kept, diff), (29, 0.0), "{arch}: repeating");
    }
}

#[test]
fn a_rewind_past_the_ring_reads_again_from_the_start() {
    let Some(path) = tiny_model("gemma3") else {
        return;
    };
    let model = Model::load(&path, LoadOptions::default()).unwrap();
    let n_vocab = model.config.n_vocab;
    let held = tokens(40, 0, n_vocab);
    let mut parted = held[..12].to_vec();
    parted.extend(tokens(5, 3, n_vocab));
    let (kept, diff) = resume_vs_fresh(&model, &held, &parted, 7);
    assert_eq!((kept, diff), (0, 0.0));
    // A model without windows keeps the prefix wherever it parts.
    let Some(path) = tiny_model("llama") else {
        return;
    };
    let model = Model::load(&path, LoadOptions::default()).unwrap();
    let (kept, diff) = resume_vs_fresh(&model, &held, &parted, 7);
    assert_eq!((kept, diff), (12, 0.0));
}

/// A stateless client sends the whole conversation each turn: the second turn
/// reuses the first turn's prompt and answer, and answers as a fresh slot does.
#[test]
fn a_generation_hands_its_tokens_to_the_next() {
    let Some(path) = tiny_model("gemma3") else {
        return;
    };
    let model = Arc::new(Model::load(&path, LoadOptions::default()).unwrap());
    let n_vocab = model.config.n_vocab;
    let greedy = GenerateParams {
        max_tokens: 6,
        ignore_eos: true,
        n_probs: 0,
        post_sampling_probs: false,
        sampling: SamplingParams { temperature: 0.0, ..Default::default() },
        grammar: None,
        grammar_trigger: None,
        thought_budget: None,
    };
    let run = |g: &mut Generation| -> Vec<u32> {
        let mut out = Vec::new();
        while let Some(step) = g.next_step().unwrap() {
            out.push(step.token);
        }
        out
    };
    let turn1 = tokens(20, 0, n_vocab);
    let mut g =
        Generation::resume(model.clone(), Slot::new(model.new_session(64, 7, KvType::F16)), &turn1, greedy.clone())
            .unwrap();
    assert_eq!(g.n_cached(), 0);
    let answer = run(&mut g);
    let slot = g.into_slot();
    // Every drawn token but the last was fed back.
    assert_eq!(slot.tokens.len(), turn1.len() + answer.len() - 1);
    let mut turn2 = turn1.clone();
    turn2.extend(&answer);
    turn2.extend(tokens(4, 5, n_vocab));
    let mut resumed = Generation::resume(model.clone(), slot, &turn2, greedy.clone()).unwrap();
    assert_eq!(resumed.n_cached(), turn1.len() + answer.len() - 1);
    let mut fresh = Generation::new(model.clone(), model.new_session(64, 7, KvType::F16), &turn2, greedy).unwrap();
    assert_eq!(run(&mut resumed), run(&mut fresh));
}
