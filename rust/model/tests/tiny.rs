//! Architectures without a real test model here (qwen2, qwen3) and the shapes
//! of those with one (llama, gemma3 with a window of 8 so the 5-local:1-global
//! pattern shows in 40 tokens), held against llama.cpp on tiny random-weight
//! GGUFs. `tests/fixtures/make_tiny_models.py` regenerates the models
//! deterministically; `tests/fixtures/tiny/<arch>.json` holds llama.cpp's logits.

mod common;

use common::*;
use ember_model::{KvType, LoadOptions, Logits, Model};

fn tiny_parity(arch: &str) {
    tiny_parity_within(arch, 0.35)
}

/// The families added with per-layer shapes sit within 0.01 of llama.cpp
/// here; their bound is tight enough that a mixture weighed a little wrong
/// (a per-expert scale dropped) fails it.
fn tiny_parity_within(arch: &str, max_mean_diff: f64) {
    tiny_parity_in_passes(arch, 7, max_mean_diff);
}

fn tiny_parity_in_passes(arch: &str, pass: usize, max_mean_diff: f64) {
    let Some(path) = tiny_model(arch) else { return };
    let model = Model::load(
        &path,
        LoadOptions { no_repack: std::env::var_os("EMBER_NO_REPACK").is_some(), ..Default::default() },
    )
    .unwrap();
    assert!(model.unread_tensors().is_empty(), "{arch}: unread tensors {:?}", model.unread_tensors());
    let f = tiny_fixture(arch);
    let ids = ids(&f["input_ids"]);
    let n_vocab = model.config.n_vocab;
    // Prompt read in passes of `pass` tokens (7: the sliding-window ring
    // wraps mid-pass); the context llama.cpp read it with, where the fixture
    // says (LongRoPE's factors depend on it).
    let n_ctx = f["n_ctx"].as_u64().map_or(ids.len(), |n| n as usize);
    let mut s = model.new_session(n_ctx, pass, KvType::F16);
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
    let info = file.header().tensor("output.weight").or_else(|| file.header().tensor("token_embd.weight")).unwrap();
    let data = file.tensor_data(info);
    let row_bytes = data.len() / info.n_rows();
    let mut row = vec![0f32; e];
    let mut worst = 0f32;
    for v in [0, 1, nv / 3, nv / 2, nv - 1] {
        ember_quant::dequantize_row(info.ty, &data[v * row_bytes..(v + 1) * row_bytes], &mut row).unwrap();
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
    assert!(worst < 1e-2, "logits differ from head . hidden by {worst} of |row| |hidden|");
}

#[test]
fn tiny_llama31_matches_llama_cpp() {
    tiny_parity_within("llama31", 0.03);
}

#[test]
fn tiny_llamamoe_matches_llama_cpp() {
    tiny_parity_within("llamamoe", 0.03);
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

#[test]
fn tiny_phi3_matches_llama_cpp() {
    tiny_parity_within("phi3", 0.03);
}

/// The same weights trained on a shorter context: a sequence beyond it
/// turns with LongRoPE's long factors.
#[test]
fn tiny_phi3_beyond_its_context_matches_llama_cpp() {
    tiny_parity_within("phi3long", 0.03);
}

#[test]
fn tiny_qwen3yarn_matches_llama_cpp() {
    tiny_parity_within("qwen3yarn", 0.03);
}

/// Qwen3.5's hybrid: three gated DeltaNet layers (the last one too) and a
/// gated attention layer, over 200 tokens (llama.cpp read them in one batch,
/// its delta rule in chunks of 64): read in passes of 7, and in passes of
/// 100, where the rule runs whole chunks of 64 and partial ones across the
/// passes' ends.
#[test]
fn tiny_qwen35_matches_llama_cpp() {
    tiny_parity_within("qwen35", 0.03);
    tiny_parity_in_passes("qwen35", 100, 0.03);
}

/// The same hybrid with F32 matrices: nothing is quantized on the way, so
/// ember's chunked rule and llama.cpp's meet closely.
#[test]
fn tiny_qwen35_in_f32_matches_llama_cpp() {
    tiny_parity_within("qwen35f32", 0.005);
    tiny_parity_in_passes("qwen35f32", 100, 0.005);
}

/// Qwen3.5's mixture: the layer kinds from full_attention_interval alone,
/// experts beside a shared expert behind its sigmoid gate.
#[test]
fn tiny_qwen35moe_matches_llama_cpp() {
    tiny_parity_within("qwen35moe", 0.03);
    tiny_parity_in_passes("qwen35moe", 100, 0.03);
}

/// Prefill and decode are the same code in every family: a prompt fed in
/// chunks of 7 (crossing windows of 8) and fed one token at a time give the
/// same logits.
#[test]
fn every_family_reads_a_prompt_as_it_decodes() {
    // A hybrid reads a prompt's recurrent part in chunks of the delta rule
    // and decodes it a step at a time: the two sum in other orders, and in
    // "qwen35" and "qwen35moe" the 8-bit activations of quantized matrices turn that
    // rounding into a few hundredths of a logit. Its F32 twin holds the
    // invariant instead.
    for arch in TINY_ARCHS.into_iter().filter(|&a| !["qwen35", "qwen35moe"].contains(&a)) {
        let Some(path) = tiny_model(arch) else { return };
        let model = Model::load(&path, LoadOptions::default()).unwrap();
        let ids = ids(&tiny_fixture(arch)["input_ids"]);
        let n_vocab = model.config.n_vocab;
        let n_ctx = ids.len().max(64);
        let mut a = model.new_session(n_ctx, 7, KvType::F16);
        let batched = model.prefill(&mut a, &ids, Logits::All).unwrap();
        let mut b = model.new_session(n_ctx, 7, KvType::F16);
        let mut max_diff = 0f32;
        for (i, &t) in ids.iter().enumerate() {
            let row = model.forward(&mut b, &[t], Logits::Last).unwrap();
            for (x, y) in row.iter().zip(&batched[i * n_vocab..(i + 1) * n_vocab]) {
                max_diff = max_diff.max((x - y).abs());
            }
        }
        assert!(max_diff <= 1e-3, "{arch}: prefill vs token-by-token, max |diff| {max_diff}");
    }
}

/// gemma4's per-layer token table stays in the file's mapping: a pass reads
/// the rows of its own tokens and no others (262,144 rows here).
#[test]
fn per_layer_embeddings_are_read_by_row() {
    let Some(path) = tiny_model("gemma4") else {
        return;
    };
    let model = Model::load(&path, LoadOptions::default()).unwrap();
    let table = &model.weights().per_layer.as_ref().expect("gemma4 E models have a per-layer table").table;
    assert!(table.packed.is_none(), "the table is never repacked");
    assert_eq!(table.rows, model.config.n_vocab);
    assert_eq!(model.per_layer_rows_read(), 0);
    let mut s = model.new_session(32, 8, KvType::F16);
    model.prefill(&mut s, &[2, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100], Logits::Last).unwrap();
    assert_eq!(model.per_layer_rows_read(), 11);
    model.forward(&mut s, &[7], Logits::Last).unwrap();
    assert_eq!(model.per_layer_rows_read(), 12);
}

/// Layers that read an earlier layer's keys and values store none, and
/// each layer's cache is as wide as its own heads: gemma4's cache holds
/// four layers (three sliding of 2 heads of 16, one full of 1 head of 32).
#[test]
fn shared_kv_layers_are_stored_once() {
    let Some(path) = tiny_model("gemma4") else {
        return;
    };
    let model = Model::load(&path, LoadOptions::default()).unwrap();
    let c = &model.config;
    assert_eq!((c.n_layer, c.n_layer_kv), (6, 4));
    assert_eq!(c.kv_bytes_per_position(), 2 * (3 * (32 + 32) + (32 + 32)));
    let s = model.new_session(64, 8, KvType::F16);
    assert_eq!(s.cache.n_layers(), 4);
    // Three windowed rings of 8 + 8 rows and one full layer of 64.
    assert_eq!(s.cache.memory_bytes(), 2 * (3 * 16 * 64 + 64 * 64));
}

/// A file with a tensor its family's forward pass does not read fails to
/// load, naming it (a weight silently ignored would change every answer).
#[test]
fn an_unread_tensor_is_a_load_error() {
    let Some(path) = tiny_model("llama") else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("ember-unread-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("extra.gguf");
    with_extra_tensor(&path, &out, "blk.0.attn_output.bias", 64);
    let err = Model::load(&out, LoadOptions::default()).err().expect("a tensor nobody reads");
    let msg = err.to_string();
    assert!(msg.contains("blk.0.attn_output.bias") && msg.contains("does not read"), "{msg}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A file with a metadata key that changes its family's forward pass in a
/// way ember does not implement fails to load, naming the key.
#[test]
fn an_unimplemented_metadata_key_is_a_load_error() {
    let Some(path) = tiny_model("qwen3") else { return };
    let dir = std::env::temp_dir().join(format!("ember-key-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("extra.gguf");
    copy_gguf(&path, &out, "w.add_float32('qwen3.attn_logit_softcapping', 50.0)");
    let err = Model::load(&out, LoadOptions::default()).err().expect("a key ember cannot honour");
    let msg = err.to_string();
    assert!(msg.contains("qwen3.attn_logit_softcapping") && msg.contains("does not implement"), "{msg}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A hybrid whose rope sections send a rotated pair to the fourth position
/// component (which text leaves at 0 and ember does not implement), or
/// whose DeltaNet widths disagree, is refused, naming the key.
#[test]
fn a_hybrid_ember_cannot_run_as_written_is_refused() {
    let Some(path) = tiny_model("qwen35") else { return };
    let dir = std::env::temp_dir().join(format!("ember-hybrid-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("changed.gguf");
    for (key, line, needle) in [
        ("qwen35.rope.dimension_sections", "w.add_rope_dimension_sections([1, 0, 0, 1])", "fourth position component"),
        ("qwen35.ssm.inner_size", "w.add_ssm_inner_size(48)", "is not 16 (state_size) x 4"),
    ] {
        copy_gguf_without(&path, &out, key, line);
        let err = Model::load(&out, LoadOptions::default()).err().expect("a hybrid ember cannot run");
        let msg = err.to_string();
        assert!(msg.contains(key) && msg.contains(needle), "{msg}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Copies a GGUF file, adding one f32 tensor of `n` zeros named `name`.
fn with_extra_tensor(src: &std::path::Path, dst: &std::path::Path, name: &str, n: usize) {
    copy_gguf(src, dst, &format!("w.add_tensor({name:?}, np.zeros({n}, dtype=np.float32))"));
}

/// Copies a GGUF file through the `gguf` package, running the Python line
/// `extra` (the writer is `w`) after the original's keys and tensors.
fn copy_gguf(src: &std::path::Path, dst: &std::path::Path, extra: &str) {
    copy_gguf_without(src, dst, "", extra)
}

/// [`copy_gguf`] leaving out the key `skip` (which `extra` may write anew).
fn copy_gguf_without(src: &std::path::Path, dst: &std::path::Path, skip: &str, extra: &str) {
    let script = format!(
        "import sys, numpy as np, gguf\n\
         src, dst = sys.argv[1], sys.argv[2]\n\
         r = gguf.GGUFReader(src)\n\
         arch = r.fields['general.architecture'].contents()\n\
         w = gguf.GGUFWriter(dst, arch)\n\
         for f in r.fields.values():\n\
         \x20   if f.name.startswith('GGUF.') or f.name in ('general.architecture', {skip:?}): continue\n\
         \x20   w.add_key_value(f.name, f.contents(), f.types[0], f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None)\n\
         for t in r.tensors:\n\
         \x20   w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)\n\
         {extra}\n\
         w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()\n"
    );
    let status = std::process::Command::new("python3")
        .arg("-c")
        .arg(script)
        .args([src.to_str().unwrap(), dst.to_str().unwrap()])
        .status()
        .expect("python3 with the gguf package (the test extras)");
    assert!(status.success(), "writing {}", dst.display());
}

/// Every tiny model's tokenizer reads text as llama.cpp's does: the ids of
/// each recorded string, with control tokens parsed and without, and the
/// text those ids give back. The gemma4 models carry a Gemma 4-style
/// vocabulary (BPE over UTF-8 characters, spaces as ▁, byte tokens).
#[test]
fn every_tokenizer_reads_text_as_llama_cpp() {
    for arch in TINY_ARCHS {
        let Some(path) = tiny_model(arch) else { return };
        let file = ember_gguf::GgufFile::open(&path).unwrap();
        let tok = ember_tokenizer::Tokenizer::from_gguf(file.header()).unwrap();
        let f = tiny_fixture(arch);
        let cases = f["tokenizations"].as_array().expect("fixtures record tokenizations");
        assert!(!cases.is_empty());
        for case in cases {
            let text = case["text"].as_str().unwrap();
            let special = case["special"].as_bool().unwrap();
            let want = ids(&case["ids"]);
            let got = tok.tokenize(text, true, special);
            assert_eq!(got, want, "{arch}: {text:?} (special {special})");
            // llama-cpp-python's detokenize drops one space after a leading
            // BOS (for Llama 1's sake); the pieces are llama.cpp's.
            let mut back = tok.detokenize(&want, false);
            if want.first().is_some_and(|&id| Some(id) == tok.bos()) && back.starts_with(' ') {
                back.remove(0);
            }
            assert_eq!(back, case["detokenized"].as_str().unwrap(), "{arch}: detokenizing {text:?}");
        }
    }
}
