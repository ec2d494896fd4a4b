//! The batcher: conversations answered side by side get the tokens each gets
//! alone; a long prompt is read in chunks between the others' decode steps;
//! slots are chosen as llama-server chooses them.

mod common;

use common::{tiny, tokens};

use std::sync::Arc;

use ember_model::batch::{Batcher, SlotEvent};
use ember_model::{GenerateParams, Generation, KvType, Model};

fn greedy(max_tokens: usize) -> GenerateParams {
    common::greedy(max_tokens, 0)
}

fn alone(model: &Arc<Model>, prompt: &[u32], max_tokens: usize) -> Vec<u32> {
    let mut g =
        Generation::new(model.clone(), model.new_session(128, 8, KvType::F16), prompt, greedy(max_tokens)).unwrap();
    let mut out = Vec::new();
    while let Some(s) = g.next_step().unwrap() {
        out.push(s.token);
    }
    out
}

#[test]
fn side_by_side_answers_equal_answers_alone() {
    for arch in ["llama", "gemma3", "qwen3moe", "gemma4", "qwen35", "qwen35moe"] {
        let Some(model) = tiny(arch) else { return };
        let n_vocab = model.config.n_vocab;
        let prompts: Vec<Vec<u32>> =
            [5, 23, 2, 17].iter().enumerate().map(|(i, &n)| tokens(n, i as u32, n_vocab)).collect();
        let max = [6, 3, 9, 5];
        let mut b = Batcher::new(model.clone(), 4, 128, 8, KvType::F16).expect("slots");
        for (i, p) in prompts.iter().enumerate() {
            let slot = b.choose_slot(p).unwrap();
            assert_eq!(slot, i, "empty slots are taken in order");
            b.start(slot, p, greedy(max[i]), true, &[]).unwrap();
        }
        let (got, stops) = run_out(&mut b, 4);
        assert!(stops.iter().all(Option::is_some), "{arch}: {stops:?}");
        for i in 0..4 {
            assert_eq!(got[i], alone(&model, &prompts[i], max[i]), "{arch}: request {i}");
        }
    }
}

#[test]
fn a_long_prompt_does_not_stall_a_decoding_slot() {
    let Some(model) = tiny("llama") else { return };
    let n_vocab = model.config.n_vocab;
    let mut b = Batcher::new(model.clone(), 2, 128, 8, KvType::F16).expect("slots");
    b.start(0, &tokens(4, 0, n_vocab), greedy(20), true, &[]).unwrap();
    b.step(); // slot 0 reads its prompt and draws
    let long = tokens(60, 1, n_vocab);
    b.start(1, &long, greedy(2), true, &[]).unwrap();
    // Eight chunks of 8 read slot 1's prompt; slot 0 draws at every one of them.
    for step in 0..7 {
        let ev = b.step();
        assert!(ev.iter().any(|(s, _)| *s == 0), "step {step}: slot 0 drew nothing");
        assert!(!ev.iter().any(|(s, _)| *s == 1), "step {step}: slot 1 drew before its prompt was read");
    }
    let ev = b.step();
    assert!(ev.iter().any(|(s, _)| *s == 1), "slot 1's prompt is read in 8 passes");
}

#[test]
fn slots_are_chosen_as_llama_server_chooses() {
    let Some(model) = tiny("llama") else { return };
    let n_vocab = model.config.n_vocab;
    let mut b = Batcher::new(model.clone(), 3, 128, 16, KvType::F16).expect("slots");
    let conv_a = tokens(30, 0, n_vocab);
    let conv_b = tokens(30, 1, n_vocab);
    for (slot, p) in [(0, &conv_a), (1, &conv_b)] {
        b.start(slot, p, greedy(1), true, &[]).unwrap();
        while b.any_busy() {
            b.step();
        }
    }
    // A continuation of conversation b goes back to slot 1, and reuses it.
    let mut more_b = conv_b.clone();
    more_b.extend(tokens(5, 2, n_vocab));
    assert_eq!(b.choose_slot(&more_b), Some(1));
    assert_eq!(b.start(1, &more_b, greedy(1), true, &[]).unwrap().n_cached, 30);
    // A stranger takes the empty slot while one exists...
    let stranger = tokens(12, 3, n_vocab);
    assert_eq!(b.choose_slot(&stranger), Some(2));
    b.start(2, &stranger, greedy(1), true, &[]).unwrap();
    while b.any_busy() {
        b.step();
    }
    // ...then the slot unused the longest (slot 0).
    assert_eq!(b.choose_slot(&tokens(12, 4, n_vocab)), Some(0));
    // No free slot: none.
    for s in 0..3 {
        b.start(s, &tokens(3, 5, n_vocab), greedy(4), false, &[]).unwrap();
    }
    assert_eq!(b.choose_slot(&conv_a), None);
    assert!(b.start(0, &conv_a, greedy(1), true, &[]).is_err(), "a busy slot refuses");
}

#[test]
fn requests_that_cannot_run_are_refused_and_cancel_frees_the_slot() {
    let Some(model) = tiny("llama") else { return };
    let n_vocab = model.config.n_vocab;
    let mut b = Batcher::new(model.clone(), 1, 16, 8, KvType::F16).expect("slots");
    assert!(b.start(0, &[], greedy(1), true, &[]).is_err());
    assert!(b.start(0, &[n_vocab as u32], greedy(1), true, &[]).is_err());
    assert!(b.start(0, &tokens(17, 0, n_vocab), greedy(1), true, &[]).is_err(), "longer than the slot");
    // Fills the context: the last draw says so.
    b.start(0, &tokens(10, 0, n_vocab), greedy(50), true, &[]).unwrap();
    let mut last = None;
    while b.any_busy() {
        for (_, ev) in b.step() {
            if let SlotEvent::Step(s) = ev {
                last = s.stop;
            }
        }
    }
    assert_eq!(last, Some(ember_model::StopReason::ContextFull));
    b.start(0, &tokens(4, 1, n_vocab), greedy(50), false, &[]).unwrap();
    b.step();
    b.cancel(0);
    assert!(!b.any_busy() && b.step().is_empty());
    assert_eq!(b.cached_tokens(0).len(), 4, "the cache keeps what was fed");
    // max_tokens 0 reads the prompt and ends without a draw.
    b.start(0, &tokens(4, 1, n_vocab), greedy(0), true, &[]).unwrap();
    let ev = b.step();
    assert!(matches!(ev.as_slice(), [(0, SlotEvent::Done)]), "{ev:?}");
}

/// A slot saved, erased and restored (here into another batcher) continues
/// with the tokens the original would draw; a state of another slot size or
/// a damaged one is refused and leaves the slot as it was.
#[test]
fn a_saved_slot_restores_and_continues_identically() {
    for arch in ["gemma3", "gemma4", "qwen3moe"] {
        saved_slot_round_trip(arch);
    }
}

/// A slot saved from one family is refused by another, and the refusal
/// names both.
#[test]
fn a_saved_slot_of_another_family_is_refused_by_name() {
    let (Some(g4), Some(g3)) = (tiny("gemma4"), tiny("gemma3")) else {
        return;
    };
    let mut a = Batcher::new(g4.clone(), 1, 128, 8, KvType::F16).expect("slots");
    a.start(0, &tokens(9, 0, g4.config.n_vocab), greedy(2), true, &[]).unwrap();
    while a.any_busy() {
        a.step();
    }
    let (state, _) = a.save_slot(0).unwrap();
    let mut b = Batcher::new(g3, 1, 128, 8, KvType::F16).expect("slots");
    let err = b.restore_slot(0, &state).unwrap_err().to_string();
    assert!(err.contains("saved from a gemma4 model") && err.contains("this slot holds a gemma3 model"), "{err}");
    assert!(b.cached_tokens(0).is_empty());
}

fn saved_slot_round_trip(arch: &str) {
    let Some(model) = tiny(arch) else { return };
    let n_vocab = model.config.n_vocab;
    let prompt = tokens(20, 0, n_vocab);
    let mut a = Batcher::new(model.clone(), 2, 128, 8, KvType::F16).expect("slots");
    a.start(1, &prompt, greedy(5), true, &[]).unwrap();
    while a.any_busy() {
        a.step();
    }
    let (state, n_saved) = a.save_slot(1).unwrap();
    assert_eq!(n_saved, a.cached_tokens(1).len());
    let mut more = a.cached_tokens(1).to_vec();
    more.extend(tokens(3, 1, n_vocab));
    let continue_in = |b: &mut Batcher, slot: usize| -> (usize, Vec<u32>) {
        let n_cached = b.start(slot, &more, greedy(6), true, &[]).unwrap().n_cached;
        let mut out = Vec::new();
        while b.any_busy() {
            for (_, ev) in b.step() {
                if let SlotEvent::Step(s) = ev {
                    out.push(s.token);
                }
            }
        }
        (n_cached, out)
    };
    let mut b = Batcher::new(model.clone(), 1, 128, 8, KvType::F16).expect("slots");
    assert_eq!(b.restore_slot(0, &state).unwrap(), n_saved);
    let restored = continue_in(&mut b, 0);
    assert_eq!(a.erase_slot(1).unwrap(), n_saved);
    assert_eq!(a.cached_tokens(1).len(), 0);
    assert_eq!(a.restore_slot(1, &state).unwrap(), n_saved);
    let original = continue_in(&mut a, 1);
    assert_eq!(restored, original);
    assert_eq!(restored.0, n_saved);

    let mut small = Batcher::new(model.clone(), 1, 64, 8, KvType::F16).expect("slots");
    assert!(small.restore_slot(0, &state).is_err(), "another slot size");
    assert!(b.restore_slot(0, &state[..state.len() - 1]).is_err(), "truncated");
    assert!(b.restore_slot(0, b"not a slot").is_err());
    assert!(b.restore_slot(5, &state).is_err(), "no such slot");
    b.start(0, &tokens(3, 2, n_vocab), greedy(50), true, &[]).unwrap();
    assert!(b.save_slot(0).is_err() && b.erase_slot(0).is_err(), "a busy slot is left alone");
}

/// With a host prompt cache, a conversation whose slot went to another comes
/// back from host memory instead of being read again, and answers as a
/// fresh read would; without one (or past its budget) it is read again.
#[test]
fn the_host_cache_brings_back_a_conversation_whose_slot_moved_on() {
    let Some(model) = tiny("gemma3") else { return };
    let n_vocab = model.config.n_vocab;
    let run = |b: &mut Batcher, prompt: &[u32]| -> (usize, Vec<u32>) {
        let n_cached = b.start(0, prompt, greedy(4), true, &[]).unwrap().n_cached;
        let mut out = Vec::new();
        while b.any_busy() {
            for (_, ev) in b.step() {
                if let SlotEvent::Step(s) = ev {
                    out.push(s.token);
                }
            }
        }
        (n_cached, out)
    };
    let conv_a = tokens(40, 0, n_vocab);
    let conv_b = tokens(40, 1, n_vocab);
    let mut a_again = conv_a.clone();
    a_again.extend(tokens(5, 2, n_vocab));
    let fresh = run(&mut Batcher::new(model.clone(), 1, 128, 8, KvType::F16).expect("slots"), &a_again).1;

    let mut b = Batcher::new(model.clone(), 1, 128, 8, KvType::F16).expect("slots");
    b.set_host_cache(1 << 30);
    run(&mut b, &conv_a);
    run(&mut b, &conv_b);
    assert_eq!(b.host_cache_usage().0, 1, "conversation a kept when b took its slot");
    let (n_cached, out) = run(&mut b, &a_again);
    assert!(n_cached >= 40, "restored from the host cache: {n_cached}");
    assert_eq!(out, fresh);
    assert_eq!(b.host_cache_usage().0, 1, "b kept in its turn, a back in the slot");

    let mut off = Batcher::new(model.clone(), 1, 128, 8, KvType::F16).expect("slots");
    run(&mut off, &conv_a);
    run(&mut off, &conv_b);
    assert_eq!(run(&mut off, &a_again).0, 0);
    let mut tiny_budget = Batcher::new(model.clone(), 1, 128, 8, KvType::F16).expect("slots");
    tiny_budget.set_host_cache(1000);
    run(&mut tiny_budget, &conv_a);
    run(&mut tiny_budget, &conv_b);
    assert_eq!(tiny_budget.host_cache_usage(), (0, 0), "past the budget nothing is kept");
}

/// With owners told apart (a server's API keys), what a slot or the host
/// cache holds of one owner's prompts is never reused for another's: the
/// other is placed as for a prompt nobody sent, and reads all of it.
#[test]
fn an_owners_cached_prompt_is_never_reused_for_another() {
    let Some(model) = tiny("llama") else { return };
    let n_vocab = model.config.n_vocab;
    let mut b = Batcher::new(model.clone(), 2, 128, 16, KvType::F16).expect("slots");
    b.set_host_cache(64 << 20);
    let secret = tokens(40, 7, n_vocab);
    b.start_as(1, 0, &secret, greedy(1), true, &[]).unwrap();
    while b.any_busy() {
        b.step();
    }
    let mut guess = secret.clone();
    guess.truncate(39);
    assert_eq!(b.choose_slot_of(2, &guess), Some(1), "the other owner gets the empty slot");
    assert_eq!(b.choose_slot_of(1, &guess), Some(0));
    // Even placed in the slot that holds it, the other owner reuses nothing.
    assert_eq!(b.start_as(2, 0, &guess, greedy(1), true, &[]).unwrap().n_cached, 0);
    while b.any_busy() {
        b.step();
    }
    // The first owner's conversation went to the host cache, and comes back for it alone.
    assert_eq!(b.start_as(2, 1, &secret, greedy(1), true, &[]).unwrap().n_cached, 0);
    while b.any_busy() {
        b.step();
    }
    assert!(b.start_as(1, 1, &secret, greedy(1), true, &[]).unwrap().n_cached > 0);
}

#[test]
fn slot_similarity_sets_how_much_a_slot_must_hold() {
    let Some(model) = tiny("llama") else { return };
    let n_vocab = model.config.n_vocab;
    let mut b = Batcher::new(model.clone(), 2, 128, 16, KvType::F16).expect("slots");
    let held = tokens(20, 0, n_vocab);
    b.start(1, &held, greedy(1), true, &[]).unwrap();
    while b.any_busy() {
        b.step();
    }
    // A prompt of 40 tokens whose first 20 (half) slot 1 holds.
    let mut half = held.clone();
    half.extend(tokens(20, 1, n_vocab));
    b.set_slot_similarity(500);
    assert_eq!(b.choose_slot(&half), Some(1), "a slot holding half the prompt meets 0.5");
    b.set_slot_similarity(600);
    assert_eq!(b.choose_slot(&half), Some(0), "below 0.6 the empty slot is taken instead");
    b.set_slot_similarity(0);
    assert_eq!(b.choose_slot(&half), Some(0), "0 ignores what slots hold");
}

#[test]
fn a_forked_slot_answers_as_the_slot_it_copies() {
    for arch in ["llama", "qwen35"] {
        let Some(model) = tiny(arch) else { return };
        let n_vocab = model.config.n_vocab;
        let mut b = Batcher::new(model.clone(), 3, 128, 16, KvType::F16).expect("slots");
        // A hybrid's copy resumes from a checkpoint of its recurrent state
        // taken where the prompt's last token begins (the hint); the others
        // cut their cache back there.
        b.set_checkpoints(ember_kv::CheckpointPolicy { max: 4, interval: 0, min_step: 0 });
        let prompt = tokens(40, 0, n_vocab);
        let expected = alone(&model, &prompt, 6);
        b.start(0, &prompt, greedy(6), true, &[prompt.len() - 1]).unwrap();
        // Copied once slot 0 has read the prompt and drawn: mid-answer.
        let mut first = Vec::new();
        while first.is_empty() {
            for (slot, ev) in b.step() {
                if let (0, SlotEvent::Step(s)) = (slot, ev) {
                    first.push(s.token);
                }
            }
        }
        b.fork(0, 1).unwrap();
        let copy = b.start(1, &prompt, greedy(6), true, &[]).unwrap();
        assert!(copy.n_cached >= 32, "{arch}: the copy reads the prompt again: {} cached", copy.n_cached);
        let mut got = [first, Vec::new()];
        while b.any_busy() {
            for (slot, ev) in b.step() {
                if let SlotEvent::Step(s) = ev {
                    got[slot].push(s.token);
                }
            }
        }
        assert_eq!(got[0], expected, "{arch}: the slot copied from");
        assert_eq!(got[1], expected, "{arch}: the copy");
        assert!(b.fork(1, 1).is_err() && b.fork(0, 7).is_err());
    }
}

#[test]
fn a_saved_slot_restores_whatever_chunk_the_other_batcher_reads_with() {
    for arch in ["gemma3", "qwen35"] {
        let Some(model) = tiny(arch) else { return };
        let n_vocab = model.config.n_vocab;
        let prompt = tokens(30, 0, n_vocab);
        let mut a = Batcher::new(model.clone(), 1, 128, 32, KvType::F16).expect("slots");
        a.set_chunk(8);
        a.start(0, &prompt, greedy(1), true, &[]).unwrap();
        while a.any_busy() {
            a.step();
        }
        let (state, _) = a.save_slot(0).unwrap();
        // The conversation goes on: a hybrid's state resumes where it stands.
        let mut more = a.cached_tokens(0).to_vec();
        let held = more.len();
        more.extend(tokens(5, 1, n_vocab));
        let mut b = Batcher::new(model.clone(), 1, 128, 32, KvType::F16).expect("slots");
        b.set_chunk(16);
        b.restore_slot_as(0, 0, &state).unwrap_or_else(|e| panic!("{arch}: {e}"));
        assert_eq!(b.start(0, &more, greedy(1), true, &[]).unwrap().n_cached, held, "{arch}");
    }
}

// -- slots sharing one context (--kv-unified) ------------------------------------------------

/// Runs every busy slot to its end: each slot's tokens, and whether it ended on a full context.
fn run_out(b: &mut Batcher, n: usize) -> (Vec<Vec<u32>>, Vec<Option<ember_model::StopReason>>) {
    let (mut got, mut stops) = (vec![Vec::new(); n], vec![None; n]);
    while b.any_busy() {
        for (slot, ev) in b.step() {
            match ev {
                SlotEvent::Step(s) => {
                    got[slot].push(s.token);
                    stops[slot] = s.stop.or(stops[slot]);
                }
                other => panic!("slot {slot}: {other:?}"),
            }
        }
    }
    (got, stops)
}

#[test]
fn a_shared_context_lets_one_conversation_hold_all_of_it_and_answers_as_alone() {
    for arch in ["llama", "gemma3", "qwen35"] {
        let Some(model) = tiny(arch) else { return };
        let n_vocab = model.config.n_vocab;
        // 96 positions shared by 4 slots: a 70-token prompt fits no quarter of them.
        let mut b = Batcher::new_unified(model.clone(), 4, 96, 8, KvType::F16).expect("slots");
        assert!(b.unified());
        let long = tokens(70, 3, n_vocab);
        let short = tokens(9, 4, n_vocab);
        b.start(0, &long, greedy(6), true, &[]).unwrap();
        b.start(1, &short, greedy(5), true, &[]).unwrap();
        let (got, _) = run_out(&mut b, 4);
        assert_eq!(got[0], alone(&model, &long, 6), "{arch}: the long conversation");
        assert_eq!(got[1], alone(&model, &short, 5), "{arch}: the short one beside it");
    }
}

#[test]
fn idle_conversations_give_way_least_recently_used_first() {
    let Some(model) = tiny("llama") else { return };
    let n_vocab = model.config.n_vocab;
    let mut b = Batcher::new_unified(model.clone(), 3, 64, 8, KvType::F16).expect("slots");
    let (p0, p1) = (tokens(20, 5, n_vocab), tokens(20, 6, n_vocab));
    b.start(0, &p0, greedy(2), true, &[]).unwrap();
    run_out(&mut b, 3);
    b.start(1, &p1, greedy(2), true, &[]).unwrap();
    run_out(&mut b, 3);
    assert_eq!((b.cached_tokens(0).len(), b.cached_tokens(1).len()), (21, 21), "both idle conversations held");
    // 40 positions more: slot 0's (used least recently) gives way, slot 1's stays.
    let p2 = tokens(40, 7, n_vocab);
    b.start(2, &p2, greedy(3), true, &[]).unwrap();
    let (got, _) = run_out(&mut b, 3);
    assert_eq!(got[2], alone(&model, &p2, 3));
    assert_eq!((b.cached_tokens(0).len(), b.cached_tokens(1).len()), (0, 21));
}

#[test]
fn a_conversation_without_room_for_its_next_token_ends_as_a_full_context_ends_it() {
    let Some(model) = tiny("llama") else { return };
    let n_vocab = model.config.n_vocab;
    let mut b = Batcher::new_unified(model.clone(), 2, 48, 8, KvType::F16).expect("slots");
    let (p0, p1) = (tokens(16, 8, n_vocab), tokens(16, 9, n_vocab));
    b.start(0, &p0, greedy(100), true, &[]).unwrap();
    b.start(1, &p1, greedy(100), true, &[]).unwrap();
    let (got, stops) = run_out(&mut b, 2);
    // 48 positions: 32 of prompt, the rest drawn between them, and both end on the shared context.
    assert_eq!(stops, vec![Some(ember_model::StopReason::ContextFull); 2]);
    assert_eq!(16 + got[0].len() + 16 + got[1].len(), 48 + 2, "every position used (each last token unfed)");
    for (i, p) in [&p0, &p1].iter().enumerate() {
        let want = alone(&model, p, got[i].len());
        assert_eq!(got[i], want, "slot {i} drew as alone, up to where it was cut");
    }
}

#[test]
fn a_prompt_waits_for_room_and_the_newest_gives_way_when_none_will_come() {
    let Some(model) = tiny("llama") else { return };
    let n_vocab = model.config.n_vocab;
    // A decoding conversation holds most of the context: the new prompt waits for it to end.
    let mut b = Batcher::new_unified(model.clone(), 2, 64, 8, KvType::F16).expect("slots");
    let p0 = tokens(40, 10, n_vocab);
    b.start(0, &p0, greedy(4), true, &[]).unwrap();
    for _ in 0..5 {
        b.step(); // the prompt, read in five pieces
    }
    let p1 = tokens(30, 11, n_vocab);
    b.start(1, &p1, greedy(3), true, &[]).unwrap();
    let (got, stops) = run_out(&mut b, 2);
    assert_eq!(stops[0], Some(ember_model::StopReason::Length));
    assert_eq!(got[1], alone(&model, &p1, 3), "read once the first ended and gave way");
    // Two prompts that cannot both fit and that nothing else will free: the one started last fails.
    let mut b = Batcher::new_unified(model.clone(), 2, 64, 8, KvType::F16).expect("slots");
    b.start(0, &tokens(40, 12, n_vocab), greedy(2), true, &[]).unwrap();
    b.start(1, &tokens(40, 13, n_vocab), greedy(2), true, &[]).unwrap();
    let mut failed = Vec::new();
    let mut drew = vec![0; 2];
    while b.any_busy() {
        for (slot, ev) in b.step() {
            match ev {
                SlotEvent::Failed(e) => failed.push((slot, e.to_string())),
                SlotEvent::Step(_) => drew[slot] += 1,
                SlotEvent::Done => {}
            }
        }
    }
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(failed[0].0, 1);
    assert!(failed[0].1.contains("context"), "{}", failed[0].1);
    assert_eq!(drew, vec![2, 0]);
}

#[test]
fn a_shared_context_counts_its_memory_once() {
    let Some(model) = tiny("gemma3") else { return };
    let shared = Batcher::new_unified(model.clone(), 4, 128, 8, KvType::F16).expect("slots");
    let one = Batcher::new(model.clone(), 1, 128, 8, KvType::F16).expect("slot");
    let own = model.new_session(128, 8, KvType::F16);
    // Gemma 3's sliding layers keep a ring in each slot; the full layers' 128 positions are counted once.
    assert_eq!(shared.cache_bytes(), one.cache_bytes() + 3 * own.cache.ring_bytes());
    assert!(own.cache.ring_bytes() > 0);
}
