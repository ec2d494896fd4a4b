//! AVX2 tile kernels over row groups (see `crate::packed`): each weight block
//! of a group is unpacked once and met by every column of the tile, and the
//! group's eight dot products are built in the eight lanes of one register.
//!
//! Per four elements and column: one broadcast load of the activation bytes
//! and one `maddubs` against all eight rows. 4- and 5-bit blocks keep the
//! 16-bit sums (which cannot overflow: 8 x 2 x 15 x 127 and 4 x 2 x 31 x 127
//! are below 32,768) and widen them once per block (4-bit) or per half-block
//! (5-bit); 8-bit blocks widen each `maddubs` since two would overflow. Then
//! one conversion and one FMA per block and column scale all eight rows.

use std::arch::x86_64::*;

use super::avx2::available;
use crate::kernels::tile::{check_tile, TileFn};
use crate::packed::{PackedFormat, GROUP};

pub(crate) fn tile_fn(fmt: PackedFormat) -> Option<TileFn> {
    if !available() {
        return None;
    }
    Some(match fmt {
        PackedFormat::Q4_1 => q4_1,
        PackedFormat::Q5_0 => q5_0,
        PackedFormat::Q8_0 => q8_0,
    })
}

macro_rules! dispatch {
    ($name:ident, $impl:ident, $fmt:expr) => {
        #[allow(clippy::too_many_arguments)]
        fn $name(k: usize, w: &[u8], rows: usize, acts: &[u8], act_stride: usize, n: usize, out: &mut [f32], out_stride: usize) {
            let gb = check_tile($fmt, k, w, rows, acts, act_stride, n, out, out_stride);
            let (w, a, o) = (w.as_ptr(), acts.as_ptr(), out.as_mut_ptr());
            // SAFETY: handed out only by `tile_fn` after `available()`; the
            // slices were checked to cover everything the kernel reads/writes.
            unsafe {
                for g in 0..rows.div_ceil(GROUP) {
                    let (w, o, lanes) = (w.add(g * gb), o.add(g * GROUP), (rows - g * GROUP).min(GROUP));
                    match n {
                        1 => store(&$impl::<1>(k / 32, w, a, act_stride), o, out_stride, lanes),
                        2 => store(&$impl::<2>(k / 32, w, a, act_stride), o, out_stride, lanes),
                        3 => store(&$impl::<3>(k / 32, w, a, act_stride), o, out_stride, lanes),
                        _ => store(&$impl::<4>(k / 32, w, a, act_stride), o, out_stride, lanes),
                    }
                }
            }
        }
    };
}

dispatch!(q4_1, q4_1_impl, PackedFormat::Q4_1);
dispatch!(q5_0, q5_0_impl, PackedFormat::Q5_0);
dispatch!(q8_0, q8_0_impl, PackedFormat::Q8_0);

/// Column `j`'s eight row results to `out[j * stride..]`, the first `lanes`.
#[inline(always)]
unsafe fn store<const N: usize>(res: &[__m256; N], out: *mut f32, stride: usize, lanes: usize) {
    for (j, &v) in res.iter().enumerate() {
        if lanes == GROUP {
            _mm256_storeu_ps(out.add(j * stride), v);
        } else {
            let mut tmp = [0.0f32; GROUP];
            _mm256_storeu_ps(tmp.as_mut_ptr(), v);
            std::ptr::copy_nonoverlapping(tmp.as_ptr(), out.add(j * stride), lanes);
        }
    }
}

/// An activation column of `nb` blocks: scales, Q8_1 sums, exact sums, quants.
#[inline(always)]
unsafe fn col(nb: usize, a: *const u8, stride: usize, j: usize) -> (*const f32, *const f32, *const f32, *const u8) {
    let base = a.add(j * stride);
    let d = base.cast::<f32>();
    (d, d.add(nb), d.add(2 * nb), base.add(12 * nb))
}

/// Four activation bytes in every 32-bit lane.
#[inline(always)]
unsafe fn bcast4(p: *const u8) -> __m256i {
    _mm256_set1_epi32(p.cast::<i32>().read_unaligned())
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_1_impl<const N: usize>(nb: usize, g: *const u8, a: *const u8, stride: usize) -> [__m256; N] {
    let bb = PackedFormat::Q4_1.block_bytes();
    let (m4, ones) = (_mm256_set1_epi8(0xF), _mm256_set1_epi16(1));
    let mut acc = [_mm256_setzero_ps(); N];
    let mut acc_min = [_mm256_setzero_ps(); N];
    for b in 0..nb {
        let blk = g.add(b * bb);
        let mut s16 = [_mm256_setzero_si256(); N];
        for p in 0..4 {
            let v = _mm256_loadu_si256(blk.add(32 + 32 * p).cast());
            let (xl, xh) = (_mm256_and_si256(v, m4), _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4));
            for (j, s) in s16.iter_mut().enumerate() {
                let y = col(nb, a, stride, j).3.add(32 * b + 4 * p);
                let pl = _mm256_maddubs_epi16(xl, bcast4(y));
                let ph = _mm256_maddubs_epi16(xh, bcast4(y.add(16)));
                *s = _mm256_add_epi16(*s, _mm256_add_epi16(pl, ph));
            }
        }
        let dx = _mm256_cvtph_ps(_mm_loadu_si128(blk.cast()));
        let mx = _mm256_cvtph_ps(_mm_loadu_si128(blk.add(16).cast()));
        for j in 0..N {
            let (d, s, _, _) = col(nb, a, stride, j);
            let isum = _mm256_cvtepi32_ps(_mm256_madd_epi16(s16[j], ones));
            acc[j] = _mm256_fmadd_ps(_mm256_mul_ps(dx, _mm256_set1_ps(*d.add(b))), isum, acc[j]);
            acc_min[j] = _mm256_fmadd_ps(mx, _mm256_set1_ps(*s.add(b)), acc_min[j]);
        }
    }
    let mut res = [_mm256_setzero_ps(); N];
    for j in 0..N {
        res[j] = _mm256_add_ps(acc[j], acc_min[j]);
    }
    res
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_0_impl<const N: usize>(nb: usize, g: *const u8, a: *const u8, stride: usize) -> [__m256; N] {
    let bb = PackedFormat::Q5_0.block_bytes();
    let (m4, bit4, ones) = (_mm256_set1_epi8(0xF), _mm256_set1_epi8(0x10), _mm256_set1_epi16(1));
    let mut acc = [_mm256_setzero_ps(); N];
    for b in 0..nb {
        let blk = g.add(b * bb);
        // Bit g of each byte is the fifth bit of register g's element: moved
        // to bit 4 by a shift within the byte (a 16-bit shift of at most 4
        // brings nothing from the neighbouring byte into bit 4).
        let h = _mm256_loadu_si256(blk.add(16).cast());
        let hl = [_mm256_slli_epi16::<4>(h), _mm256_slli_epi16::<3>(h), _mm256_slli_epi16::<2>(h), _mm256_slli_epi16::<1>(h)];
        let hh = [h, _mm256_srli_epi16::<1>(h), _mm256_srli_epi16::<2>(h), _mm256_srli_epi16::<3>(h)];
        let mut lo16 = [_mm256_setzero_si256(); N];
        let mut hi16 = [_mm256_setzero_si256(); N];
        for p in 0..4 {
            let v = _mm256_loadu_si256(blk.add(48 + 32 * p).cast());
            let xl = _mm256_or_si256(_mm256_and_si256(v, m4), _mm256_and_si256(hl[p], bit4));
            let xh = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(v), m4), _mm256_and_si256(hh[p], bit4));
            for j in 0..N {
                let y = col(nb, a, stride, j).3.add(32 * b + 4 * p);
                lo16[j] = _mm256_add_epi16(lo16[j], _mm256_maddubs_epi16(xl, bcast4(y)));
                hi16[j] = _mm256_add_epi16(hi16[j], _mm256_maddubs_epi16(xh, bcast4(y.add(16))));
            }
        }
        let dx = _mm256_cvtph_ps(_mm_loadu_si128(blk.cast()));
        for j in 0..N {
            let (d, _, dsum, _) = col(nb, a, stride, j);
            let isum = _mm256_add_epi32(_mm256_madd_epi16(lo16[j], ones), _mm256_madd_epi16(hi16[j], ones));
            // The quants were stored offset by 16: take 16 d_y Σq_y back.
            let t = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(*d.add(b)), _mm256_set1_ps(-16.0 * *dsum.add(b)));
            acc[j] = _mm256_fmadd_ps(dx, t, acc[j]);
        }
    }
    acc
}

/// Signed by signed through `maddubs`: |x| once per register, x's sign moved
/// onto each column's y (exact: no quant is -128).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_0_impl<const N: usize>(nb: usize, g: *const u8, a: *const u8, stride: usize) -> [__m256; N] {
    let bb = PackedFormat::Q8_0.block_bytes();
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); N];
    for b in 0..nb {
        let blk = g.add(b * bb);
        let mut s32 = [_mm256_setzero_si256(); N];
        for r in 0..8 {
            let x = _mm256_loadu_si256(blk.add(16 + 32 * r).cast());
            let ax = _mm256_sign_epi8(x, x);
            for (j, s) in s32.iter_mut().enumerate() {
                let y = bcast4(col(nb, a, stride, j).3.add(32 * b + 4 * r));
                *s = _mm256_add_epi32(*s, _mm256_madd_epi16(_mm256_maddubs_epi16(ax, _mm256_sign_epi8(y, x)), ones));
            }
        }
        let dx = _mm256_cvtph_ps(_mm_loadu_si128(blk.cast()));
        for j in 0..N {
            let d = col(nb, a, stride, j).0;
            acc[j] = _mm256_fmadd_ps(_mm256_mul_ps(dx, _mm256_set1_ps(*d.add(b))), _mm256_cvtepi32_ps(s32[j]), acc[j]);
        }
    }
    acc
}
