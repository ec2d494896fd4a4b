//! Every pre-tokenizer ember implements, and SentencePiece with and without
//! the space prefix, against llama.cpp on a few hundred awkward strings
//! (tests/data/llama_cpp_fuzz.json, made by make_llama_cpp_fuzz.py). The
//! byte-level BPE cases reuse SmolLM2's vocabulary with `tokenizer.ggml.pre`
//! swapped, since a vocabulary is all a pre-tokenizer needs to be exercised.

mod common;

use common::{model, GEMMA3, SMOLLM2};
use ember_gguf::{GgufFile, GgufHeader, Value};
use ember_tokenizer::Tokenizer;
use serde_json::Value as Json;

fn fnv(ids: &[u32]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for id in ids {
        for b in id.to_le_bytes() {
            h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
        }
    }
    format!("{h:016x}")
}

fn type_id(v: &Value) -> u32 {
    match v {
        Value::U8(_) => 0,
        Value::I8(_) => 1,
        Value::U16(_) => 2,
        Value::I16(_) => 3,
        Value::U32(_) => 4,
        Value::I32(_) => 5,
        Value::F32(_) => 6,
        Value::Bool(_) => 7,
        Value::String(_) => 8,
        Value::Array(_) => 9,
        Value::U64(_) => 10,
        Value::I64(_) => 11,
        Value::F64(_) => 12,
    }
}

fn put_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.push(*x as u8),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(*x as u8),
        Value::String(s) => {
            out.extend_from_slice(&(s.len() as u64).to_le_bytes());
            out.extend_from_slice(s.as_bytes());
        }
        Value::Array(a) => {
            out.extend_from_slice(&a.first().map_or(4, type_id).to_le_bytes());
            out.extend_from_slice(&(a.len() as u64).to_le_bytes());
            for x in a {
                put_value(out, x);
            }
        }
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
    }
}

/// `h`'s metadata, with `key` set to `value`, as a tensor-less GGUF header.
fn with_key(h: &GgufHeader, key: &str, value: Value) -> GgufHeader {
    let mut kvs: Vec<(&str, &Value)> =
        h.metadata.iter().filter(|(k, _)| k != key && k != "general.alignment").map(|(k, v)| (k.as_str(), v)).collect();
    kvs.push((key, &value));
    let mut out = b"GGUF".to_vec();
    out.extend_from_slice(&3u32.to_le_bytes());
    out.extend_from_slice(&0u64.to_le_bytes());
    out.extend_from_slice(&(kvs.len() as u64).to_le_bytes());
    for (k, v) in kvs {
        put_value(&mut out, &Value::String(k.to_owned()));
        out.extend_from_slice(&type_id(v).to_le_bytes());
        put_value(&mut out, v);
    }
    GgufHeader::parse(&out).unwrap()
}

fn data() -> Json {
    let p = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/llama_cpp_fuzz.json");
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn strings(d: &Json) -> Vec<&str> {
    d["strings"].as_array().unwrap().iter().map(|s| s.as_str().unwrap()).collect()
}

/// Compares one tokenizer's ids with the expected hashes, collecting differences.
fn compare(
    what: &str,
    texts: &[&str],
    want: &Json,
    tokenize: impl Fn(&str) -> Vec<u32>,
    failures: &mut Vec<String>,
) -> usize {
    let want = want.as_array().unwrap();
    assert_eq!(want.len(), texts.len());
    let mut n = 0;
    for (text, h) in texts.iter().zip(want) {
        let ids = tokenize(text);
        if fnv(&ids) != h.as_str().unwrap() {
            failures.push(format!("{what}: {text:?} -> {ids:?}"));
        }
        n += 1;
    }
    n
}

#[test]
fn every_pre_tokenizer_matches_llama_cpp() {
    let Some(path) = model(SMOLLM2) else { return };
    let file = GgufFile::open(path).unwrap();
    let d = data();
    let texts = strings(&d);
    let mut failures = Vec::new();
    let mut checked = 0;
    for (pre, want) in d["bpe"].as_object().unwrap() {
        let h = with_key(&file, "tokenizer.ggml.pre", Value::String(pre.clone()));
        let tok = Tokenizer::from_gguf(&h).unwrap_or_else(|e| panic!("{pre}: {e}"));
        checked += compare(pre, &texts, want, |s| tok.tokenize(s, false, false), &mut failures);
    }
    eprintln!("{}/{checked} pre-tokenizer cases equal llama.cpp's", checked - failures.len());
    assert!(failures.is_empty(), "{} differ from llama.cpp:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn sentencepiece_matches_llama_cpp() {
    let Some(path) = model(GEMMA3) else { return };
    let file = GgufFile::open(path).unwrap();
    let d = data();
    let texts = strings(&d);
    let mut failures = Vec::new();
    let mut checked = 0;
    for (name, want) in d["spm"].as_object().unwrap() {
        let prefix = name.ends_with("+space_prefix");
        let h = with_key(&file, "tokenizer.ggml.add_space_prefix", Value::Bool(prefix));
        let tok = Tokenizer::from_gguf(&h).unwrap();
        checked += compare(name, &texts, &want["plain"], |s| tok.tokenize(s, false, false), &mut failures);
        checked += compare(name, &texts, &want["special"], |s| tok.tokenize(s, true, true), &mut failures);
    }
    eprintln!("{}/{checked} SentencePiece cases equal llama.cpp's", checked - failures.len());
    assert!(failures.is_empty(), "{} differ from llama.cpp:\n{}", failures.len(), failures.join("\n"));
}
