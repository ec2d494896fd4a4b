//! AVX2 + FMA (+ F16C) dot products for the formats the target models use:
//! Q4_0, Q5_0, Q8_0 against Q8_0, Q4_1, Q5_1 against Q8_1 and Q4_K, Q6_K against Q8_K, ported
//! from ggml's x86 kernels, plus F16 (whose scalar form pays for a software
//! f16 conversion per element). Integer results per block are identical to
//! the scalar twins; only the order of the f32 accumulation differs.
#![allow(non_snake_case)] // the twins' names keep the formats' spelling (q4_K), as scalar.rs does

use std::arch::x86_64::*;

use ember_gguf::GgmlType;
use half::f16;

use crate::blocks::{
    k_quants::k4_scales_mins, row_blocks, Block, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1,
    BlockQ6K, BlockQ8K, BlockQ8_0, BlockQ8_1,
};
use crate::kernels::{DotColsFn, DotFn, MAX_DOT_COLS};

/// Whether this CPU runs the kernels of this module.
pub(crate) fn available() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

/// The AVX2 kernel for `w`, if there is one and the CPU supports it. The
/// kernels below are reachable only through here, which is what makes their
/// `unsafe` calls sound.
pub(crate) fn dot_fn(w: GgmlType) -> Option<DotFn> {
    if !available() {
        return None;
    }
    Some(match w {
        GgmlType::Q4_0 => vec_dot_q4_0_q8_0,
        GgmlType::Q4_1 => vec_dot_q4_1_q8_1,
        GgmlType::Q5_0 => vec_dot_q5_0_q8_0,
        GgmlType::Q5_1 => vec_dot_q5_1_q8_1,
        GgmlType::Q8_0 => vec_dot_q8_0_q8_0,
        GgmlType::Q4_K => vec_dot_q4_K_q8_K,
        GgmlType::Q6_K => vec_dot_q6_K_q8_K,
        GgmlType::F16 => vec_dot_f16_f16,
        _ => return None,
    })
}

fn vec_dot_q4_0_q8_0(k: usize, w_row: &[u8], act_row: &[u8]) -> f32 {
    let (x, y) = (row_blocks(w_row, k), row_blocks(act_row, k));
    // SAFETY: handed out only by `dot_fn` after `available()`.
    unsafe { vec_dot_q4_0_q8_0_impl(x, y) }
}

fn vec_dot_q4_1_q8_1(k: usize, w_row: &[u8], act_row: &[u8]) -> f32 {
    let (x, y) = (row_blocks(w_row, k), row_blocks(act_row, k));
    // SAFETY: handed out only by `dot_fn` after `available()`.
    unsafe { vec_dot_q4_1_q8_1_impl(x, y) }
}

fn vec_dot_q5_1_q8_1(k: usize, w_row: &[u8], act_row: &[u8]) -> f32 {
    let (x, y) = (row_blocks(w_row, k), row_blocks(act_row, k));
    // SAFETY: handed out only by `dot_fn` after `available()`.
    unsafe { vec_dot_q5_1_q8_1_impl(x, y) }
}

fn vec_dot_q5_0_q8_0(k: usize, w_row: &[u8], act_row: &[u8]) -> f32 {
    let (x, y) = (row_blocks(w_row, k), row_blocks(act_row, k));
    // SAFETY: handed out only by `dot_fn` after `available()`.
    unsafe { vec_dot_q5_0_q8_0_impl(x, y) }
}

fn vec_dot_q8_0_q8_0(k: usize, w_row: &[u8], act_row: &[u8]) -> f32 {
    let (x, y) = (row_blocks(w_row, k), row_blocks(act_row, k));
    // SAFETY: handed out only by `dot_fn` after `available()`.
    unsafe { vec_dot_q8_0_q8_0_impl(x, y) }
}

fn vec_dot_q4_K_q8_K(k: usize, w_row: &[u8], act_row: &[u8]) -> f32 {
    let (x, y) = (row_blocks(w_row, k), row_blocks(act_row, k));
    let mut out = [0.0f32];
    // SAFETY: handed out only by `dot_fn` after `available()`.
    unsafe { vec_dot_q4_K_q8_K_cols_impl::<1>(x, &[y, &[], &[], &[]], &mut out) };
    out[0]
}

/// The AVX2 kernel over several activation columns for `w`, where there is
/// one: each weight block's scales are decoded once for all the columns.
pub(crate) fn dot_cols_fn(w: GgmlType) -> Option<DotColsFn> {
    if !available() {
        return None;
    }
    match w {
        GgmlType::Q4_K => Some(vec_dot_q4_K_q8_K_cols),
        GgmlType::Q6_K => Some(vec_dot_q6_K_q8_K_cols),
        _ => None,
    }
}

/// The weight row's blocks and the first `n` activation columns' blocks.
#[allow(clippy::type_complexity)]
fn cols_blocks<'a, B: Block>(
    k: usize,
    w_row: &'a [u8],
    acts: &'a [u8],
    act_stride: usize,
    n: usize,
    out: &[f32],
) -> (&'a [B], [&'a [BlockQ8K]; MAX_DOT_COLS]) {
    assert!((1..=MAX_DOT_COLS).contains(&n) && out.len() >= n, "{n} columns");
    let x = row_blocks::<B>(w_row, k);
    let y = std::array::from_fn(|j| if j < n { row_blocks::<BlockQ8K>(&acts[j * act_stride..], k) } else { &[] });
    (x, y)
}

fn vec_dot_q4_K_q8_K_cols(k: usize, w_row: &[u8], acts: &[u8], act_stride: usize, n: usize, out: &mut [f32]) {
    let (x, y) = cols_blocks::<BlockQ4K>(k, w_row, acts, act_stride, n, out);
    // SAFETY: handed out only by `dot_cols_fn` after `available()`; every
    // column holds as many blocks as the row (row_blocks checked it).
    unsafe {
        match n {
            1 => vec_dot_q4_K_q8_K_cols_impl::<1>(x, &y, out),
            2 => vec_dot_q4_K_q8_K_cols_impl::<2>(x, &y, out),
            3 => vec_dot_q4_K_q8_K_cols_impl::<3>(x, &y, out),
            _ => vec_dot_q4_K_q8_K_cols_impl::<4>(x, &y, out),
        }
    }
}

fn vec_dot_q6_K_q8_K(k: usize, w_row: &[u8], act_row: &[u8]) -> f32 {
    let (x, y) = (row_blocks(w_row, k), row_blocks(act_row, k));
    let mut out = [0.0f32];
    // SAFETY: handed out only by `dot_fn` after `available()`.
    unsafe { vec_dot_q6_K_q8_K_cols_impl::<1>(x, &[y, &[], &[], &[]], &mut out) };
    out[0]
}

fn vec_dot_q6_K_q8_K_cols(k: usize, w_row: &[u8], acts: &[u8], act_stride: usize, n: usize, out: &mut [f32]) {
    let (x, y) = cols_blocks::<BlockQ6K>(k, w_row, acts, act_stride, n, out);
    // SAFETY: handed out only by `dot_cols_fn` after `available()`; every
    // column holds as many blocks as the row (row_blocks checked it).
    unsafe {
        match n {
            1 => vec_dot_q6_K_q8_K_cols_impl::<1>(x, &y, out),
            2 => vec_dot_q6_K_q8_K_cols_impl::<2>(x, &y, out),
            3 => vec_dot_q6_K_q8_K_cols_impl::<3>(x, &y, out),
            _ => vec_dot_q6_K_q8_K_cols_impl::<4>(x, &y, out),
        }
    }
}

fn vec_dot_f16_f16(k: usize, w_row: &[u8], act_row: &[u8]) -> f32 {
    let (w, a) = (&w_row[..2 * k], &act_row[..2 * k]);
    // SAFETY: handed out only by `dot_fn` after `available()`; both slices
    // hold exactly k f16 values.
    unsafe { vec_dot_f16_f16_impl(k, w.as_ptr(), a.as_ptr()) }
}

// ---- helpers (ggml's names) ----

/// An f16 as eight f32 lanes. Broadcasting the 16 bits first (a plain load)
/// matters: inserting them into a register instead makes LLVM merge into
/// whatever register is free, often the accumulator, which chains every
/// block's scale conversion behind the previous block's FMA.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn fp16x8(h: f16) -> __m256 {
    _mm256_cvtph_ps(_mm_set1_epi16(h.to_bits() as i16))
}

/// An f16 as four f32 lanes, for scalar (`_ss`) arithmetic kept in vector
/// registers (see [`fp16x8`] for why it is broadcast).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn fp16x4(h: f16) -> __m128 {
    _mm_cvtph_ps(_mm_set1_epi16(h.to_bits() as i16))
}

/// f16 to f32 without `half`'s per-call CPU check (see [`fp16x8`]).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn fp16(h: f16) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_set1_epi16(h.to_bits() as i16)))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn hsum_float_8(x: __m256) -> f32 {
    let mut res = _mm256_extractf128_ps::<1>(x);
    res = _mm_add_ps(res, _mm256_castps256_ps128(x));
    res = _mm_add_ps(res, _mm_movehl_ps(res, res));
    res = _mm_add_ss(res, _mm_movehdup_ps(res));
    _mm_cvtss_f32(res)
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn hsum_float_4(x: __m128) -> f32 {
    let res = _mm_add_ps(x, _mm_movehl_ps(x, x));
    _mm_cvtss_f32(_mm_add_ss(res, _mm_movehdup_ps(res)))
}

/// 16 bytes of nibbles to 32 bytes: low nibbles first, then high nibbles,
/// which is the element order of the 32-element formats.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn bytes_from_nibbles_32(p: *const u8) -> __m256i {
    let tmp = _mm_loadu_si128(p.cast());
    let bytes = _mm256_set_m128i(_mm_srli_epi16::<4>(tmp), tmp);
    _mm256_and_si256(_mm256_set1_epi8(0xF), bytes)
}

/// Bit `i` of the 32 bits at `p` to byte `i`: 0xFF when set, 0x00 when clear.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn bytes_from_bits_32(p: *const u8) -> __m256i {
    let x32 = p.cast::<u32>().read_unaligned();
    let shuf_mask = _mm256_set_epi64x(
        0x0303030303030303,
        0x0202020202020202,
        0x0101010101010101,
        0x0000000000000000,
    );
    let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(x32 as i32), shuf_mask);
    let bit_mask = _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe);
    let bytes = _mm256_or_si256(bytes, bit_mask);
    _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn sum_i16_pairs_float(x: __m256i) -> __m256 {
    _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_set1_epi16(1), x))
}

/// Unsigned `ax` times signed `sy`, summed in fours to 8 f32 lanes. The
/// intermediate i16 pair sums cannot saturate while `ax <= 128` and
/// `|sy| <= 127`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn mul_sum_us8_pairs_float(ax: __m256i, sy: __m256i) -> __m256 {
    sum_i16_pairs_float(_mm256_maddubs_epi16(ax, sy))
}

/// Signed times signed via `maddubs` (which wants one unsigned side): move
/// x's sign onto y. Exact while y is never -128, which no quantizer here
/// produces.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn mul_sum_i8_pairs_float(x: __m256i, y: __m256i) -> __m256 {
    let ax = _mm256_sign_epi8(x, x);
    let sy = _mm256_sign_epi8(y, x);
    mul_sum_us8_pairs_float(ax, sy)
}

// ---- 32-element formats against Q8_0 / Q8_1 ----

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn vec_dot_q4_0_q8_0_impl(x: &[BlockQ4_0], y: &[BlockQ8_0]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for (x, y) in x.iter().zip(y) {
        let d = _mm256_mul_ps(fp16x8(x.d), fp16x8(y.d));
        let qx = _mm256_sub_epi8(bytes_from_nibbles_32(x.qs.as_ptr()), _mm256_set1_epi8(8));
        let qy = _mm256_loadu_si256(y.qs.as_ptr().cast());
        acc = _mm256_fmadd_ps(d, mul_sum_i8_pairs_float(qx, qy), acc);
    }
    hsum_float_8(acc)
}

/// The min term `m s` takes one scalar FMA per block, the activation block
/// carrying `s = dy Σ qy` precomputed (Q8_1), as ggml's AVX2 kernel.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn vec_dot_q4_1_q8_1_impl(x: &[BlockQ4_1], y: &[BlockQ8_1]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let mut acc_m = _mm_setzero_ps();
    for (x, y) in x.iter().zip(y) {
        let d0d1 = _mm256_mul_ps(fp16x8(x.d), fp16x8(y.d));
        acc_m = _mm_fmadd_ss(fp16x4(x.m), fp16x4(y.s), acc_m);
        let qx = bytes_from_nibbles_32(x.qs.as_ptr());
        let qy = _mm256_loadu_si256(y.qs.as_ptr().cast());
        acc = _mm256_fmadd_ps(d0d1, mul_sum_us8_pairs_float(qx, qy), acc);
    }
    hsum_float_8(acc) + _mm_cvtss_f32(acc_m)
}

/// As [`vec_dot_q4_1_q8_1_impl`], the fifth bit ORed in as 0x10: the quants stay
/// unsigned (0..32), so `maddubs` applies directly.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn vec_dot_q5_1_q8_1_impl(x: &[BlockQ5_1], y: &[BlockQ8_1]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let mut acc_m = _mm_setzero_ps();
    for (x, y) in x.iter().zip(y) {
        let d0d1 = _mm256_mul_ps(fp16x8(x.d), fp16x8(y.d));
        acc_m = _mm_fmadd_ss(fp16x4(x.m), fp16x4(y.s), acc_m);
        let qx = bytes_from_nibbles_32(x.qs.as_ptr());
        let bxhi = bytes_from_bits_32(x.qh.as_ptr());
        let qx = _mm256_or_si256(qx, _mm256_and_si256(bxhi, _mm256_set1_epi8(0x10)));
        let qy = _mm256_loadu_si256(y.qs.as_ptr().cast());
        acc = _mm256_fmadd_ps(d0d1, mul_sum_us8_pairs_float(qx, qy), acc);
    }
    hsum_float_8(acc) + _mm_cvtss_f32(acc_m)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn vec_dot_q5_0_q8_0_impl(x: &[BlockQ5_0], y: &[BlockQ8_0]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for (x, y) in x.iter().zip(y) {
        let d = _mm256_mul_ps(fp16x8(x.d), fp16x8(y.d));
        let qx = bytes_from_nibbles_32(x.qs.as_ptr());
        // Elements without their fifth bit get 0xF0 ORed in, i.e. become
        // (q | 16) - 16 as i8 directly.
        let bxhi = bytes_from_bits_32(x.qh.as_ptr());
        let bxhi = _mm256_andnot_si256(bxhi, _mm256_set1_epi8(0xF0u8 as i8));
        let qx = _mm256_or_si256(qx, bxhi);
        let qy = _mm256_loadu_si256(y.qs.as_ptr().cast());
        acc = _mm256_fmadd_ps(d, mul_sum_i8_pairs_float(qx, qy), acc);
    }
    hsum_float_8(acc)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn vec_dot_q8_0_q8_0_impl(x: &[BlockQ8_0], y: &[BlockQ8_0]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for (x, y) in x.iter().zip(y) {
        let d = _mm256_mul_ps(fp16x8(x.d), fp16x8(y.d));
        let qx = _mm256_loadu_si256(x.qs.as_ptr().cast());
        let qy = _mm256_loadu_si256(y.qs.as_ptr().cast());
        acc = _mm256_fmadd_ps(d, mul_sum_i8_pairs_float(qx, qy), acc);
    }
    hsum_float_8(acc)
}

// ---- F16 against F16 ----

/// Eight f16 at `p` (unaligned) as f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load_f16x8(p: *const u8) -> __m256 {
    _mm256_cvtph_ps(_mm_loadu_si128(p.cast()))
}

/// Four independent accumulators of eight, as ggml's F16 dot on AVX2, so the
/// FMA latency is hidden.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn vec_dot_f16_f16_impl(k: usize, w: *const u8, a: *const u8) -> f32 {
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= k {
        for (j, acc) in acc.iter_mut().enumerate() {
            let off = 2 * (i + 8 * j);
            *acc = _mm256_fmadd_ps(load_f16x8(w.add(off)), load_f16x8(a.add(off)), *acc);
        }
        i += 32;
    }
    while i + 8 <= k {
        acc[0] = _mm256_fmadd_ps(load_f16x8(w.add(2 * i)), load_f16x8(a.add(2 * i)), acc[0]);
        i += 8;
    }
    let sum = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    let mut sumf = hsum_float_8(sum);
    while i < k {
        let wv = f16::from_bits(w.add(2 * i).cast::<u16>().read_unaligned());
        let av = f16::from_bits(a.add(2 * i).cast::<u16>().read_unaligned());
        sumf += fp16(wv) * fp16(av);
        i += 1;
    }
    sumf
}

// ---- K-quants against Q8_K ----

/// Q4_K against Q8_K for `N` columns at once (the single-column kernel is
/// `N = 1`): the scale and min decoding of each weight block is shared, and
/// every column's arithmetic runs in the same order whatever `N` is, so a
/// column's result does not depend on its neighbours.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn vec_dot_q4_K_q8_K_cols_impl<const N: usize>(x: &[BlockQ4K], y: &[&[BlockQ8K]; MAX_DOT_COLS], out: &mut [f32]) {
    let m4 = _mm256_set1_epi8(0xF);
    let mut acc = [_mm256_setzero_ps(); N];
    let mut acc_m = [_mm_setzero_ps(); N];
    for (b, xb) in x.iter().enumerate() {
        let (scales, mins) = k4_scales_mins(&xb.scales);
        let mins16 = _mm_cvtepu8_epi16(_mm_loadl_epi64(mins.as_ptr().cast()));
        let (xd, xdmin) = (fp16x8(xb.d), fp16x8(xb.dmin));
        let q4 = xb.qs.as_ptr();
        for j in 0..N {
            let yb = &y[j][b];
            let yd = _mm256_set1_ps(yb.d);
            let d = _mm256_mul_ps(yd, xd);
            let dmin = _mm256_castps256_ps128(_mm256_mul_ps(yd, xdmin));
            let q8sums = _mm256_loadu_si256(std::ptr::addr_of!(yb.bsums).cast());
            let q8s = _mm_hadd_epi16(_mm256_castsi256_si128(q8sums), _mm256_extracti128_si256::<1>(q8sums));
            let prod = _mm_madd_epi16(mins16, q8s);
            acc_m[j] = _mm_fnmadd_ps(dmin, _mm_cvtepi32_ps(prod), acc_m[j]);
            let q8 = yb.qs.as_ptr();
            let mut sumi = _mm256_setzero_si256();
            for i in 0..4 {
                let scale_l = _mm256_set1_epi16(scales[2 * i] as i16);
                let scale_h = _mm256_set1_epi16(scales[2 * i + 1] as i16);
                let q4bits = _mm256_loadu_si256(q4.add(32 * i).cast());
                let q4l = _mm256_and_si256(q4bits, m4);
                let q4h = _mm256_and_si256(_mm256_srli_epi16::<4>(q4bits), m4);
                let q8l = _mm256_loadu_si256(q8.add(64 * i).cast());
                let p16l = _mm256_madd_epi16(scale_l, _mm256_maddubs_epi16(q4l, q8l));
                let q8h = _mm256_loadu_si256(q8.add(64 * i + 32).cast());
                let p16h = _mm256_madd_epi16(scale_h, _mm256_maddubs_epi16(q4h, q8h));
                sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p16l, p16h));
            }
            acc[j] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc[j]);
        }
    }
    for j in 0..N {
        out[j] = hsum_float_8(acc[j]) + hsum_float_4(acc_m[j]);
    }
}

/// Q6_K against Q8_K for `N` columns at once (the single-column kernel is
/// `N = 1`): each weight block's six-bit quants and scales are unpacked once
/// for all the columns, and every column's arithmetic runs in the same order
/// whatever `N` is. The quants are used unsigned (0..64) so `maddubs`
/// applies; the -32 bias comes back as `32 Σ scale * bsum`, from the
/// activation block's sums.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn vec_dot_q6_K_q8_K_cols_impl<const N: usize>(x: &[BlockQ6K], y: &[&[BlockQ8K]; MAX_DOT_COLS], out: &mut [f32]) {
    let m3 = _mm256_set1_epi8(3);
    let m15 = _mm256_set1_epi8(15);
    let mut acc = [_mm256_setzero_ps(); N];
    for (b, xb) in x.iter().enumerate() {
        let xd = fp16x8(xb.d);
        let scales16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(xb.scales.as_ptr().cast()));
        // The block's 256 quants as eight vectors of 32, with the scales of
        // their two halves: chunk 4j + i holds elements 128j + 32i...
        let mut q = [_mm256_setzero_si256(); 8];
        let mut sc = [_mm256_setzero_si256(); 8];
        let (ql, qh) = (xb.ql.as_ptr(), xb.qh.as_ptr());
        for j in 0..2 {
            let q4bits1 = _mm256_loadu_si256(ql.add(64 * j).cast());
            let q4bits2 = _mm256_loadu_si256(ql.add(64 * j + 32).cast());
            let q4bits_h = _mm256_loadu_si256(qh.add(32 * j).cast());

            let q4h_0 = _mm256_slli_epi16::<4>(_mm256_and_si256(q4bits_h, m3));
            let q4h_1 = _mm256_slli_epi16::<2>(_mm256_and_si256(q4bits_h, _mm256_set1_epi8(12)));
            let q4h_2 = _mm256_and_si256(q4bits_h, _mm256_set1_epi8(48));
            let q4h_3 = _mm256_srli_epi16::<2>(_mm256_and_si256(q4bits_h, _mm256_set1_epi8(-64)));

            q[4 * j] = _mm256_or_si256(_mm256_and_si256(q4bits1, m15), q4h_0);
            q[4 * j + 1] = _mm256_or_si256(_mm256_and_si256(q4bits2, m15), q4h_1);
            q[4 * j + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(q4bits1), m15), q4h_2);
            q[4 * j + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(q4bits2), m15), q4h_3);
            for i in 0..4 {
                // Elements 0..16 of this chunk use scale 8j + 2i, 16..32 the next.
                let s = 8 * j + 2 * i;
                sc[4 * j + i] =
                    _mm256_set_m128i(_mm_set1_epi16(xb.scales[s + 1] as i16), _mm_set1_epi16(xb.scales[s] as i16));
            }
        }
        for c in 0..N {
            let yb = &y[c][b];
            let d = _mm256_mul_ps(_mm256_set1_ps(yb.d), xd);
            let q8sums = _mm256_loadu_si256(std::ptr::addr_of!(yb.bsums).cast());
            let q8sclsub = _mm256_slli_epi32::<5>(_mm256_madd_epi16(q8sums, scales16));
            let q8 = yb.qs.as_ptr();
            let mut sumi = _mm256_setzero_si256();
            for t in 0..8 {
                let q8v = _mm256_loadu_si256(q8.add(32 * t).cast());
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(sc[t], _mm256_maddubs_epi16(q[t], q8v)));
            }
            let sumi = _mm256_sub_epi32(sumi, q8sclsub);
            acc[c] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc[c]);
        }
    }
    for c in 0..N {
        out[c] = hsum_float_8(acc[c]);
    }
}
