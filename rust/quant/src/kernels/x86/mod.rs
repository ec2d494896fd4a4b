//! x86-64 SIMD kernels, each chosen at run time only after the CPU has been
//! seen to support its instruction set.

pub(crate) mod avx2;
pub(crate) mod avx2_tile;
pub(crate) mod avx2_act;
