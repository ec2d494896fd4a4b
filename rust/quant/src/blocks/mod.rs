//! Byte layouts of the quant formats, exactly as ggml lays them out on disk,
//! and the zero-copy view of a row of bytes as a slice of blocks.
//!
//! Every block struct is `#[repr(C, packed)]`: ggml's layouts have no padding
//! (each struct carries a size assertion that proves it), so packing changes no
//! offset, but it drops the alignment to 1. That lets a row be viewed in place
//! at any byte offset of a mapped file or buffer, with no copy and no alignment
//! precondition on the caller.

pub mod float;
pub mod iq;
pub mod k_quants;
pub mod legacy;

pub use iq::{BlockIq4Nl, BlockIq4Xs, KVALUES_IQ4NL};
pub use k_quants::{BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K};
pub use legacy::{BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, BlockQ8_1};

/// Elements per block of the 32-element formats (Q4_0 .. Q8_0, IQ4_NL).
pub const QK32: usize = 32;
/// Elements per super-block of the K-quants, Q8_K and IQ4_XS.
pub const QK_K: usize = 256;

#[cfg(not(target_endian = "little"))]
compile_error!("GGUF data is little-endian and the block views read it in place");

/// A block struct that may be viewed over arbitrary bytes.
///
/// # Safety
/// Implementors must be `#[repr(C, packed)]` (alignment 1) and built only from
/// integers, `half::f16` and `f32`, for which every bit pattern is a valid
/// value, so any byte slice of the right length is a valid block.
pub(crate) unsafe trait Block: Copy + 'static {
    /// Elements encoded by one block.
    const QK: usize;
}

/// Views `bytes` (a whole number of blocks) as blocks.
#[inline]
pub(crate) fn as_blocks<B: Block>(bytes: &[u8]) -> &[B] {
    const { assert!(std::mem::align_of::<B>() == 1) };
    let size = std::mem::size_of::<B>();
    debug_assert_eq!(bytes.len() % size, 0);
    // SAFETY: B has alignment 1 and every bit pattern is valid (trait
    // contract); the slice covers len/size whole blocks inside `bytes`.
    unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<B>(), bytes.len() / size) }
}

/// Mutable twin of [`as_blocks`].
#[inline]
pub(crate) fn as_blocks_mut<B: Block>(bytes: &mut [u8]) -> &mut [B] {
    const { assert!(std::mem::align_of::<B>() == 1) };
    let size = std::mem::size_of::<B>();
    debug_assert_eq!(bytes.len() % size, 0);
    // SAFETY: as in `as_blocks`; writing any B back leaves valid bytes.
    unsafe { std::slice::from_raw_parts_mut(bytes.as_mut_ptr().cast::<B>(), bytes.len() / size) }
}

/// The first `k / B::QK` blocks of `row`. Panics (rather than reading out of
/// bounds) when `row` is shorter than that; kernels rely on this for safety.
#[inline]
pub(crate) fn row_blocks<B: Block>(row: &[u8], k: usize) -> &[B] {
    let nb = k / B::QK;
    as_blocks::<B>(&row[..nb * std::mem::size_of::<B>()])
}
