//! AVX2 quantization of activation rows for the tile kernels: the same
//! quants, scales and sums as the scalar loop in `crate::packed`, eight lanes
//! at a time (a prompt quantizes every row of every matrix input).

use std::arch::x86_64::*;

/// The largest magnitude of a 32-element block, by the scalar loop's `max`
/// on every lane, then across lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block_amax(x: *const f32) -> f32 {
    let sign = _mm256_set1_ps(-0.0);
    let abs = |i: usize| _mm256_andnot_ps(sign, _mm256_loadu_ps(x.add(8 * i)));
    let m = _mm256_max_ps(_mm256_max_ps(abs(0), abs(1)), _mm256_max_ps(abs(2), abs(3)));
    let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
    let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    _mm_cvtss_f32(_mm_max_ss(m2, _mm_movehdup_ps(m2)))
}

/// A block's quants for the multiplier `id` (rounded half to even, as the
/// scalar loop's magic-number rounding), written to `q`; returns the sums of
/// each half.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block_quants(x: *const f32, id: __m256, q: *mut u8) -> (i32, i32) {
    let v = [_mm256_loadu_ps(x), _mm256_loadu_ps(x.add(8)), _mm256_loadu_ps(x.add(16)), _mm256_loadu_ps(x.add(24))];
    let i = v.map(|v| _mm256_cvtps_epi32(_mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(v, id))));
    let hsum = |a: __m256i| {
        let s = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256::<1>(a));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
        _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s)))
    };
    let p = _mm256_packs_epi16(_mm256_packs_epi32(i[0], i[1]), _mm256_packs_epi32(i[2], i[3]));
    let p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(q.cast(), p);
    (hsum(_mm256_add_epi32(i[0], i[1])), hsum(_mm256_add_epi32(i[2], i[3])))
}

/// A whole activation row (`nb` blocks of `x`) in the tile kernels' layout
/// (see `crate::packed::act_row_bytes`), eight blocks at a time: their
/// scales and multipliers by one vector division each, their heads by vector
/// f16 rounding, all as the scalar loop rounds them. A row is quantized for
/// every matrix input of every pass, so a division and two scalar f16
/// conversions per block were a visible share of a prompt.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `x` holds `32 nb` floats, `head` `16 nb`
/// bytes and `qs` `32 nb` bytes.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn quantize_row(x: *const f32, nb: usize, head: *mut u8, qs: *mut u8) {
    let mut b0 = 0;
    while b0 < nb {
        let n = (nb - b0).min(8);
        let mut amax = [0.0f32; 8];
        for (i, m) in amax[..n].iter_mut().enumerate() {
            *m = block_amax(x.add(32 * (b0 + i)));
        }
        let am = _mm256_loadu_ps(amax.as_ptr());
        let d = _mm256_div_ps(am, _mm256_set1_ps(127.0));
        // 127 / amax, and 0 for an all-zero block (a NaN amax keeps its NaN).
        let zero = _mm256_cmp_ps::<_CMP_EQ_OQ>(am, _mm256_setzero_ps());
        let id = _mm256_andnot_ps(zero, _mm256_div_ps(_mm256_set1_ps(127.0), am));
        let mut ids = [0.0f32; 8];
        _mm256_storeu_ps(ids.as_mut_ptr(), id);
        let (mut sums, mut halves) = ([0i32; 8], [0i32; 8]);
        for i in 0..n {
            let b = b0 + i;
            let (lo, hi) = block_quants(x.add(32 * b), _mm256_set1_ps(ids[i]), qs.add(32 * b));
            sums[i] = lo + hi;
            halves[i] = (lo as i16 as u16 as i32) | ((hi as i16 as i32) << 16);
        }
        let sum = _mm256_cvtepi32_ps(_mm256_loadu_si256(sums.as_ptr().cast()));
        let round16 = |v: __m256| _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v));
        let d16 = round16(d);
        let parts = [
            (0, _mm256_castps_si256(d16)),
            (nb, _mm256_castps_si256(round16(_mm256_mul_ps(sum, d)))),
            (2 * nb, _mm256_castps_si256(_mm256_mul_ps(d16, sum))),
            (3 * nb, _mm256_loadu_si256(halves.as_ptr().cast())),
        ];
        for (at, v) in parts {
            let dst = head.add(4 * (at + b0));
            if n == 8 {
                _mm256_storeu_si256(dst.cast(), v);
            } else {
                let mut tmp = [0u8; 32];
                _mm256_storeu_si256(tmp.as_mut_ptr().cast(), v);
                std::ptr::copy_nonoverlapping(tmp.as_ptr(), dst, 4 * n);
            }
        }
        b0 += n;
    }
}
