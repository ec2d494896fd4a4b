//! Quant block formats, dequantizers and dot-product kernels, bit-compatible
//! with ggml / llama.cpp for the formats GGUF models commonly ship in.
//!
//! Supported weight types: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
//! Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K, IQ4_NL, IQ4_XS.
//!
//! # Using it for a matrix-vector product
//!
//! ```
//! use ember_gguf::GgmlType;
//! use ember_quant::{activation_type, dot_fn, quantize_activation};
//!
//! # fn main() -> Result<(), ember_quant::QuantError> {
//! let (w, k) = (GgmlType::Q8_0, 64);
//! let weights = vec![0u8; 2 * GgmlType::Q8_0.type_size()]; // one row of 64
//! let x = vec![0.5f32; k];
//!
//! // Once per matrix: the activation format and the kernel.
//! let act = activation_type(w);
//! let dot = dot_fn(w).expect("Q8_0 has a kernel");
//! // Once per input vector: quantize the activations.
//! let mut xq = Vec::new();
//! quantize_activation(act, &x, &mut xq)?;
//! // Once per row.
//! let y = dot(k, &weights, &xq);
//! assert_eq!(y, 0.0);
//! # Ok(()) }
//! ```
//!
//! Everything that takes caller-sized buffers returns [`QuantError`] on a
//! length mismatch; only the kernels themselves (hot, called per row) merely
//! debug-assert exact lengths, and panic rather than read out of bounds.
//!
//! Modules: [`blocks`] has the on-disk block structs; [`scalar`] the reference
//! kernels by ggml name (`vec_dot_<weight>_<activation>`).

pub mod blocks;
mod dequant;
mod error;
mod kernels;
pub mod packed;
mod quantize;

pub use dequant::{can_dequantize, dequantize_row};
pub use error::QuantError;
pub use kernels::tile::{scalar_tile_fn, TileFn, UnpackFn, UnpackedTile, MAX_TILE_COLS};
pub use kernels::{
    checked_level, dot_cols_fn, dot_fn, level, scalar, scalar_dot_fn, simd_level, tile_fn, tile_fn_at, unpacked_tile, unpacked_tile_at, vec_dot,
    DotColsFn, DotFn, SimdLevel, MAX_DOT_COLS,
};
pub use quantize::{
    act_row_bytes, activation_type, quantize_activation, quantize_row_q8_0, quantize_row_q8_0_ref,
    quantize_row_q8_1, quantize_row_q8_1_ref, quantize_row_q8_K, ActType,
};
