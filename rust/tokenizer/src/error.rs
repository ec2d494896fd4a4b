//! What can be wrong with a file's tokenizer metadata. Each variant names the
//! metadata key (and entry) at fault, so a bad conversion can be told from a
//! tokenizer ember does not implement.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum TokenizerError {
    #[error("tokenizer metadata {key:?} is missing")]
    Missing { key: String },

    #[error("tokenizer metadata {key:?} is {found}, expected {expected}")]
    WrongType { key: String, expected: &'static str, found: String },

    #[error("tokenizer metadata {key:?}, entry {index}: {problem}")]
    BadEntry { key: String, index: usize, problem: String },

    #[error("tokenizer metadata {key:?}: {problem}")]
    Invalid { key: String, problem: String },

    #[error(
        "tokenizer model {0:?} (tokenizer.ggml.model) is not supported: ember reads \"gpt2\" (byte-level BPE) and \"llama\" (SentencePiece)"
    )]
    UnsupportedModel(String),

    #[error("unknown pre-tokenizer {0:?} (tokenizer.ggml.pre)")]
    UnknownPre(String),

    #[error("pre-tokenizer {0:?} (tokenizer.ggml.pre) is known to llama.cpp but not implemented by ember")]
    UnsupportedPre(String),

    #[error("duplicate token in vocabulary: {text:?} has ids {first} and {second}")]
    DuplicateToken { text: String, first: u32, second: u32 },

    #[error("pre-tokenizer regex {pattern:?} does not compile: {problem}")]
    Regex { pattern: String, problem: String },

    #[error(transparent)]
    Gguf(#[from] ember_gguf::GgufError),
}
