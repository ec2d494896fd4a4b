//! Generation held to a grammar, on the real test models' vocabularies:
//! the mask agrees token by token with the automaton, every output is a
//! document of its grammar, and the batcher and a lone generation agree.

mod common;

use std::sync::Arc;
use std::time::Instant;

use common::{model_path, step_until_idle, GEMMA3, SMOLLM2};
use ember_grammar::{Automaton, Matcher};
use ember_model::batch::{Batcher, SlotEvent};
use ember_model::{GenerateParams, Generation, KvType, LoadOptions, Model, StopReason};
use ember_sample::SamplingParams;

const LIST: &str = r#"root ::= "[" ws item ("," ws item){0,3} ws "]"
item ::= "\"" [a-zA-Z ]{1,12} "\"" | [0-9]{1,4}
ws ::= " "?"#;

fn load(file: &str) -> Option<Arc<Model>> {
    let path = model_path(file)?;
    Some(Arc::new(Model::load(&path, LoadOptions { threads: 2, ..Default::default() }).unwrap()))
}

fn params(grammar: &Arc<Automaton>, temperature: f32, seed: u64) -> GenerateParams {
    GenerateParams {
        max_tokens: 64,
        ignore_eos: false,
        n_probs: 0,
        post_sampling_probs: false,
        sampling: SamplingParams { temperature, seed: Some(seed), ..Default::default() },
        grammar: Some(grammar.clone()),
        grammar_trigger: None,
        thought_budget: None,
    }
}

fn run(g: &mut Generation) -> (Vec<u32>, String, Option<StopReason>) {
    let (mut ids, mut text, mut stop) = (Vec::new(), String::new(), None);
    while let Some(step) = g.next_step().unwrap() {
        ids.push(step.token);
        text.push_str(&step.text);
        stop = step.stop;
    }
    (ids, text, stop)
}

/// Every token the mask allows reads whole from the state, and no other does.
fn check_masks(model: &Model, grammar: &str, prefixes: &[&str]) {
    let a = Arc::new(Automaton::from_gbnf(grammar).unwrap());
    let index = model.token_index();
    let tok = &model.tokenizer;
    for prefix in prefixes {
        let mut m = Matcher::new(a.clone());
        assert!(m.advance(prefix.as_bytes()).unwrap(), "{prefix:?}");
        let t = Instant::now();
        let mask = m.mask(index).unwrap();
        let first = t.elapsed();
        let t = Instant::now();
        m.mask(index).unwrap();
        let cached = t.elapsed();
        eprintln!("mask after {prefix:?}: {} tokens allowed, {first:?} to compute, {cached:?} cached", mask.count());
        for id in 0..model.config.n_vocab as u32 {
            let piece = tok.token_to_piece(id, false);
            let readable = !tok.is_control(id) && !tok.is_unused(id) && !piece.is_empty();
            let want = readable && m.clone().advance(piece).unwrap();
            assert_eq!(mask.allows(id), want, "token {id} {:?} after {prefix:?}", String::from_utf8_lossy(piece));
        }
    }
}

#[test]
fn masks_agree_with_the_automaton_on_real_vocabularies() {
    for file in [SMOLLM2, GEMMA3] {
        let Some(model) = load(file) else { return };
        check_masks(&model, LIST, &["", "[", "[ \"ab", "[12", "[\"x\", 3"]);
        // A free string: nearly the whole vocabulary is allowed.
        check_masks(&model, r#"root ::= "\"" [^"\\]* "\"""#, &["\"", "\"some text"]);
    }
}

#[test]
fn constrained_outputs_are_documents() {
    for file in [SMOLLM2, GEMMA3] {
        let Some(model) = load(file) else { return };
        let a = Arc::new(Automaton::from_gbnf(LIST).unwrap());
        let prompt = model.tokenizer.tokenize("A short list of colors and numbers, as JSON:", true, false);
        for (temperature, seed) in [(0.0, 0), (0.8, 1), (1.5, 2), (1.5, 3)] {
            let session = model.new_session(512, 64, KvType::F16);
            let mut g = Generation::new(model.clone(), session, &prompt, params(&a, temperature, seed)).unwrap();
            let (ids, text, stop) = run(&mut g);
            assert!(a.accepts(text.as_bytes()), "{file} t={temperature}: {text:?} is not a document");
            // The document is closed by "]", after which nothing may follow.
            assert_eq!(stop, Some(StopReason::EndOfGeneration), "{text:?}");
            assert!(!ids.iter().any(|&t| model.tokenizer.is_eog(t)), "the turn ended by the grammar, not a drawn end");
        }
    }
}

#[test]
fn the_turn_cannot_end_inside_a_document() {
    // A grammar whose document may always go on: the end of the turn is
    // drawable only once it is whole, and max_tokens cuts it otherwise.
    let Some(model) = load(SMOLLM2) else { return };
    let a = Arc::new(Automaton::from_gbnf(r#"root ::= "Answer: " [a-z]+ "." "#).unwrap());
    let prompt = model.tokenizer.tokenize("<|im_start|>user\nSay one word<|im_end|>\n<|im_start|>assistant\n", false, true);
    for seed in 0..4 {
        let session = model.new_session(512, 64, KvType::F16);
        let mut p = params(&a, 1.0, seed);
        p.max_tokens = 24;
        let mut g = Generation::new(model.clone(), session, &prompt, p).unwrap();
        let (_, text, stop) = run(&mut g);
        match stop {
            Some(StopReason::EndOfGeneration) => assert!(a.accepts(text.as_bytes()), "{text:?}"),
            Some(StopReason::Length) => {
                assert!(Matcher::new(a.clone()).advance(text.as_bytes()).unwrap(), "{text:?} left the grammar")
            }
            other => panic!("unexpected stop {other:?} after {text:?}"),
        }
    }
}

#[test]
fn batcher_and_lone_generation_agree_under_a_grammar() {
    let Some(model) = load(SMOLLM2) else { return };
    let a = Arc::new(Automaton::from_gbnf(LIST).unwrap());
    let prompts: Vec<Vec<u32>> = ["Numbers:", "Colors, please:", "Three names:"]
        .iter()
        .map(|p| model.tokenizer.tokenize(p, true, false))
        .collect();
    let alone: Vec<Vec<u32>> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let session = model.new_session(256, 64, KvType::F16);
            run(&mut Generation::new(model.clone(), session, p, params(&a, 0.9, i as u64)).unwrap()).0
        })
        .collect();
    let mut b = Batcher::new(model.clone(), 3, 256, 64, KvType::F16).expect("slots");
    for (i, p) in prompts.iter().enumerate() {
        b.start(i, p, params(&a, 0.9, i as u64), false, &[]).unwrap();
    }
    let together = step_until_idle(&mut b);
    assert_eq!(together, alone);
}

#[test]
fn forced_runs_are_fed_in_one_pass() {
    let Some(model) = load(SMOLLM2) else { return };
    let a = Arc::new(
        Automaton::from_gbnf(r#"root ::= "{\"name\": \"" [a-z]{1,10} "\", \"favourite colour\": \"" [a-z]{1,10} "\", \"lucky number\": " [0-9] "}""#)
            .unwrap(),
    );
    let prompt = model.tokenizer.tokenize("A person:", true, false);
    let mut b = Batcher::new(model.clone(), 1, 256, 64, KvType::F16).expect("slots");
    b.start(0, &prompt, params(&a, 0.0, 0), false, &[]).unwrap();
    let (mut passes, mut ids, mut text) = (0, Vec::new(), String::new());
    while b.any_busy() {
        passes += 1;
        for (_, ev) in b.step() {
            if let SlotEvent::Step(s) = ev {
                ids.push(s.token);
                text.push_str(&s.text);
            }
        }
    }
    assert!(a.accepts(text.as_bytes()), "{text:?}");
    // The literal keys are forced: they take no pass of their own.
    assert!(passes + 4 < ids.len() + 1, "{passes} passes for {} tokens: {text:?}", ids.len());
    // A lone generation reads the same tokens.
    let session = model.new_session(256, 64, KvType::F16);
    let (alone, _, _) = run(&mut Generation::new(model.clone(), session, &prompt, params(&a, 0.0, 0)).unwrap());
    assert_eq!(alone, ids);
}

#[test]
fn a_lazy_grammar_holds_the_output_from_its_trigger_on() {
    // A tool call's opener stands in as "{": the text before it is free, the
    // document from it on is held to the grammar and ends the turn.
    let Some(model) = load(SMOLLM2) else { return };
    let a = Arc::new(Automaton::from_gbnf(r#"root ::= "{\"n\": " [0-9]{1,3} "}""#).unwrap());
    let brace = model.tokenizer.tokenize("{", false, false);
    assert_eq!(brace.len(), 1);
    let prompt = model.tokenizer.tokenize("Some data:", true, false);
    for seed in 0..3 {
        let mut p = params(&a, 1.0, seed);
        p.grammar_trigger = Some(b"{".to_vec());
        // Make the opener likely after a few free tokens.
        p.sampling.logit_bias = vec![(brace[0], 12.0)];
        let session = model.new_session(256, 64, KvType::F16);
        let (_, text, stop) = run(&mut Generation::new(model.clone(), session, &prompt, p).unwrap());
        let Some(at) = text.find('{') else { panic!("the opener never came: {text:?}") };
        assert!(a.accepts(text[at..].as_bytes()), "{text:?}");
        assert_eq!(stop, Some(StopReason::EndOfGeneration), "{text:?}");
    }
}
