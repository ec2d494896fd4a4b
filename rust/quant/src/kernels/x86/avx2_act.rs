//! AVX2 quantization of activation rows for the tile kernels: the same
//! quants, scales and sums as the scalar loop in `crate::packed`, eight lanes
//! at a time (a prompt quantizes every row of every matrix input).

use std::arch::x86_64::*;

/// The largest magnitudes of up to eight 32-element blocks (`n` of them),
/// lane `b` block `b`'s (0 past `n`). Each block's lanes are folded by the
/// scalar loop's `max`, in halves, then pairs, then neighbours, the first
/// operand always the lower lanes, so a NaN goes where a block alone would
/// take it; the eight blocks are folded side by side, so the scales meet
/// their maxima in a register rather than through eight scalar stores read
/// back as a vector, a load that waits for every one of them.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn blocks_amax(x: *const f32, n: usize) -> __m256 {
    let sign = _mm256_set1_ps(-0.0);
    let m: [__m256; 8] = std::array::from_fn(|b| match b < n {
        true => {
            let abs = |i: usize| _mm256_andnot_ps(sign, _mm256_loadu_ps(x.add(32 * b + 8 * i)));
            _mm256_max_ps(_mm256_max_ps(abs(0), abs(1)), _mm256_max_ps(abs(2), abs(3)))
        }
        false => _mm256_setzero_ps(),
    });
    // Lane l with l + 4: block b's four in the low half, block c's in the high.
    let halves = |b: usize, c: usize| {
        _mm256_max_ps(_mm256_permute2f128_ps::<0x20>(m[b], m[c]), _mm256_permute2f128_ps::<0x31>(m[b], m[c]))
    };
    // Lane l with l + 2: two blocks' pairs in each half.
    let pairs = |p: __m256, r: __m256| {
        _mm256_max_ps(_mm256_shuffle_ps::<0b01_00_01_00>(p, r), _mm256_shuffle_ps::<0b11_10_11_10>(p, r))
    };
    let (p0, p1) = (pairs(halves(0, 1), halves(2, 3)), pairs(halves(4, 5), halves(6, 7)));
    // Lane l with l + 1: blocks 0 2 4 6 in the low half, 1 3 5 7 in the high.
    let m1 = _mm256_max_ps(_mm256_shuffle_ps::<0b10_00_10_00>(p0, p1), _mm256_shuffle_ps::<0b11_01_11_01>(p0, p1));
    _mm256_permutevar8x32_ps(m1, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
}

/// The sums of eight vectors' lanes, lane `i` vector `i`'s (integers: in any order).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn lane_sums(v: [__m256i; 8]) -> __m256i {
    let h = |a: usize, b: usize| _mm256_hadd_epi32(v[a], v[b]);
    let (u0, u1) = (_mm256_hadd_epi32(h(0, 1), h(2, 3)), _mm256_hadd_epi32(h(4, 5), h(6, 7)));
    _mm256_add_epi32(_mm256_permute2x128_si256::<0x20>(u0, u1), _mm256_permute2x128_si256::<0x31>(u0, u1))
}

/// A block's quants for the multiplier `id` (rounded half to even, as the
/// scalar loop's magic-number rounding), written to `q`; returns each
/// half's quants summed into eight lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block_quants(x: *const f32, id: __m256, q: *mut u8) -> (__m256i, __m256i) {
    let v = [_mm256_loadu_ps(x), _mm256_loadu_ps(x.add(8)), _mm256_loadu_ps(x.add(16)), _mm256_loadu_ps(x.add(24))];
    let i = v.map(|v| _mm256_cvtps_epi32(_mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(v, id))));
    let p = _mm256_packs_epi16(_mm256_packs_epi32(i[0], i[1]), _mm256_packs_epi32(i[2], i[3]));
    let p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(q.cast(), p);
    (_mm256_add_epi32(i[0], i[1]), _mm256_add_epi32(i[2], i[3]))
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
        let am = blocks_amax(x.add(32 * b0), n);
        let d = _mm256_div_ps(am, _mm256_set1_ps(127.0));
        // 127 / amax, and 0 for an all-zero block (a NaN amax keeps its NaN).
        let zero = _mm256_cmp_ps::<_CMP_EQ_OQ>(am, _mm256_setzero_ps());
        let id = _mm256_andnot_ps(zero, _mm256_div_ps(_mm256_set1_ps(127.0), am));
        let (mut lo, mut hi) = ([_mm256_setzero_si256(); 8], [_mm256_setzero_si256(); 8]);
        for i in 0..n {
            let b = b0 + i;
            let id_i = _mm256_permutevar8x32_ps(id, _mm256_set1_epi32(i as i32));
            (lo[i], hi[i]) = block_quants(x.add(32 * b), id_i, qs.add(32 * b));
        }
        let (lo, hi) = (lane_sums(lo), lane_sums(hi));
        // Each half's sum fits 16 bits (16 quants of at most 127).
        let halves = _mm256_blend_epi16::<0b1010_1010>(lo, _mm256_slli_epi32::<16>(hi));
        let sum = _mm256_cvtepi32_ps(_mm256_add_epi32(lo, hi));
        let round16 = |v: __m256| _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v));
        let d16 = round16(d);
        let parts = [
            (0, _mm256_castps_si256(d16)),
            (nb, _mm256_castps_si256(round16(_mm256_mul_ps(sum, d)))),
            (2 * nb, _mm256_castps_si256(_mm256_mul_ps(d16, sum))),
            (3 * nb, halves),
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
