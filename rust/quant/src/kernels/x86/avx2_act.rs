//! AVX2 quantization of activation rows for the tile kernels: the same
//! quants, scales and sums as the scalar loop in `crate::packed`, eight lanes
//! at a time (a prompt quantizes every row of every matrix input).

use std::arch::x86_64::*;

/// One 32-element block: its quants written to `q`; returns `amax` (the
/// largest magnitude), the sum of the quants and the sums of each half.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `x` holds 32 floats and `q` 32 bytes.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q8_block(x: *const f32, q: *mut u8) -> (f32, i32, i32, i32) {
    let v = [_mm256_loadu_ps(x), _mm256_loadu_ps(x.add(8)), _mm256_loadu_ps(x.add(16)), _mm256_loadu_ps(x.add(24))];
    let sign = _mm256_set1_ps(-0.0);
    let abs = v.map(|v| _mm256_andnot_ps(sign, v));
    let m = _mm256_max_ps(_mm256_max_ps(abs[0], abs[1]), _mm256_max_ps(abs[2], abs[3]));
    let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
    let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    let amax = _mm_cvtss_f32(_mm_max_ss(m2, _mm_movehdup_ps(m2)));
    let id = _mm256_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
    // Halves to even, as the scalar loop's magic-number rounding.
    let i = v.map(|v| _mm256_cvtps_epi32(_mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(v, id))));
    let hsum = |a: __m256i| {
        let s = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256::<1>(a));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
        _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s)))
    };
    let (lo, hi) = (hsum(_mm256_add_epi32(i[0], i[1])), hsum(_mm256_add_epi32(i[2], i[3])));
    // packs interleave 128-bit lanes; the permute puts the 32 bytes back in order.
    let p = _mm256_packs_epi16(_mm256_packs_epi32(i[0], i[1]), _mm256_packs_epi32(i[2], i[3]));
    let p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(q.cast(), p);
    (amax, lo + hi, lo, hi)
}
