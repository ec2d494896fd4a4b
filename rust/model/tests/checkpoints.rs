//! A hybrid's slot and its checkpoints: a prompt that parts from what the
//! slot holds resumes from the newest checkpoint at or before the parting,
//! with the answer a fresh slot gives (bit for bit from a checkpoint on the
//! delta rule's grid, to rounding from one off it), and each of the ways
//! such a resume has gone wrong elsewhere is held here.

mod common;

use common::{tiny, tokens, Draw};

use std::sync::Arc;

use ember_kv::{CheckpointPolicy, RestoreRefused, Taken};
use ember_model::batch::{Batcher, Resume, SlotEvent};
use ember_model::{GenerateParams, KvType, Model};

/// Greedy draws with their log-probabilities: equal logits give equal
/// figures to the bit, and other rounding almost surely does not.
fn greedy(max_tokens: usize) -> GenerateParams {
    common::greedy(max_tokens, 4)
}

const POLICY: CheckpointPolicy = CheckpointPolicy { max: 8, interval: 64, min_step: 0 };

/// One slot of 512 positions, prompts read 16 tokens a pass.
fn batcher(model: &Arc<Model>, policy: CheckpointPolicy) -> Batcher {
    let mut b = Batcher::new(model.clone(), 2, 512, 16, KvType::F16).expect("slots");
    b.set_checkpoints(policy);
    b
}

/// What a request drew, and how its prompt met the slot.
struct Answer {
    draws: Vec<Draw>,
    n_cached: usize,
    resume: Resume,
}

fn ask(b: &mut Batcher, slot: usize, prompt: &[u32], hints: &[usize]) -> Answer {
    let (draws, started) = common::ask_slot(b, slot, prompt, greedy(6), hints);
    Answer { draws, n_cached: started.n_cached, resume: started.resume }
}

fn fresh(model: &Arc<Model>, prompt: &[u32], hints: &[usize]) -> Answer {
    ask(&mut batcher(model, POLICY), 0, prompt, hints)
}

fn positions(b: &Batcher, slot: usize) -> Vec<usize> {
    b.checkpoints(slot).into_iter().map(|(p, _)| p).collect()
}

/// The tokens drawn agree, and every log-probability within `tol`.
fn close(a: &Answer, b: &Answer, tol: f32) -> bool {
    a.draws.len() == b.draws.len()
        && a.draws.iter().zip(&b.draws).all(|(x, y)| {
            x.0 == y.0
                && (x.1.unwrap() - y.1.unwrap()).abs() <= tol
                && x.2.iter().zip(&y.2).all(|(p, q)| p.0 == q.0 && (p.1 - q.1).abs() <= tol)
        })
}

/// A sheet followed by tokens of its own: prompts of other salts part where the sheet ends.
fn then(sheet: &[u32], salt: u32, len: usize, n_vocab: usize) -> Vec<u32> {
    [sheet, &tokens(len - sheet.len(), salt, n_vocab)[..]].concat()
}

/// `prompt` up to `at`, then other tokens.
fn parted(prompt: &[u32], at: usize, salt: u32, len: usize, n_vocab: usize) -> Vec<u32> {
    let mut p = prompt[..at].to_vec();
    p.extend(tokens(len - at, salt, n_vocab));
    assert_ne!(p[at], prompt[at]);
    p
}

/// The interval checkpoints lie on the grid the delta rule's chunks lie on:
/// taking them changes no answer, and a prompt resumed from one gets the
/// answer a fresh slot gives, bit for bit.
#[test]
fn a_prompt_resumed_on_the_grid_gets_a_fresh_slots_answer_exactly() {
    for arch in ["qwen35f32", "qwen35", "qwen35moe"] {
        let Some(model) = tiny(arch) else { return };
        let n = model.config.n_vocab;
        let first = tokens(200, 1, n);
        let unchecked = ask(&mut batcher(&model, CheckpointPolicy::default()), 0, &first, &[]);
        let mut b = batcher(&model, POLICY);
        let a = ask(&mut b, 0, &first, &[]);
        assert_eq!(a.draws, unchecked.draws, "{arch}: taking checkpoints changed the answer");
        assert_eq!(positions(&b, 0), [64, 128, 192], "{arch}");

        let second = parted(&first, 150, 7, 260, n);
        let got = ask(&mut b, 0, &second, &[]);
        assert_eq!(got.resume, Resume::Restored { parted: 150, pos: 128, taken: Taken::Interval }, "{arch}");
        assert_eq!(got.n_cached, 128);
        assert_eq!(got.draws, fresh(&model, &second, &[]).draws, "{arch}: resumed at 128");
    }
}

/// A checkpoint is taken where a prompt parted from what the slot held; the
/// next prompt that parts there resumes from it, with a fresh slot's answer
/// to rounding (the chunk it cuts is summed in two parts).
#[test]
fn a_prompt_that_parts_where_the_last_one_did_resumes_there() {
    for arch in ["qwen35f32", "qwen35"] {
        let Some(model) = tiny(arch) else { return };
        let n = model.config.n_vocab;
        let sheet = tokens(150, 2, n);
        let mut b = batcher(&model, CheckpointPolicy { interval: 0, ..POLICY });
        ask(&mut b, 0, &then(&sheet, 3, 180, n), &[]);
        let second = ask(&mut b, 0, &then(&sheet, 4, 190, n), &[]);
        assert_eq!(second.resume, Resume::NoCheckpoint { parted: 150 }, "{arch}");
        assert_eq!(b.checkpoints(0), [(150, Taken::Parted)], "{arch}");

        let third_prompt = then(&sheet, 5, 170, n);
        let third = ask(&mut b, 0, &third_prompt, &[]);
        assert_eq!(third.resume, Resume::Restored { parted: 150, pos: 150, taken: Taken::Parted }, "{arch}");
        assert_eq!(third.n_cached, 150);
        // The checkpoint restored from is kept, not erased.
        assert_eq!(positions(&b, 0), [150], "{arch}");
        let tol = if arch == "qwen35f32" { 1e-4 } else { 2e-2 };
        let want = fresh(&model, &third_prompt, &[]);
        assert!(close(&third, &want, tol), "{arch}: {:?} against {:?}", third.draws, want.draws);
    }
}

/// Chosen by where it ends: of checkpoints at 64 and 128, a prompt parting at
/// 100 takes the one at 64, and the one beyond the parting is dropped.
#[test]
fn the_checkpoint_chosen_is_the_newest_ending_at_or_before_the_parting() {
    let Some(model) = tiny("qwen35") else { return };
    let n = model.config.n_vocab;
    let first = tokens(140, 3, n);
    let mut b = batcher(&model, POLICY);
    ask(&mut b, 0, &first, &[]);
    assert_eq!(positions(&b, 0), [64, 128]);
    let second = parted(&first, 100, 9, 120, n);
    let got = ask(&mut b, 0, &second, &[]);
    assert_eq!(got.resume, Resume::Restored { parted: 100, pos: 64, taken: Taken::Interval });
    assert_eq!(positions(&b, 0), [64, 100]);
    assert_eq!(got.draws, fresh(&model, &second, &[]).draws);
}

/// After a restore the interval counts from the restored position: resumed
/// at 150, a long prompt's next interval checkpoint is at 256 (150 + 64, on
/// the grid), not at 192 as counted from zero, nor at once.
#[test]
fn the_interval_counts_from_where_the_read_resumed() {
    let Some(model) = tiny("qwen35") else { return };
    let n = model.config.n_vocab;
    let sheet = tokens(150, 4, n);
    let mut b = batcher(&model, CheckpointPolicy { interval: 0, ..POLICY });
    ask(&mut b, 0, &then(&sheet, 1, 160, n), &[]);
    ask(&mut b, 0, &then(&sheet, 2, 160, n), &[]);
    assert_eq!(positions(&b, 0), [150]);
    b.set_checkpoints(POLICY);
    let long = then(&sheet, 3, 300, n);
    let got = ask(&mut b, 0, &long, &[]);
    assert_eq!(got.n_cached, 150);
    assert_eq!(positions(&b, 0), [150, 256]);
}

/// A hint names where the next request is expected to part (the chat layer's
/// next turn); the read takes a checkpoint there and the next request resumes
/// from it, reading only what is new.
#[test]
fn a_hinted_position_is_checkpointed_for_the_next_request() {
    let Some(model) = tiny("qwen35") else { return };
    let n = model.config.n_vocab;
    let turn = tokens(90, 5, n);
    let mut b = batcher(&model, CheckpointPolicy { interval: 0, ..POLICY });
    ask(&mut b, 0, &turn, &[87]);
    assert_eq!(b.checkpoints(0), [(87, Taken::Hint)]);
    let next = parted(&turn, 87, 6, 130, n);
    let got = ask(&mut b, 0, &next, &[127]);
    assert_eq!(got.resume, Resume::Restored { parted: 87, pos: 87, taken: Taken::Hint });
    assert_eq!(b.checkpoints(0), [(87, Taken::Hint), (127, Taken::Hint)]);
}

/// Each slot's checkpoints are its own: a prompt placed in another slot
/// never resumes from them, and the slot that has them still does.
#[test]
fn checkpoints_serve_only_their_own_slot() {
    let Some(model) = tiny("qwen35") else { return };
    let n = model.config.n_vocab;
    let first = tokens(140, 6, n);
    let mut b = batcher(&model, POLICY);
    ask(&mut b, 0, &first, &[]);
    ask(&mut b, 1, &tokens(100, 8, n), &[]);
    let second = parted(&first, 100, 9, 120, n);
    let other = ask(&mut b, 1, &second, &[]);
    assert_eq!(other.resume, Resume::Fresh);
    assert_eq!(other.n_cached, 0);
    let own = ask(&mut b, 0, &second, &[]);
    assert_eq!(own.resume, Resume::Restored { parted: 100, pos: 64, taken: Taken::Interval });
    assert_eq!(own.draws, other.draws);
}

/// A checkpoint whose bytes changed since it was taken is refused by its
/// checksum, and the prompt is read from zero: never a wrong state.
#[test]
fn a_damaged_checkpoint_is_refused_and_the_prompt_read_from_zero() {
    let Some(model) = tiny("qwen35") else { return };
    let n = model.config.n_vocab;
    let first = tokens(140, 7, n);
    let mut b = batcher(&model, POLICY);
    ask(&mut b, 0, &first, &[]);
    b.damage_checkpoint(0, 0);
    let second = parted(&first, 100, 9, 120, n);
    let got = ask(&mut b, 0, &second, &[]);
    assert_eq!(got.resume, Resume::Refused { parted: 100, pos: 64, why: RestoreRefused::Damaged });
    assert_eq!(got.n_cached, 0);
    assert_eq!(got.draws, fresh(&model, &second, &[]).draws);
}

/// At most `max` per slot, the oldest dropped first; with none allowed, a
/// prompt that parts is read from zero and says so.
#[test]
fn a_slot_keeps_at_most_its_count_and_none_when_off() {
    let Some(model) = tiny("qwen35") else { return };
    let n = model.config.n_vocab;
    let first = tokens(330, 8, n);
    let mut b = batcher(&model, CheckpointPolicy { max: 3, ..POLICY });
    ask(&mut b, 0, &first, &[]);
    assert_eq!(positions(&b, 0), [192, 256, 320]);
    let mut off = batcher(&model, CheckpointPolicy::default());
    ask(&mut off, 0, &first, &[]);
    assert!(off.checkpoints(0).is_empty());
    let got = ask(&mut off, 0, &parted(&first, 100, 9, 120, n), &[]);
    assert_eq!(got.resume, Resume::NoCheckpoint { parted: 100 });
}

/// A conversation moved to the host prompt cache takes its checkpoints with
/// it: when it comes back parted, the slot resumes from one of them.
#[test]
fn the_host_cache_keeps_a_conversations_checkpoints() {
    let Some(model) = tiny("qwen35") else { return };
    let n = model.config.n_vocab;
    let first = tokens(140, 9, n);
    let mut b = Batcher::new(model.clone(), 1, 512, 16, KvType::F16).expect("slots");
    b.set_checkpoints(POLICY);
    b.set_host_cache(1 << 30);
    ask(&mut b, 0, &first, &[]);
    ask(&mut b, 0, &tokens(120, 10, n), &[]);
    assert_eq!(b.host_cache_usage().0, 1);
    let second = parted(&first, 100, 9, 120, n);
    let got = ask(&mut b, 0, &second, &[]);
    assert_eq!(got.resume, Resume::Restored { parted: 100, pos: 64, taken: Taken::Interval });
    assert_eq!(got.draws, fresh(&model, &second, &[]).draws);
}

/// Two slots reading their prompts in the same passes each take their own
/// checkpoints inside those passes, and each resumes from its own.
#[test]
fn slots_read_side_by_side_take_and_resume_their_own_checkpoints() {
    let Some(model) = tiny("qwen35f32") else { return };
    let n = model.config.n_vocab;
    let prompts = [tokens(200, 11, n), tokens(170, 12, n)];
    let mut b = batcher(&model, POLICY);
    for (slot, p) in prompts.iter().enumerate() {
        b.start(slot, p, greedy(3), true, &[150 - 40 * slot]).unwrap();
    }
    while b.any_busy() {
        for (s, ev) in b.step() {
            assert!(!matches!(ev, SlotEvent::Failed(_)), "slot {s} failed");
        }
    }
    assert_eq!(positions(&b, 0), [64, 128, 150, 192]);
    assert_eq!(positions(&b, 1), [64, 110, 128]);
    for (slot, at) in [(0, 150), (1, 110)] {
        let next = parted(&prompts[slot], at, 20 + slot as u32, at + 30, n);
        let got = ask(&mut b, slot, &next, &[]);
        assert_eq!(got.resume, Resume::Restored { parted: at, pos: at, taken: Taken::Hint }, "slot {slot}");
        assert!(close(&got, &fresh(&model, &next, &[]), 1e-4), "slot {slot}");
    }
}
