//! The softmax's exponential and a norm's sum of squares on sixteen lanes
//! (AVX-512 F), with the same roundings as the eight-lane forms and the
//! scalar twins (operation for operation but the exponential's last, a
//! scaling by a power of two, exact in both forms), so the three agree bit
//! for bit.

use std::arch::x86_64::*;

use half::bf16;

use super::*;

/// The level ember runs at has AVX-512 (see `ember_quant::level`).
pub(super) fn available() -> bool {
    ember_quant::level() >= ember_quant::SimdLevel::Avx512Vnni
}

/// The level ember runs at has AVX-512 BF16.
pub(super) fn bf16_available() -> bool {
    ember_quant::level() >= ember_quant::SimdLevel::Avx512Bf16
}

#[inline]
#[target_feature(enable = "avx2,fma,avx512f")]
unsafe fn exp16(x: __m512) -> __m512 {
    // A NaN to the clamp (the second operand), as `f32::max` takes it.
    let x = _mm512_max_ps(x, _mm512_set1_ps(EXP_LO));
    // Round to nearest, halves to even, as `_mm256_round_ps` and `round_ties_even`.
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm512_mul_ps(
        x,
        _mm512_set1_ps(LOG2E),
    ));
    let r = _mm512_fmadd_ps(n, _mm512_set1_ps(-LN2), x);
    let mut p = _mm512_set1_ps(SOFTMAX_POLY[0]);
    for &c in &SOFTMAX_POLY[1..] {
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
    }
    let y = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0));
    // y times 2^n in one instruction where the eight-lane form builds 2^n's
    // bits and multiplies: n is whole, so both are the product y * 2^n
    // rounded once (the same where it is subnormal).
    _mm512_scalef_ps(y, n)
}

/// The loop of both `exp_shifted_sum` forms over `n` floats at `src`:
/// sixteen at a time, the last sixteen or fewer under a mask (element
/// `i + k` into lane `k`), the sum's lanes in one vector; `store(i, e, mask)`
/// keeps the exponentials of elements `i..` (those of the mask). The `nn`
/// floats at `next` are read beside, thirty-two a step while they last, for
/// their maximum. A macro, so that `store` is a closure of the function it
/// expands in and takes that function's target features.
macro_rules! exp_sum_loop {
    ($src:expr, $n:expr, $shift:expr, $next:expr, $store:expr) => {{
        let (p, n, s, store) = ($src, $n, _mm512_set1_ps($shift), $store);
        let (q, nn): (*const f32, usize) = ($next.as_ptr(), $next.len());
        let none = _mm512_set1_ps(f32::NEG_INFINITY);
        let (mut sum, mut max_a, mut max_b) = (_mm512_setzero_ps(), none, none);
        let (mut i, mut k) = (0, 0);
        // Two at a time: each is a chain of some fifteen dependent operations.
        while i + 32 <= n {
            let a = exp16(_mm512_sub_ps(_mm512_loadu_ps(p.add(i)), s));
            let b = exp16(_mm512_sub_ps(_mm512_loadu_ps(p.add(i + 16)), s));
            if k + 32 <= nn {
                max_a = _mm512_max_ps(max_a, _mm512_loadu_ps(q.add(k)));
                max_b = _mm512_max_ps(max_b, _mm512_loadu_ps(q.add(k + 16)));
                k += 32;
            }
            store(i, a, u16::MAX);
            store(i + 16, b, u16::MAX);
            sum = _mm512_add_ps(_mm512_add_ps(sum, a), b);
            i += 32;
        }
        while i < n {
            let m: __mmask16 = (1u32 << (n - i).min(16)).wrapping_sub(1) as u16;
            let a = _mm512_maskz_mov_ps(m, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, p.add(i)), s)));
            store(i, a, m);
            sum = _mm512_add_ps(sum, a);
            i += 16;
        }
        while k < nn {
            let m: __mmask16 = (1u32 << (nn - k).min(16)).wrapping_sub(1) as u16;
            max_a = _mm512_max_ps(max_a, _mm512_mask_loadu_ps(none, m, q.add(k)));
            k += 16;
        }
        let mut lanes = [0.0f32; 16];
        _mm512_storeu_ps(lanes.as_mut_ptr(), sum);
        ExpSum { sum: sum_lanes(lanes), next_max: _mm512_reduce_max_ps(_mm512_max_ps(max_a, max_b)) }
    }};
}

/// [`super::exp_shifted_sum`] on sixteen lanes (`F16`: the exponentials
/// kept rounded to f16, as [`super::exp_shifted_sum_f16`] keeps them).
#[target_feature(enable = "avx2,fma,avx512f")]
pub(super) unsafe fn exp_shifted_sum<const F16: bool>(row: &mut [f32], shift: f32, next: &[f32]) -> ExpSum {
    let (n, p) = (row.len(), row.as_mut_ptr());
    exp_sum_loop!(p.cast_const(), n, shift, next, |i: usize, e: __m512, m: __mmask16| {
        let e = match F16 {
            true => _mm512_cvtph_ps(_mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(e)),
            false => e,
        };
        match m {
            u16::MAX => _mm512_storeu_ps(p.add(i), e),
            _ => _mm512_mask_storeu_ps(p.add(i), m, e),
        }
    })
}

/// [`super::exp_shifted_sum_bf16`] on sixteen lanes, each vector of
/// exponentials rounded by AVX-512 BF16's conversion (to nearest even, a
/// subnormal read as a zero of its sign, as `to_bf16` rounds).
#[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vl,avx512bf16")]
pub(super) unsafe fn exp_shifted_sum_bf16(row: &[f32], shift: f32, out: &mut [bf16], next: &[f32]) -> ExpSum {
    let (n, o) = (row.len().min(out.len()), out.as_mut_ptr());
    exp_sum_loop!(row.as_ptr(), n, shift, next, |i: usize, e: __m512, m: __mmask16| {
        let narrowed = std::mem::transmute::<__m256bh, __m256i>(_mm512_cvtneps_pbh(e));
        match m {
            u16::MAX => _mm256_storeu_si256(o.add(i).cast(), narrowed),
            _ => _mm256_mask_storeu_epi16(o.add(i).cast(), m, narrowed),
        }
    })
}

/// [`super::sum_squares`] on sixteen lanes, each square rounded before it is
/// added, as the scalar form.
#[target_feature(enable = "avx2,fma,avx512f")]
pub(super) unsafe fn sum_squares(x: &[f32]) -> f32 {
    let (n, p) = (x.len(), x.as_ptr());
    let mut acc = _mm512_setzero_ps();
    let mut i = 0;
    while i + 16 <= n {
        let a = _mm512_loadu_ps(p.add(i));
        acc = _mm512_add_ps(acc, _mm512_mul_ps(a, a));
        i += 16;
    }
    let mut lanes = [0.0f32; 16];
    _mm512_storeu_ps(lanes.as_mut_ptr(), acc);
    sum_squares_from(&x[i..], lanes)
}
