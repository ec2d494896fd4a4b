//! Activation quantization: which format a weight type's dot product wants
//! its activations in, and the quantizers producing it, rounding exactly as
//! ggml's reference quantizers do.

#![allow(non_snake_case)]

use ember_gguf::GgmlType;

use crate::blocks::{as_blocks_mut, float, BlockQ8K, BlockQ8_0, BlockQ8_1, QK32, QK_K};
use crate::QuantError;

/// The format of an activation row, as consumed by the dot kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum ActType {
    /// 32-element blocks, f16 scale, i8 quants.
    Q8_0,
    /// 32-element blocks, f16 scale, f16 `d * Σ q`, i8 quants.
    Q8_1,
    /// 256-element blocks, f32 scale, i8 quants, i16 sums of 16.
    Q8_K,
    /// Plain little-endian f32.
    F32,
    /// Plain little-endian f16.
    F16,
    /// Plain little-endian bf16.
    BF16,
}

impl ActType {
    /// Elements per block (1 for the float formats).
    pub fn block_size(self) -> usize {
        match self {
            ActType::Q8_0 | ActType::Q8_1 => QK32,
            ActType::Q8_K => QK_K,
            ActType::F32 | ActType::F16 | ActType::BF16 => 1,
        }
    }

    /// Bytes per block.
    pub fn type_size(self) -> usize {
        match self {
            ActType::Q8_0 => std::mem::size_of::<BlockQ8_0>(),
            ActType::Q8_1 => std::mem::size_of::<BlockQ8_1>(),
            ActType::Q8_K => std::mem::size_of::<BlockQ8K>(),
            ActType::F32 => 4,
            ActType::F16 | ActType::BF16 => 2,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ActType::Q8_0 => "Q8_0",
            ActType::Q8_1 => "Q8_1",
            ActType::Q8_K => "Q8_K",
            ActType::F32 => "F32",
            ActType::F16 => "F16",
            ActType::BF16 => "BF16",
        }
    }
}

/// The activation format the dot kernel of weight type `w` consumes.
///
/// Types without a dot kernel ([`crate::dot_fn`] returns `None`) map to
/// `F32`: the only way to multiply with them is to dequantize the weights and
/// use the f32 kernel.
pub fn activation_type(w: GgmlType) -> ActType {
    use GgmlType::*;
    match w {
        Q4_0 | Q5_0 | Q8_0 | IQ4_NL => ActType::Q8_0,
        Q4_1 | Q5_1 => ActType::Q8_1,
        Q2_K | Q3_K | Q4_K | Q5_K | Q6_K | Q8_K | IQ4_XS => ActType::Q8_K,
        F16 => ActType::F16,
        BF16 => ActType::BF16,
        _ => ActType::F32,
    }
}

/// Bytes of an activation row of `k` elements, or `None` when `k` is not a
/// whole number of blocks.
pub fn act_row_bytes(act: ActType, k: usize) -> Option<usize> {
    let bs = act.block_size();
    if !k.is_multiple_of(bs) {
        return None;
    }
    (k / bs).checked_mul(act.type_size())
}

fn check_lengths(act: ActType, k: usize, out_len: usize) -> Result<(), QuantError> {
    let expected = act_row_bytes(act, k).ok_or(QuantError::NotBlockMultiple {
        format: act.name(),
        n: k,
        block: act.block_size(),
    })?;
    if out_len != expected {
        return Err(QuantError::Length {
            format: act.name(),
            what: "output row",
            expected,
            got: out_len,
        });
    }
    Ok(())
}

/// Converts one activation row `x` to `act`, replacing the contents of `out`
/// (its capacity is reused, so one buffer can serve every row).
pub fn quantize_activation(act: ActType, x: &[f32], out: &mut Vec<u8>) -> Result<(), QuantError> {
    let bytes = act_row_bytes(act, x.len()).ok_or(QuantError::NotBlockMultiple {
        format: act.name(),
        n: x.len(),
        block: act.block_size(),
    })?;
    out.clear();
    out.resize(bytes, 0);
    match act {
        ActType::Q8_0 => quantize_row_q8_0(x, out),
        ActType::Q8_1 => quantize_row_q8_1(x, out),
        ActType::Q8_K => quantize_row_q8_K(x, out),
        ActType::F32 => {
            for (o, v) in out.chunks_exact_mut(4).zip(x) {
                o.copy_from_slice(&v.to_le_bytes());
            }
            Ok(())
        }
        ActType::F16 => {
            for (o, &v) in out.chunks_exact_mut(2).zip(x) {
                o.copy_from_slice(&float::fp32_to_fp16(v).to_bits().to_le_bytes());
            }
            Ok(())
        }
        ActType::BF16 => {
            for (o, &v) in out.chunks_exact_mut(2).zip(x) {
                o.copy_from_slice(&float::fp32_to_bf16(v).to_bits().to_le_bytes());
            }
            Ok(())
        }
    }
}

/// How a 32-element activation block is scaled and rounded.
#[derive(Clone, Copy)]
pub(crate) enum Q8Rounding {
    /// ggml's `_ref` quantizers (and the `gguf` Python package): multiplier
    /// `1 / d`, halves away from zero.
    Reference,
    /// llama.cpp's x86 backend (its AVX2 quantizers): multiplier `127 / amax`,
    /// halves to even. Differs from the reference by one step in rare near-tie
    /// elements; the engine uses it because llama.cpp's outputs, the parity
    /// reference, are made on x86.
    X86,
}

/// One block: the f32 scale `d = amax / 127`, the quants, and their sum.
#[inline]
pub(crate) fn q8_block(x: &[f32], rounding: Q8Rounding) -> (f32, [i8; QK32], i32) {
    // Written as ggml's MAX macro so NaN handling matches too.
    let amax = x
        .iter()
        .fold(0.0f32, |m, &v| if m > v.abs() { m } else { v.abs() });
    let d = amax / 127.0;
    let mut qs = [0i8; QK32];
    let mut sum = 0i32;
    match rounding {
        Q8Rounding::Reference => {
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            for (q, &v) in qs.iter_mut().zip(x) {
                *q = (v * id).round() as i8;
                sum += *q as i32;
            }
        }
        Q8Rounding::X86 => {
            let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
            for (q, &v) in qs.iter_mut().zip(x) {
                // nearest_int rounds halves to even without a libm call.
                *q = nearest_int(v * id) as i8;
                sum += *q as i32;
            }
        }
    }
    (d, qs, sum)
}

fn q8_0_row(x: &[f32], out: &mut [u8], rounding: Q8Rounding) -> Result<(), QuantError> {
    check_lengths(ActType::Q8_0, x.len(), out.len())?;
    for (b, x) in as_blocks_mut::<BlockQ8_0>(out)
        .iter_mut()
        .zip(x.chunks_exact(QK32))
    {
        let (d, qs, _) = q8_block(x, rounding);
        b.d = float::fp32_to_fp16(d);
        b.qs = qs;
    }
    Ok(())
}

fn q8_1_row(x: &[f32], out: &mut [u8], rounding: Q8Rounding) -> Result<(), QuantError> {
    check_lengths(ActType::Q8_1, x.len(), out.len())?;
    for (b, x) in as_blocks_mut::<BlockQ8_1>(out)
        .iter_mut()
        .zip(x.chunks_exact(QK32))
    {
        let (d, qs, sum) = q8_block(x, rounding);
        b.d = float::fp32_to_fp16(d);
        b.qs = qs;
        // From the integer sum and the f32 scale: only `s`'s own f16 rounding.
        b.s = float::fp32_to_fp16(sum as f32 * d);
    }
    Ok(())
}

/// Q8_0 as ggml's `quantize_row_q8_0_ref`: `d = amax / 127`, `q = round_half_away(x / d)`.
pub fn quantize_row_q8_0_ref(x: &[f32], out: &mut [u8]) -> Result<(), QuantError> {
    q8_0_row(x, out, Q8Rounding::Reference)
}

/// Q8_0 as llama.cpp's x86 backend computes it (see `Q8Rounding::X86`): the engine's.
pub fn quantize_row_q8_0(x: &[f32], out: &mut [u8]) -> Result<(), QuantError> {
    q8_0_row(x, out, Q8Rounding::X86)
}

/// Q8_1 as ggml's `quantize_row_q8_1_ref`: the quants of [`quantize_row_q8_0_ref`]
/// and `s = d * Σ q`.
pub fn quantize_row_q8_1_ref(x: &[f32], out: &mut [u8]) -> Result<(), QuantError> {
    q8_1_row(x, out, Q8Rounding::Reference)
}

/// Q8_1 as llama.cpp's x86 backend computes it: the engine's.
pub fn quantize_row_q8_1(x: &[f32], out: &mut [u8]) -> Result<(), QuantError> {
    q8_1_row(x, out, Q8Rounding::X86)
}

/// ggml's `nearest_int`: round to nearest, ties to even, via the
/// 1.5 * 2^23 magic constant (valid for |x| < 2^22, far beyond ±127).
#[inline(always)]
fn nearest_int(x: f32) -> i32 {
    let val = x + 12_582_912.0f32;
    (val.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// Quantizes `x` to Q8_K blocks in `out` as ggml's `quantize_row_q8_K_ref`.
///
/// The scale comes from the element of largest magnitude *with its sign*:
/// `iscale = -127 / max`, so that element maps to exactly -127 and no quant
/// is ever -128 (ggml's IQ kernels rely on that), and `d = 1 / iscale` is
/// negative when `max` is positive.
pub fn quantize_row_q8_K(x: &[f32], out: &mut [u8]) -> Result<(), QuantError> {
    check_lengths(ActType::Q8_K, x.len(), out.len())?;
    let blocks = as_blocks_mut::<BlockQ8K>(out);
    for (b, x) in blocks.iter_mut().zip(x.chunks_exact(QK_K)) {
        let mut max = 0.0f32;
        let mut amax = 0.0f32;
        for &v in x {
            let a = v.abs();
            if a > amax {
                amax = a;
                max = v;
            }
        }
        let mut qs = [0i8; QK_K];
        let mut bsums = [0i16; QK_K / 16];
        if amax == 0.0 {
            b.d = 0.0;
            b.qs = qs;
            b.bsums = bsums;
            continue;
        }
        let iscale = -127.0f32 / max;
        for (q, &v) in qs.iter_mut().zip(x) {
            *q = nearest_int(iscale * v).min(127) as i8;
        }
        for (s, q) in bsums.iter_mut().zip(qs.chunks_exact(16)) {
            *s = q.iter().map(|&q| q as i16).sum();
        }
        b.qs = qs;
        b.bsums = bsums;
        b.d = 1.0 / iscale;
    }
    Ok(())
}
