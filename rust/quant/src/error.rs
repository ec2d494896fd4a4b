//! The one error type of the crate: every length or type problem a caller can
//! cause is reported here instead of panicking.

use ember_gguf::GgmlType;

/// What went wrong in a dequantize or quantize call.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum QuantError {
    /// The tensor type has no implementation of the requested operation.
    #[error("{ty} has no {op} in ember-quant")]
    Unsupported { ty: GgmlType, op: &'static str },
    /// An element count is not a whole number of blocks.
    #[error("{format}: {n} elements is not a multiple of the block size {block}")]
    NotBlockMultiple {
        format: &'static str,
        n: usize,
        block: usize,
    },
    /// A buffer's length disagrees with the element count.
    #[error("{format}: {what} has length {got}, expected {expected}")]
    Length {
        format: &'static str,
        what: &'static str,
        expected: usize,
        got: usize,
    },
}
