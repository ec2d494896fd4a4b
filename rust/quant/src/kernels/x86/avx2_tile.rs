//! AVX2 tile kernels over repacked rows (see `crate::packed`): each weight
//! block is unpacked once and met by every column of the tile.
//!
//! Per block and column the work is one `maddubs` (unsigned weights, signed
//! activations), one `madd` to i32, a conversion and an FMA with the block's
//! scale product; the scale products of eight blocks are computed in one
//! vector multiply. Each column keeps two accumulators, one per block of a
//! pair, so a single column (decode) is not bound by FMA latency.

use std::arch::x86_64::*;
use std::mem::MaybeUninit;

use super::avx2::{available, bytes_from_bits_32, hsum_float_8};
use crate::kernels::tile::{check_tile, TileFn};
use crate::packed::{PackedFormat, RowLayout};

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
            let rb = check_tile($fmt, k, w, rows, acts, act_stride, n, out, out_stride);
            let (w, a, o) = (w.as_ptr(), acts.as_ptr(), out.as_mut_ptr());
            // SAFETY: handed out only by `tile_fn` after `available()`; the
            // slices were checked to cover everything the kernel reads/writes.
            unsafe {
                for r in 0..rows {
                    let (w, o) = (w.add(r * rb), o.add(r));
                    match n {
                        1 => $impl::<1>(k, w, a, act_stride, o, out_stride),
                        2 => $impl::<2>(k, w, a, act_stride, o, out_stride),
                        3 => $impl::<3>(k, w, a, act_stride, o, out_stride),
                        _ => $impl::<4>(k, w, a, act_stride, o, out_stride),
                    }
                }
            }
        }
    };
}

dispatch!(q4_1, q4_1_impl, PackedFormat::Q4_1);
dispatch!(q5_0, q5_0_impl, PackedFormat::Q5_0);
dispatch!(q8_0, q8_0_impl, PackedFormat::Q8_0);

/// An activation column's arrays: scales, Q8_1 sums, exact sums, quants.
#[inline(always)]
unsafe fn col(l: &RowLayout, a: *const u8, stride: usize, j: usize) -> (*const f32, *const f32, *const f32, *const u8) {
    let base = a.add(j * stride);
    let d = base.cast::<f32>();
    (d, d.add(l.nbp), d.add(2 * l.nbp), base.add(12 * l.nbp))
}

/// Sum of the 32 unsigned-by-signed byte products of `x` and `y`, as 8 i32
/// lanes converted to f32. The i16 pair sums cannot saturate: x <= 127 and
/// |y| <= 127 keep them within 32,258.
#[inline(always)]
unsafe fn dot_us8(x: __m256i, y: __m256i) -> __m256 {
    _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(x, y), _mm256_set1_epi16(1)))
}

/// Blocks whose scale products are computed in one pass before the quants
/// are read: the products then sit in a real buffer that the block loop
/// broadcasts from (a load-port operation), instead of in registers the
/// compiler would have to shuffle. A multiple of 8.
const SEG: usize = 64;

/// Accumulator of a column for block `b`: two per column, by block parity,
/// whatever the tile width. One column (decode) needs two to hide the FMA
/// latency, and keeping the same two at every width makes a column's result
/// independent of how many neighbours share its tile: a token gets the same
/// logits decoded alone, in a prompt, or beside other conversations.
#[inline(always)]
fn slot(b: usize) -> usize {
    b & 1
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_1_impl<const N: usize>(k: usize, w: *const u8, a: *const u8, stride: usize, out: *mut f32, out_stride: usize) {
    let l = RowLayout::new(k);
    let (dx_p, mx_p, qs) = (w.cast::<u16>(), w.cast::<u16>().add(l.nbp), w.add(4 * l.nbp));
    let m4 = _mm256_set1_epi8(0xF);
    let mut acc = [[_mm256_setzero_ps(); 2]; N];
    // Every entry read is written first in its segment; zeroing the 1 KiB
    // each call showed up as a memset worth several percent of a decode.
    let mut sc = [[MaybeUninit::<f32>::uninit(); SEG]; N];
    let mut seg = 0;
    while seg < l.nbe {
        let end = (seg + SEG).min(l.nbe);
        let mut g = seg;
        while g < end {
            let dx = _mm256_cvtph_ps(_mm_loadu_si128(dx_p.add(g).cast()));
            let mx = _mm256_cvtph_ps(_mm_loadu_si128(mx_p.add(g).cast()));
            for j in 0..N {
                let (d, s, _, _) = col(&l, a, stride, j);
                _mm256_storeu_ps(sc[j].as_mut_ptr().cast::<f32>().add(g - seg), _mm256_mul_ps(dx, _mm256_loadu_ps(d.add(g))));
                let s1 = slot(1);
                acc[j][s1] = _mm256_fmadd_ps(mx, _mm256_loadu_ps(s.add(g)), acc[j][s1]);
            }
            g += 8;
        }
        let mut b = seg;
        while b < end {
            let v = _mm256_loadu_si256(qs.add(16 * b).cast());
            let xa = _mm256_and_si256(v, m4);
            let xb = _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4);
            for j in 0..N {
                let y = col(&l, a, stride, j).3.add(32 * b);
                let sp = sc[j].as_ptr().cast::<f32>().add(b - seg);
                let pa = dot_us8(xa, _mm256_loadu_si256(y.cast()));
                acc[j][0] = _mm256_fmadd_ps(pa, _mm256_broadcast_ss(&*sp), acc[j][0]);
                let pb = dot_us8(xb, _mm256_loadu_si256(y.add(32).cast()));
                let s1 = slot(1);
                acc[j][s1] = _mm256_fmadd_ps(pb, _mm256_broadcast_ss(&*sp.add(1)), acc[j][s1]);
            }
            b += 2;
        }
        seg = end;
    }
    for (j, acc) in acc.iter().enumerate() {
        *out.add(j * out_stride) = hsum_float_8(_mm256_add_ps(acc[0], acc[1]));
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_0_impl<const N: usize>(k: usize, w: *const u8, a: *const u8, stride: usize, out: *mut f32, out_stride: usize) {
    let l = RowLayout::new(k);
    let (dx_p, qh, qs) = (w.cast::<u16>(), w.add(2 * l.nbp), w.add(2 * l.nbp + 4 * l.nbe));
    let m4 = _mm256_set1_epi8(0xF);
    let bit4 = _mm256_set1_epi8(0x10);
    let sixteen = _mm256_set1_ps(16.0);
    let mut acc = [[_mm256_setzero_ps(); 2]; N];
    // Every entry read is written first in its segment; zeroing the 1 KiB
    // each call showed up as a memset worth several percent of a decode.
    let mut sc = [[MaybeUninit::<f32>::uninit(); SEG]; N];
    let mut seg = 0;
    while seg < l.nbe {
        let end = (seg + SEG).min(l.nbe);
        let mut g = seg;
        while g < end {
            let dx = _mm256_cvtph_ps(_mm_loadu_si128(dx_p.add(g).cast()));
            let dx16 = _mm256_mul_ps(dx, sixteen);
            for j in 0..N {
                let (d, _, dsum, _) = col(&l, a, stride, j);
                _mm256_storeu_ps(sc[j].as_mut_ptr().cast::<f32>().add(g - seg), _mm256_mul_ps(dx, _mm256_loadu_ps(d.add(g))));
                // The quants were stored offset by 16: take 16 d_x d_y Σq_y back.
                let s1 = slot(1);
                acc[j][s1] = _mm256_fnmadd_ps(dx16, _mm256_loadu_ps(dsum.add(g)), acc[j][s1]);
            }
            g += 8;
        }
        let mut b = seg;
        while b < end {
            let v = _mm256_loadu_si256(qs.add(16 * b).cast());
            let ha = _mm256_and_si256(bytes_from_bits_32(qh.add(4 * b)), bit4);
            let hb = _mm256_and_si256(bytes_from_bits_32(qh.add(4 * b + 4)), bit4);
            let xa = _mm256_or_si256(_mm256_and_si256(v, m4), ha);
            let xb = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(v), m4), hb);
            for j in 0..N {
                let y = col(&l, a, stride, j).3.add(32 * b);
                let sp = sc[j].as_ptr().cast::<f32>().add(b - seg);
                let pa = dot_us8(xa, _mm256_loadu_si256(y.cast()));
                acc[j][0] = _mm256_fmadd_ps(pa, _mm256_broadcast_ss(&*sp), acc[j][0]);
                let pb = dot_us8(xb, _mm256_loadu_si256(y.add(32).cast()));
                let s1 = slot(1);
                acc[j][s1] = _mm256_fmadd_ps(pb, _mm256_broadcast_ss(&*sp.add(1)), acc[j][s1]);
            }
            b += 2;
        }
        seg = end;
    }
    for (j, acc) in acc.iter().enumerate() {
        *out.add(j * out_stride) = hsum_float_8(_mm256_add_ps(acc[0], acc[1]));
    }
}

/// Signed by signed through `maddubs`: |x| once per block, x's sign moved onto
/// each column's y (exact: no quant is -128).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_0_impl<const N: usize>(k: usize, w: *const u8, a: *const u8, stride: usize, out: *mut f32, out_stride: usize) {
    let l = RowLayout::new(k);
    let (dx_p, qs) = (w.cast::<u16>(), w.add(2 * l.nbp));
    let mut acc = [[_mm256_setzero_ps(); 2]; N];
    // Every entry read is written first in its segment; zeroing the 1 KiB
    // each call showed up as a memset worth several percent of a decode.
    let mut sc = [[MaybeUninit::<f32>::uninit(); SEG]; N];
    let mut seg = 0;
    while seg < l.nbe {
        let end = (seg + SEG).min(l.nbe);
        let mut g = seg;
        while g < end {
            let dx = _mm256_cvtph_ps(_mm_loadu_si128(dx_p.add(g).cast()));
            for j in 0..N {
                let d = col(&l, a, stride, j).0;
                _mm256_storeu_ps(sc[j].as_mut_ptr().cast::<f32>().add(g - seg), _mm256_mul_ps(dx, _mm256_loadu_ps(d.add(g))));
            }
            g += 8;
        }
        let mut b = seg;
        while b < end {
            let xa = _mm256_loadu_si256(qs.add(32 * b).cast());
            let xb = _mm256_loadu_si256(qs.add(32 * b + 32).cast());
            let (axa, axb) = (_mm256_sign_epi8(xa, xa), _mm256_sign_epi8(xb, xb));
            for j in 0..N {
                let y = col(&l, a, stride, j).3.add(32 * b);
                let sp = sc[j].as_ptr().cast::<f32>().add(b - seg);
                let pa = dot_us8(axa, _mm256_sign_epi8(_mm256_loadu_si256(y.cast()), xa));
                acc[j][0] = _mm256_fmadd_ps(pa, _mm256_broadcast_ss(&*sp), acc[j][0]);
                let pb = dot_us8(axb, _mm256_sign_epi8(_mm256_loadu_si256(y.add(32).cast()), xb));
                let s1 = slot(1);
                acc[j][s1] = _mm256_fmadd_ps(pb, _mm256_broadcast_ss(&*sp.add(1)), acc[j][s1]);
            }
            b += 2;
        }
        seg = end;
    }
    for (j, acc) in acc.iter().enumerate() {
        *out.add(j * out_stride) = hsum_float_8(_mm256_add_ps(acc[0], acc[1]));
    }
}
