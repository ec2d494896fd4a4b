use thiserror::Error;

#[derive(Debug, Error)]
pub enum ModelError {
    #[error(transparent)]
    Gguf(#[from] ember_gguf::GgufError),
    #[error(transparent)]
    Tokenizer(#[from] ember_tokenizer::TokenizerError),
    #[error("architecture {0:?} is not supported (ember runs llama, qwen2, qwen3, qwen3moe, gemma3, gemma4 and phi3)")]
    UnsupportedArchitecture(String),
    #[error("{arch}: the file holds tensors its forward pass does not read: {}", names.join(", "))]
    UnreadTensors { arch: &'static str, names: Vec<String> },
    #[error("metadata {key}: {problem}")]
    BadMetadata { key: String, problem: String },
    #[error("tensor {name}: {problem}")]
    BadTensor { name: String, problem: String },
    #[error("tensor {name}: type {ty} is not supported")]
    UnsupportedType { name: String, ty: String },
    #[error("tensor {0} is missing from the file")]
    MissingTensor(String),
    #[error("token id {id} is out of range (the vocabulary has {n_vocab} tokens)")]
    BadToken { id: u32, n_vocab: usize },
    #[error(transparent)]
    Kv(#[from] ember_kv::KvError),
    #[error(transparent)]
    Sample(#[from] ember_sample::SampleError),
    #[error(transparent)]
    Grammar(#[from] ember_grammar::GrammarError),
    #[error("{0}")]
    Invalid(String),
    /// A multimodal projector that cannot be read, or does not fit its model.
    #[error("projector: {0}")]
    Projector(String),
    /// The GPU failed or cannot hold what was asked of it.
    #[error("device: {0}")]
    Device(String),
}

pub type Result<T, E = ModelError> = std::result::Result<T, E>;
