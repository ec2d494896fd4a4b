//! The unquantized formats F32, F16 and BF16 (one element per "block"), and
//! their conversions, rounding exactly as ggml does so that activations
//! converted here match the ones llama.cpp would feed its kernels.

use half::{bf16, f16};

/// f32 to bf16 bits as ggml's `ggml_compute_fp32_to_bf16`: round to nearest
/// even, NaN kept NaN (forced quiet) rather than rounded into infinity.
#[inline(always)]
pub fn fp32_to_bf16(x: f32) -> bf16 {
    let u = x.to_bits();
    if (u & 0x7fff_ffff) > 0x7f80_0000 {
        return bf16::from_bits(((u >> 16) | 64) as u16);
    }
    bf16::from_bits((u.wrapping_add(0x7fff + ((u >> 16) & 1)) >> 16) as u16)
}

/// f16 to f32, exactly (every f16 is an f32), without a CPU-feature check
/// per call: a branch-free bit remap the compiler can inline and vectorize.
/// Scales the f16's exponent/mantissa bits, placed as an f32, by 2^112 (exact,
/// and it turns f16 subnormals into the right normals), then restores
/// Inf/NaN exponents and the sign.
#[inline(always)]
pub fn fp16_to_fp32(h: f16) -> f32 {
    const MAGIC: f32 = 5.192_297e33; // 2^112
    const INF_NAN_FLOOR: f32 = 65536.0; // 2^16: where exponent 31 lands
    let h = h.to_bits() as u32;
    let f = f32::from_bits((h & 0x7fff) << 13) * MAGIC;
    let mut bits = f.to_bits();
    if f >= INF_NAN_FLOOR {
        bits |= 0xff << 23;
    }
    f32::from_bits(bits | ((h & 0x8000) << 16))
}

/// f32 to f16, round to nearest even (what F16C's `vcvtps2ph` and ggml do).
#[inline(always)]
pub fn fp32_to_fp16(x: f32) -> f16 {
    f16::from_f32(x)
}

#[inline(always)]
pub(crate) fn read_f32(b: &[u8]) -> f32 {
    f32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

#[inline(always)]
pub(crate) fn read_f16(b: &[u8]) -> f32 {
    fp16_to_fp32(f16::from_bits(u16::from_le_bytes([b[0], b[1]])))
}

#[inline(always)]
pub(crate) fn read_bf16(b: &[u8]) -> f32 {
    f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16)
}

pub(crate) fn dequantize_f32(src: &[u8], y: &mut [f32]) {
    for (y, b) in y.iter_mut().zip(src.chunks_exact(4)) {
        *y = read_f32(b);
    }
}

pub(crate) fn dequantize_f16(src: &[u8], y: &mut [f32]) {
    for (y, b) in y.iter_mut().zip(src.chunks_exact(2)) {
        *y = read_f16(b);
    }
}

pub(crate) fn dequantize_bf16(src: &[u8], y: &mut [f32]) {
    for (y, b) in y.iter_mut().zip(src.chunks_exact(2)) {
        *y = read_bf16(b);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fp16_to_fp32_is_exact_for_every_f16() {
        for bits in 0..=u16::MAX {
            let h = f16::from_bits(bits);
            let (got, want) = (fp16_to_fp32(h), h.to_f32());
            if want.is_nan() {
                // Signaling NaNs may or may not come back quieted (F16C does).
                assert!(got.is_nan(), "{bits:#06x}");
            } else {
                assert_eq!(got.to_bits(), want.to_bits(), "{bits:#06x}");
            }
        }
    }
}
