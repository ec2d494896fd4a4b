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
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join(format!("../../tests/fixtures/tiny/{arch}.json"));
    serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap()
}

fn tiny_parity(arch: &str) {
    tiny_parity_within(arch, 0.35)
}

/// The families added with per-layer shapes sit within 0.01 of llama.cpp
/// here; their bound is tight enough that a mixture weighed a little wrong
/// (a per-expert scale dropped) fails it.
fn tiny_parity_within(arch: &str, max_mean_diff: f64) {
    let Some(path) = tiny_model(arch) else { return };
    let model = Model::load(
        &path,
        LoadOptions {
            no_repack: std::env::var_os("EMBER_NO_REPACK").is_some(),
            ..Default::default()
        },
    )
    .unwrap();
    assert!(
        model.unread_tensors().is_empty(),
        "{arch}: unread tensors {:?}",
        model.unread_tensors()
    );
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
    agreement.check_within(&format!("tiny {arch}"), max_mean_diff);
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

/// Hidden states (what embeddings are pooled from) are the rows the output
/// head reads: each position's logits are the head's rows dotted with its
/// hidden state. Read in passes of 7 tokens, as the logits are.
#[test]
fn hidden_states_are_what_the_head_reads() {
    let Some(path) = tiny_model("llama") else {
        return;
    };
    let model = Model::load(&path, LoadOptions::default()).unwrap();
    let (e, nv) = (model.config.n_embd, model.config.n_vocab);
    let ids: Vec<u32> = (1..20).collect();
    let mut s = model.new_session(ids.len(), 7, KvType::F16);
    let hidden = model.prefill(&mut s, &ids, Logits::Hidden).unwrap();
    assert_eq!(hidden.len(), ids.len() * e);
    let mut s = model.new_session(ids.len(), 7, KvType::F16);
    let logits = model.prefill(&mut s, &ids, Logits::All).unwrap();
    // The head's rows, read from the file (tied to the embeddings where it has no output matrix).
    let file = ember_gguf::GgufFile::open(&path).unwrap();
    let info = file
        .header()
        .tensor("output.weight")
        .or_else(|| file.header().tensor("token_embd.weight"))
        .unwrap();
    let data = file.tensor_data(info);
    let row_bytes = data.len() / info.n_rows();
    let mut row = vec![0f32; e];
    let mut worst = 0f32;
    for v in [0, 1, nv / 3, nv / 2, nv - 1] {
        ember_quant::dequantize_row(info.ty, &data[v * row_bytes..(v + 1) * row_bytes], &mut row)
            .unwrap();
        for p in 0..ids.len() {
            let h = &hidden[p * e..(p + 1) * e];
            let want: f32 = row.iter().zip(h).map(|(a, b)| a * b).sum();
            let got = logits[p * nv + v];
            // Against the largest the product could be (|row| |h|): the head
            // reads its activations quantized to 8 bits.
            let norm = |x: &[f32]| x.iter().map(|a| a * a).sum::<f32>().sqrt();
            worst = worst.max((want - got).abs() / (norm(&row) * norm(h)));
        }
    }
    assert!(
        worst < 1e-2,
        "logits differ from head . hidden by {worst} of |row| |hidden|"
    );
}

#[test]
fn tiny_llama31_matches_llama_cpp() {
    tiny_parity_within("llama31", 0.03);
}

#[test]
fn tiny_qwen3moe_matches_llama_cpp() {
    tiny_parity_within("qwen3moe", 0.03);
}

#[test]
fn tiny_gemma4_matches_llama_cpp() {
    tiny_parity_within("gemma4", 0.03);
}

#[test]
fn tiny_gemma4moe_matches_llama_cpp() {
    tiny_parity_within("gemma4moe", 0.03);
}
