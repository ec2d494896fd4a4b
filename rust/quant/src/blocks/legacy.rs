//! The 32-element "legacy" formats Q4_0, Q4_1, Q5_0, Q5_1, Q8_0: one f16 scale
//! (plus an f16 min for the `_1` variants) per 32 weights, and their
//! dequantizers, following ggml-quants.c.

use half::f16;

use super::float::fp16_to_fp32;

use super::{Block, QK32};

/// 4-bit, symmetric: `x = d * (q - 8)`.
#[derive(Clone, Copy, Debug)]
#[repr(C, packed)]
pub struct BlockQ4_0 {
    pub d: f16,
    /// Element `j` in the low nibble of `qs[j]`, element `j + 16` in the high.
    pub qs: [u8; QK32 / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ4_0>() == 18);

/// 4-bit with a min: `x = d * q + m`.
#[derive(Clone, Copy, Debug)]
#[repr(C, packed)]
pub struct BlockQ4_1 {
    pub d: f16,
    pub m: f16,
    pub qs: [u8; QK32 / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ4_1>() == 20);

/// 5-bit, symmetric: `x = d * (q - 16)`; bit 4 of element `j` is bit `j` of
/// the little-endian u32 `qh`.
#[derive(Clone, Copy, Debug)]
#[repr(C, packed)]
pub struct BlockQ5_0 {
    pub d: f16,
    pub qh: [u8; 4],
    pub qs: [u8; QK32 / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ5_0>() == 22);

/// 5-bit with a min: `x = d * q + m`.
#[derive(Clone, Copy, Debug)]
#[repr(C, packed)]
pub struct BlockQ5_1 {
    pub d: f16,
    pub m: f16,
    pub qh: [u8; 4],
    pub qs: [u8; QK32 / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ5_1>() == 24);

/// 8-bit, symmetric: `x = d * q`. Also the activation format of the
/// 32-element weight formats.
#[derive(Clone, Copy, Debug)]
#[repr(C, packed)]
pub struct BlockQ8_0 {
    pub d: f16,
    pub qs: [i8; QK32],
}
const _: () = assert!(std::mem::size_of::<BlockQ8_0>() == 34);

/// 8-bit, symmetric, plus `s = d * Σ qs`: the activation format of Q4_1 and
/// Q5_1, whose min term needs the block sum once per activation block rather
/// than once per (weight row, activation block) pair.
#[derive(Clone, Copy, Debug)]
#[repr(C, packed)]
pub struct BlockQ8_1 {
    pub d: f16,
    pub s: f16,
    pub qs: [i8; QK32],
}
const _: () = assert!(std::mem::size_of::<BlockQ8_1>() == 36);

// SAFETY: packed structs of u8/i8/f16 only.
unsafe impl Block for BlockQ4_0 {
    const QK: usize = QK32;
}
unsafe impl Block for BlockQ4_1 {
    const QK: usize = QK32;
}
unsafe impl Block for BlockQ5_0 {
    const QK: usize = QK32;
}
unsafe impl Block for BlockQ5_1 {
    const QK: usize = QK32;
}
unsafe impl Block for BlockQ8_0 {
    const QK: usize = QK32;
}
unsafe impl Block for BlockQ8_1 {
    const QK: usize = QK32;
}

pub(crate) fn dequantize_q4_0(x: &[BlockQ4_0], y: &mut [f32]) {
    for (b, y) in x.iter().zip(y.chunks_exact_mut(QK32)) {
        let d = fp16_to_fp32(b.d);
        for j in 0..QK32 / 2 {
            let x0 = (b.qs[j] & 0x0F) as i32 - 8;
            let x1 = (b.qs[j] >> 4) as i32 - 8;
            y[j] = x0 as f32 * d;
            y[j + QK32 / 2] = x1 as f32 * d;
        }
    }
}

pub(crate) fn dequantize_q4_1(x: &[BlockQ4_1], y: &mut [f32]) {
    for (b, y) in x.iter().zip(y.chunks_exact_mut(QK32)) {
        let d = fp16_to_fp32(b.d);
        let m = fp16_to_fp32(b.m);
        for j in 0..QK32 / 2 {
            let x0 = (b.qs[j] & 0x0F) as i32;
            let x1 = (b.qs[j] >> 4) as i32;
            y[j] = x0 as f32 * d + m;
            y[j + QK32 / 2] = x1 as f32 * d + m;
        }
    }
}

/// Bit 4 of elements `j` and `j + 16` of a Q5 block, as 0 or 0x10.
#[inline(always)]
pub(crate) fn q5_high_bits(qh: u32, j: usize) -> (u8, u8) {
    let h0 = (((qh >> j) << 4) & 0x10) as u8;
    let h1 = ((qh >> (j + 12)) & 0x10) as u8;
    (h0, h1)
}

pub(crate) fn dequantize_q5_0(x: &[BlockQ5_0], y: &mut [f32]) {
    for (b, y) in x.iter().zip(y.chunks_exact_mut(QK32)) {
        let d = fp16_to_fp32(b.d);
        let qh = u32::from_le_bytes(b.qh);
        for j in 0..QK32 / 2 {
            let (h0, h1) = q5_high_bits(qh, j);
            let x0 = ((b.qs[j] & 0x0F) | h0) as i32 - 16;
            let x1 = ((b.qs[j] >> 4) | h1) as i32 - 16;
            y[j] = x0 as f32 * d;
            y[j + QK32 / 2] = x1 as f32 * d;
        }
    }
}

pub(crate) fn dequantize_q5_1(x: &[BlockQ5_1], y: &mut [f32]) {
    for (b, y) in x.iter().zip(y.chunks_exact_mut(QK32)) {
        let d = fp16_to_fp32(b.d);
        let m = fp16_to_fp32(b.m);
        let qh = u32::from_le_bytes(b.qh);
        for j in 0..QK32 / 2 {
            let (h0, h1) = q5_high_bits(qh, j);
            let x0 = ((b.qs[j] & 0x0F) | h0) as i32;
            let x1 = ((b.qs[j] >> 4) | h1) as i32;
            y[j] = x0 as f32 * d + m;
            y[j + QK32 / 2] = x1 as f32 * d + m;
        }
    }
}

pub(crate) fn dequantize_q8_0(x: &[BlockQ8_0], y: &mut [f32]) {
    for (b, y) in x.iter().zip(y.chunks_exact_mut(QK32)) {
        let d = fp16_to_fp32(b.d);
        for (y, &q) in y.iter_mut().zip(b.qs.iter()) {
            *y = q as f32 * d;
        }
    }
}
