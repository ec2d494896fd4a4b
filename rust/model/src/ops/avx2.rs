//! The vector forms of `super`'s elementwise loops in AVX2, FMA and F16C,
//! operation for operation as their scalar twins (`super::*_scalar`), so the
//! two agree bit for bit.

use std::arch::x86_64::*;

use super::*;

/// The level ember runs at has AVX2, FMA and F16C (see `ember_quant::level`).
pub(super) fn available() -> bool {
    ember_quant::level() >= ember_quant::SimdLevel::Avx2
}

#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn exp8<const SOFTMAX: bool>(x: __m256) -> __m256 {
    // A NaN to the lower clamp (the second operand), as `f32::max` takes it.
    let x = _mm256_max_ps(x, _mm256_set1_ps(EXP_LO));
    let x = match SOFTMAX {
        true => x,
        false => _mm256_min_ps(x, _mm256_set1_ps(EXP_HI)),
    };
    let n =
        _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(x, _mm256_set1_ps(LOG2E)));
    let (r, poly): (_, &[f32]) = match SOFTMAX {
        true => (_mm256_fmadd_ps(n, _mm256_set1_ps(-LN2), x), &SOFTMAX_POLY),
        false => {
            let r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_HI), x);
            (_mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_LO), r), &EXP_POLY)
        }
    };
    let mut p = _mm256_set1_ps(poly[0]);
    for &c in &poly[1..] {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
    }
    let y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0));
    let scale =
        _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127))));
    _mm256_mul_ps(y, scale)
}

/// [`super::exp_shifted_sum`] on eight lanes, the sum's sixteen lanes in two
/// vectors, a row's eight elements into one and the next eight into the
/// other (`F16`: the exponentials kept rounded to f16, as
/// [`super::exp_shifted_sum_f16`] keeps them); `next` read beside, sixteen
/// floats a step while they last, for its maximum.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn exp_shifted_sum<const F16: bool>(row: &mut [f32], shift: f32, next: &[f32]) -> ExpSum {
    let (n, p) = (row.len(), row.as_mut_ptr());
    let (nn, q) = (next.len(), next.as_ptr());
    let s = _mm256_set1_ps(shift);
    let kept = |e: __m256| match F16 {
        true => _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(e)),
        false => e,
    };
    let (mut lo, mut hi) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let none = _mm256_set1_ps(f32::NEG_INFINITY);
    let (mut max_a, mut max_b) = (none, none);
    let (mut i, mut k) = (0, 0);
    while i + 16 <= n {
        let a = exp8::<true>(_mm256_sub_ps(_mm256_loadu_ps(p.add(i)), s));
        let b = exp8::<true>(_mm256_sub_ps(_mm256_loadu_ps(p.add(i + 8)), s));
        if k + 16 <= nn {
            max_a = _mm256_max_ps(max_a, _mm256_loadu_ps(q.add(k)));
            max_b = _mm256_max_ps(max_b, _mm256_loadu_ps(q.add(k + 8)));
            k += 16;
        }
        _mm256_storeu_ps(p.add(i), kept(a));
        _mm256_storeu_ps(p.add(i + 8), kept(b));
        lo = _mm256_add_ps(lo, a);
        hi = _mm256_add_ps(hi, b);
        i += 16;
    }
    while k + 8 <= nn {
        max_a = _mm256_max_ps(max_a, _mm256_loadu_ps(q.add(k)));
        k += 8;
    }
    let mut lanes = [0.0f32; 16];
    _mm256_storeu_ps(lanes.as_mut_ptr(), lo);
    _mm256_storeu_ps(lanes.as_mut_ptr().add(8), hi);
    let mut maxima = [0.0f32; 8];
    _mm256_storeu_ps(maxima.as_mut_ptr(), _mm256_max_ps(max_a, max_b));
    ExpSum {
        sum: exp_shifted_sum_from::<F16>(&mut row[i..], shift, lanes),
        next_max: max_of(&next[k..]).max(max_of(&maxima)),
    }
}

/// [`gelu_table`] on eight lanes: rounded to f16 as `f16::from_f32`
/// rounds (to nearest even), looked up, widened back; the limits at ±10.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn gelu_mul(out: &mut [f32], g: &[f32], u: &[f32], table: &[u16]) {
    assert_eq!(table.len(), 1 << 16, "one entry per f16");
    let n = out.len().min(g.len()).min(u.len());
    let (o, gp, up, tp) = (out.as_mut_ptr(), g.as_ptr(), u.as_ptr(), table.as_ptr());
    let (lo, hi) = (_mm256_set1_ps(-10.0), _mm256_set1_ps(10.0));
    let mut i = 0;
    let mut idx = [0u16; 8];
    while i + 8 <= n {
        let x = _mm256_loadu_ps(gp.add(i));
        _mm_storeu_si128(idx.as_mut_ptr().cast(), _mm256_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT }>(x));
        let looked = idx.map(|h| *tp.add(h as usize));
        let y = _mm256_cvtph_ps(_mm_loadu_si128(looked.as_ptr().cast()));
        // x >= 10 keeps x; x <= -10 gives 0 (the table is never read there).
        let y = _mm256_blendv_ps(y, x, _mm256_cmp_ps::<_CMP_GE_OQ>(x, hi));
        let y = _mm256_andnot_ps(_mm256_cmp_ps::<_CMP_LE_OQ>(x, lo), y);
        _mm256_storeu_ps(o.add(i), _mm256_mul_ps(y, _mm256_loadu_ps(up.add(i))));
        i += 8;
    }
    gelu_mul_scalar(&mut out[i..n], &g[i..n], &u[i..n]);
}

#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn silu_mul(out: &mut [f32], g: &[f32], u: &[f32]) {
    let n = out.len().min(g.len()).min(u.len());
    let (o, gp, up) = (out.as_mut_ptr(), g.as_ptr(), u.as_ptr());
    let one = _mm256_set1_ps(1.0);
    let mut i = 0;
    while i + 8 <= n {
        let gv = _mm256_loadu_ps(gp.add(i));
        let e = exp8::<false>(_mm256_xor_ps(gv, _mm256_set1_ps(-0.0)));
        let v = _mm256_mul_ps(_mm256_div_ps(gv, _mm256_add_ps(one, e)), _mm256_loadu_ps(up.add(i)));
        _mm256_storeu_ps(o.add(i), v);
        i += 8;
    }
    silu_mul_scalar(&mut out[i..n], &g[i..n], &u[i..n]);
}

/// [`super::sum_squares`] on eight lanes: lanes 0-7 in one vector and 8-15
/// in the other, each square rounded before it is added, as the scalar form.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn sum_squares(x: &[f32]) -> f32 {
    let (n, p) = (x.len(), x.as_ptr());
    let (mut lo, mut hi) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let mut i = 0;
    while i + 16 <= n {
        let (a, b) = (_mm256_loadu_ps(p.add(i)), _mm256_loadu_ps(p.add(i + 8)));
        lo = _mm256_add_ps(lo, _mm256_mul_ps(a, a));
        hi = _mm256_add_ps(hi, _mm256_mul_ps(b, b));
        i += 16;
    }
    let mut lanes = [0.0f32; 16];
    _mm256_storeu_ps(lanes.as_mut_ptr(), lo);
    _mm256_storeu_ps(lanes.as_mut_ptr().add(8), hi);
    sum_squares_from(&x[i..], lanes)
}
