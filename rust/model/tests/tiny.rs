//! Architectures without a real test model here (qwen2, qwen3) and the shapes
//! of those with one (llama, gemma3 with a window of 8 so the 5-local:1-global
//! pattern shows in 40 tokens), held against llama.cpp on tiny random-weight
//! GGUFs. `tests/fixtures/make_tiny_models.py` regenerates the models
//! deterministically; `tests/fixtures/tiny/<arch>.json` holds llama.cpp's logits.

mod common;

use std::path::PathBuf;

use common::*;
use ember_model::{KvType, LoadOptions, Logits, Model};

fn fixture(arch: &str) -> serde_json::Value {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("../../tests/fixtures/tiny/{arch}.json"));
    serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap()
}

fn tiny_parity(arch: &str) {
    let Some(path) = tiny_model(arch) else { return };
    let model = Model::load(&path, LoadOptions { no_repack: std::env::var_os("EMBER_NO_REPACK").is_some(), ..Default::default() }).unwrap();
    assert!(model.unread_tensors().is_empty(), "{arch}: unread tensors {:?}", model.unread_tensors());
    let f = fixture(arch);
    let ids = ids(&f["input_ids"]);
    let n_vocab = model.config.n_vocab;
    // Prompt read in passes of 7 tokens, so the sliding-window ring wraps mid-pass.
    let mut s = model.new_session(ids.len(), 7, KvType::F16);
    let logits = model.prefill(&mut s, &ids, Logits::All).unwrap();
    let mut agreement = Agreement::default();
    for row in f["positions"].as_array().unwrap() {
        let pos = row["pos"].as_u64().unwrap() as usize;
        agreement.add(&logits[pos * n_vocab..(pos + 1) * n_vocab], row);
    }
    agreement.check(&format!("tiny {arch}"));
}

#[test]
fn tiny_llama_matches_llama_cpp() {
    tiny_parity("llama");
}

#[test]
fn tiny_qwen2_matches_llama_cpp() {
    tiny_parity("qwen2");
}

#[test]
fn tiny_qwen3_matches_llama_cpp() {
    tiny_parity("qwen3");
}

#[test]
fn tiny_gemma3_matches_llama_cpp() {
    tiny_parity("gemma3");
}
