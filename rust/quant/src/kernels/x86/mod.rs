//! x86-64 SIMD kernels, each chosen at run time only after the CPU has been
//! seen to support its instruction set.

pub(crate) mod avx2;
pub(crate) mod avx2_act;
pub(crate) mod tile;
pub(crate) mod tile16;
