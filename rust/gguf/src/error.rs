use thiserror::Error;

/// Everything that can be wrong with a GGUF file. Each variant names what was
/// being read and where, so a user can tell a truncated download from a file
/// written by a newer tool.
#[derive(Debug, Error)]
pub enum GgufError {
    #[error("cannot open {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("not a GGUF file: magic bytes are {0:?}, expected \"GGUF\"")]
    BadMagic([u8; 4]),
    #[error("GGUF version {0} is not supported (ember reads versions 2 and 3)")]
    UnsupportedVersion(u32),
    #[error("file truncated: {what} at byte {offset} needs {needed} bytes, but the file ends at byte {file_len}")]
    Truncated {
        what: String,
        offset: u64,
        needed: u64,
        file_len: u64,
    },
    #[error("metadata key {key:?}: unknown value type {type_id} at byte {offset}")]
    UnknownValueType { key: String, type_id: u32, offset: u64 },
    #[error("{what} at byte {offset}: {problem}")]
    Malformed {
        what: String,
        offset: u64,
        problem: String,
    },
    #[error("tensor {name}: {problem}")]
    BadTensor { name: String, problem: String },
    #[error("metadata key {key:?}: {problem}")]
    BadMetadata { key: String, problem: String },
}

pub type Result<T, E = GgufError> = std::result::Result<T, E>;
