//! The whole model against llama.cpp on the real test files: teacher-forced
//! along each golden case, the logits must agree (see `common::Agreement`).

mod common;

use common::*;
use ember_model::{KvType, LoadOptions, Logits, Model};

fn parity(model_file: &str, golden_file: &str) {
    let Some(path) = model_path(model_file) else { return };
    let model = Model::load(&path, LoadOptions::default()).unwrap();
    let g = golden(golden_file);
    let mut total = Agreement::default();
    for case in g["cases"].as_array().unwrap() {
        let prompt = ids(&case["prompt_ids"]);
        let seq: Vec<u32> = prompt.iter().copied().chain(ids(&case["greedy_ids"])).collect();
        let mut s = model.new_session(seq.len(), 512, KvType::F16);
        let logits = model.prefill(&mut s, &seq, Logits::All).unwrap();
        let n_vocab = model.config.n_vocab;
        let mut this = Agreement::default();
        for row in case["positions"].as_array().unwrap() {
            let pos = row["pos"].as_u64().unwrap() as usize;
            let ours = &logits[pos * n_vocab..(pos + 1) * n_vocab];
            this.add(ours, row);
            total.add(ours, row);
        }
        println!("{}", this.report(&format!("  case of {} tokens", seq.len())));
    }
    total.check(model_file);
}

#[test]
fn smollm2_matches_llama_cpp() {
    parity(SMOLLM2, "smollm2-135m-instruct-q4_1.json");
}

#[test]
fn gemma3_matches_llama_cpp() {
    parity(GEMMA3, "gemma-3-270m-q4_k_m.json");
}

/// Prefill and decode are the same code: a prompt fed at once and fed one
/// token at a time give the same logits.
#[test]
fn prefill_equals_token_by_token() {
    for file in [SMOLLM2, GEMMA3] {
        let Some(path) = model_path(file) else { return };
        let model = Model::load(&path, LoadOptions::default()).unwrap();
        let ids = model.tokenizer.tokenize("The quick brown fox jumps over the lazy dog, and then it rests.", true, false);
        let n_vocab = model.config.n_vocab;
        let mut a = model.new_session(64, 64, KvType::F16);
        let batched = model.prefill(&mut a, &ids, Logits::All).unwrap();
        let mut b = model.new_session(64, 64, KvType::F16);
        let mut max_diff = 0f32;
        for (i, &t) in ids.iter().enumerate() {
            let row = model.forward(&mut b, &[t], Logits::Last).unwrap();
            for (x, y) in row.iter().zip(&batched[i * n_vocab..(i + 1) * n_vocab]) {
                max_diff = max_diff.max((x - y).abs());
            }
        }
        println!("{file}: prefill vs token-by-token, max |diff| {max_diff}");
        assert!(max_diff <= 1e-3, "{file}: max |diff| {max_diff}");
    }
}
