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
//!
//! Every kernel also runs over the unpacked layout (`X = true`, see
//! `crate::packed`): the same arithmetic with each register of quants loaded
//! as bytes instead of built from nibbles and high bits, for passes of many
//! columns that unpack a tile once and meet it with every column group.

use std::arch::x86_64::*;

use super::avx2::available;
use crate::kernels::tile::{check_tile, TileFn, UnpackedTile};
use crate::packed::{PackedFormat, GROUP, Q4_K_QUANTS, Q6_K_QUANTS};

pub(crate) fn tile_fn(fmt: PackedFormat) -> Option<TileFn> {
    if !available() {
        return None;
    }
    Some(match fmt {
        PackedFormat::Q4_0 => q4_0,
        PackedFormat::Q4_1 => q4_1,
        PackedFormat::Q5_0 => q5_0,
        PackedFormat::Q8_0 => q8_0,
        PackedFormat::Q4_K => q4_k,
        PackedFormat::Q6_K => q6_k,
    })
}

/// The unpacking and the tile kernel over unpacked groups, for the formats
/// whose quants are not bytes already.
pub(crate) fn unpacked_tile(fmt: PackedFormat) -> Option<UnpackedTile> {
    if !available() {
        return None;
    }
    Some(match fmt {
        PackedFormat::Q4_0 => UnpackedTile { unpack: unpack_q4_0, tile: q4_0_x },
        PackedFormat::Q4_1 => UnpackedTile { unpack: unpack_q4_1, tile: q4_1_x },
        PackedFormat::Q5_0 => UnpackedTile { unpack: unpack_q5_0, tile: q5_0_x },
        PackedFormat::Q4_K => UnpackedTile { unpack: unpack_q4_k, tile: q4_k_x },
        PackedFormat::Q6_K => UnpackedTile { unpack: unpack_q6_k, tile: q6_k_x },
        PackedFormat::Q8_0 => return None,
    })
}

macro_rules! dispatch {
    ($name:ident, $impl:ident, $fmt:expr, $x:expr) => {
        #[allow(clippy::too_many_arguments)]
        fn $name(
            k: usize,
            w: &[u8],
            rows: usize,
            acts: &[u8],
            act_stride: usize,
            n: usize,
            out: &mut [f32],
            out_stride: usize,
        ) {
            let gb = check_tile($fmt, $x, k, w, rows, acts, act_stride, n, out, out_stride);
            let (w, a, o) = (w.as_ptr(), acts.as_ptr(), out.as_mut_ptr());
            // SAFETY: handed out only by `tile_fn` and `unpacked_tile` after
            // `available()`; the slices were checked to cover everything the
            // kernel reads/writes.
            unsafe {
                for g in 0..rows.div_ceil(GROUP) {
                    let (w, o, lanes) = (w.add(g * gb), o.add(g * GROUP), (rows - g * GROUP).min(GROUP));
                    match n {
                        1 => store(&$impl::<1, $x>(k / 32, w, a, act_stride), o, out_stride, lanes),
                        2 => store(&$impl::<2, $x>(k / 32, w, a, act_stride), o, out_stride, lanes),
                        3 => store(&$impl::<3, $x>(k / 32, w, a, act_stride), o, out_stride, lanes),
                        _ => store(&$impl::<4, $x>(k / 32, w, a, act_stride), o, out_stride, lanes),
                    }
                }
            }
        }
    };
}

dispatch!(q4_0, q4_0_impl, PackedFormat::Q4_0, false);
dispatch!(q4_1, q4_1_impl, PackedFormat::Q4_1, false);
dispatch!(q5_0, q5_0_impl, PackedFormat::Q5_0, false);
dispatch!(q8_0, q8_0_impl, PackedFormat::Q8_0, false);
dispatch!(q4_k, q4_k_impl, PackedFormat::Q4_K, false);
dispatch!(q6_k, q6_k_impl, PackedFormat::Q6_K, false);
dispatch!(q4_0_x, q4_0_impl, PackedFormat::Q4_0, true);
dispatch!(q4_1_x, q4_1_impl, PackedFormat::Q4_1, true);
dispatch!(q5_0_x, q5_0_impl, PackedFormat::Q5_0, true);
dispatch!(q4_k_x, q4_k_impl, PackedFormat::Q4_K, true);
dispatch!(q6_k_x, q6_k_impl, PackedFormat::Q6_K, true);

macro_rules! unpacker {
    ($name:ident, $impl:ident, $fmt:expr) => {
        fn $name(k: usize, w: &[u8], groups: usize, dst: &mut [u8]) {
            let (gb, xb) = (
                $fmt.group_bytes(k).expect("k is a whole number of blocks"),
                $fmt.unpacked_group_bytes(k).expect("an unpacked layout"),
            );
            assert!(w.len() >= groups * gb && dst.len() >= groups * xb, "unpacking {groups} groups");
            let blocks = groups * (k / $fmt.block_elems());
            // SAFETY: handed out only by `unpacked_tile` after `available()`;
            // both slices were checked to hold `groups` groups.
            unsafe { $impl(blocks, w.as_ptr(), dst.as_mut_ptr()) }
        }
    };
}

unpacker!(unpack_q4_0, unpack_q4_0_impl, PackedFormat::Q4_0);
unpacker!(unpack_q4_1, unpack_q4_1_impl, PackedFormat::Q4_1);
unpacker!(unpack_q5_0, unpack_q5_0_impl, PackedFormat::Q5_0);
unpacker!(unpack_q4_k, unpack_q4_k_impl, PackedFormat::Q4_K);
unpacker!(unpack_q6_k, unpack_q6_k_impl, PackedFormat::Q6_K);

/// Column `j`'s eight row results to `out[j * stride..]`, the first `lanes`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
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

/// An activation column of `nb` blocks: scales, Q8_1 sums, exact sums,
/// half-block sums, quants (see `crate::packed::act_row_bytes`).
#[derive(Clone, Copy)]
struct Col {
    d: *const f32,
    s: *const f32,
    dsum: *const f32,
    hsum: *const u8,
    qs: *const u8,
}

#[inline(always)]
unsafe fn cols<const N: usize>(nb: usize, a: *const u8, stride: usize) -> [Col; N] {
    std::array::from_fn(|j| {
        let base = a.add(j * stride);
        let d = base.cast::<f32>();
        Col { d, s: d.add(nb), dsum: d.add(2 * nb), hsum: base.add(12 * nb), qs: base.add(16 * nb) }
    })
}

/// Bytes ahead of the block being read that a kernel over packed weights
/// asks the memory system for. A decoded token (or one token from each of a
/// few conversations) streams every weight once, and on its own a core here
/// barely overlaps its arithmetic with the wait for memory (one thread
/// decoded at about the rate that streaming and computing one after the
/// other would give); asking 1-2 KiB ahead, a dozen blocks, took SmolLM2's
/// generation from about 67 to 84 t/s on one thread and from 110 to 125 on
/// two (4 KiB ahead measured slower), and a pass of two decoded tokens from
/// 15.4 to 10.4 ms.
const PREFETCH_AHEAD: usize = 2048;

/// Asks for the `len` bytes at `p + PREFETCH_AHEAD`, a line at a time, when
/// reading packed weights (an unpacked tile is in cache already). Past the
/// end of the weights it asks for lines nobody reads, which costs little and
/// cannot fault.
#[inline(always)]
unsafe fn prefetch_ahead<const X: bool>(p: *const u8, len: usize) {
    if !X {
        let mut off = 0;
        while off < len {
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH_AHEAD + off).cast());
            off += 64;
        }
    }
}

/// Four activation bytes in every 32-bit lane.
#[inline(always)]
unsafe fn bcast4(p: *const u8) -> __m256i {
    _mm256_set1_epi32(p.cast::<i32>().read_unaligned())
}

/// Packed register `p` of 4-bit quants at `regs` as its two registers of
/// bytes (elements `4p..` and `16 + 4p..`), or those two read from an
/// unpacked block.
#[inline(always)]
unsafe fn q4_regs<const X: bool>(regs: *const u8, p: usize) -> (__m256i, __m256i) {
    if X {
        return (_mm256_loadu_si256(regs.add(64 * p).cast()), _mm256_loadu_si256(regs.add(64 * p + 32).cast()));
    }
    let m4 = _mm256_set1_epi8(0xF);
    let v = _mm256_loadu_si256(regs.add(32 * p).cast());
    (_mm256_and_si256(v, m4), _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4))
}

/// Unpacks `blocks` blocks of 4-bit registers: each block's `head` bytes
/// (scales) copied, then its `subs` sub-blocks of four packed registers as
/// eight registers of bytes.
#[inline(always)]
unsafe fn unpack_q4(blocks: usize, head: usize, subs: usize, src: *const u8, dst: *mut u8) {
    unpack_q4_padded(blocks, head, head, subs, src, dst)
}

/// [`unpack_q4`] with the unpacked head `out_head` bytes long (the scales
/// copied, the rest zero), so that the quants start aligned.
#[inline(always)]
unsafe fn unpack_q4_padded(blocks: usize, head: usize, out_head: usize, subs: usize, src: *const u8, dst: *mut u8) {
    let (bb, xb) = (head + subs * 128, out_head + subs * 256);
    for b in 0..blocks {
        let (s, d) = (src.add(b * bb), dst.add(b * xb));
        std::ptr::copy_nonoverlapping(s, d, head);
        std::ptr::write_bytes(d.add(head), 0, out_head - head);
        for j in 0..subs {
            for p in 0..4 {
                let (xl, xh) = q4_regs::<false>(s.add(head + 128 * j), p);
                _mm256_storeu_si256(d.add(out_head + 256 * j + 64 * p).cast(), xl);
                _mm256_storeu_si256(d.add(out_head + 256 * j + 64 * p + 32).cast(), xh);
            }
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn unpack_q4_0_impl(blocks: usize, src: *const u8, dst: *mut u8) {
    unpack_q4_padded(blocks, 16, 32, 1, src, dst)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn unpack_q4_1_impl(blocks: usize, src: *const u8, dst: *mut u8) {
    unpack_q4(blocks, 32, 1, src, dst)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn unpack_q4_k_impl(blocks: usize, src: *const u8, dst: *mut u8) {
    unpack_q4(blocks, Q4_K_QUANTS, 8, src, dst)
}

/// One 32-element block of 4-bit quants (four nibble-pair registers at
/// `regs`, or eight byte registers where `X`) for every column: `acc +=
/// (dx d_y) Σ q q_y`, then `acc += mx sums[b]` (one accumulator per column:
/// at four columns a second would not fit in the sixteen registers).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn q4_block<const N: usize, const X: bool>(
    regs: *const u8,
    dx: __m256,
    mx: __m256,
    b: usize,
    c: &[Col; N],
    sums: impl Fn(&Col) -> *const f32,
    acc: &mut [__m256; N],
) {
    let ones = _mm256_set1_epi16(1);
    let mut s16 = [_mm256_setzero_si256(); N];
    for p in 0..4 {
        let (xl, xh) = q4_regs::<X>(regs, p);
        for (s, c) in s16.iter_mut().zip(c) {
            let y = c.qs.add(32 * b + 4 * p);
            let pl = _mm256_maddubs_epi16(xl, bcast4(y));
            let ph = _mm256_maddubs_epi16(xh, bcast4(y.add(16)));
            *s = _mm256_add_epi16(*s, _mm256_add_epi16(pl, ph));
        }
    }
    for j in 0..N {
        let isum = _mm256_cvtepi32_ps(_mm256_madd_epi16(s16[j], ones));
        acc[j] = _mm256_fmadd_ps(_mm256_mul_ps(dx, _mm256_set1_ps(*c[j].d.add(b))), isum, acc[j]);
        acc[j] = _mm256_fmadd_ps(mx, _mm256_set1_ps(*sums(&c[j]).add(b)), acc[j]);
    }
}

/// Q4_0: as Q4_1, the min `-8 d` made from the scale (exact in f32) and met
/// by the activation block's exact sum.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_0_impl<const N: usize, const X: bool>(
    nb: usize,
    g: *const u8,
    a: *const u8,
    stride: usize,
) -> [__m256; N] {
    let min = |_: *const u8, dx: __m256| _mm256_mul_ps(dx, _mm256_set1_ps(-8.0));
    q4_scaled::<N, X>(PackedFormat::Q4_0, if X { 32 } else { 16 }, min, |c| c.dsum, nb, g, a, stride)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_1_impl<const N: usize, const X: bool>(
    nb: usize,
    g: *const u8,
    a: *const u8,
    stride: usize,
) -> [__m256; N] {
    let min = |blk: *const u8, _: __m256| _mm256_cvtph_ps(_mm_loadu_si128(blk.add(16).cast()));
    q4_scaled::<N, X>(PackedFormat::Q4_1, 32, min, |c| c.s, nb, g, a, stride)
}

/// A 32-element block format of scale, min and nibbles (quants at byte
/// `quants` of a block): the rows' min from the block (and the scale), met
/// by the activation sum `sums` names.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn q4_scaled<const N: usize, const X: bool>(
    fmt: PackedFormat,
    quants: usize,
    min: impl Fn(*const u8, __m256) -> __m256,
    sums: impl Fn(&Col) -> *const f32,
    nb: usize,
    g: *const u8,
    a: *const u8,
    stride: usize,
) -> [__m256; N] {
    let bb = block_bytes::<X>(fmt);
    let c = cols::<N>(nb, a, stride);
    let mut acc = [_mm256_setzero_ps(); N];
    for b in 0..nb {
        let blk = g.add(b * bb);
        prefetch_ahead::<X>(blk, bb);
        let dx = _mm256_cvtph_ps(_mm_loadu_si128(blk.cast()));
        q4_block::<N, X>(blk.add(quants), dx, min(blk, dx), b, &c, &sums, &mut acc);
    }
    acc
}

/// Q4_K as 32-element blocks: each sub-block's scale `d sc` and min
/// `dmin m` (exact in f32) built for the eight rows, the min met by the
/// activation block's exact sum.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_k_impl<const N: usize, const X: bool>(
    nb: usize,
    g: *const u8,
    a: *const u8,
    stride: usize,
) -> [__m256; N] {
    let bb = block_bytes::<X>(PackedFormat::Q4_K);
    let sub = if X { 256 } else { 128 };
    let c = cols::<N>(nb, a, stride);
    let mut acc = [_mm256_setzero_ps(); N];
    let bytes8 = |p: *const u8| _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(p.cast())));
    for sb in 0..nb / 8 {
        let blk = g.add(sb * bb);
        let d = _mm256_cvtph_ps(_mm_loadu_si128(blk.cast()));
        let neg_dmin = _mm256_sub_ps(_mm256_setzero_ps(), _mm256_cvtph_ps(_mm_loadu_si128(blk.add(16).cast())));
        for j in 0..8 {
            prefetch_ahead::<X>(blk.add(j * bb / 8), bb / 8);
            let dx = _mm256_mul_ps(d, bytes8(blk.add(32 + 8 * j)));
            let mx = _mm256_mul_ps(neg_dmin, bytes8(blk.add(96 + 8 * j)));
            q4_block::<N, X>(blk.add(Q4_K_QUANTS + sub * j), dx, mx, 8 * sb + j, &c, |c| c.dsum, &mut acc);
        }
    }
    acc
}

/// Q6_K: unsigned six-bit quants; two `maddubs` (at most 2 x 2 x 63 x 127 <
/// 32,768) per 16-bit sum, widened by `madd` against the sub-block's integer
/// scale, so a 32-element block's sum stays exact in 32 bits; the `- 32` of
/// every quant comes back as `32 Σ sc Σq_y` over the half-block sums.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6_k_impl<const N: usize, const X: bool>(
    nb: usize,
    g: *const u8,
    a: *const u8,
    stride: usize,
) -> [__m256; N] {
    let bb = block_bytes::<X>(PackedFormat::Q6_K);
    let c = cols::<N>(nb, a, stride);
    let mut acc = [_mm256_setzero_ps(); N];
    for sb in 0..nb / 8 {
        let blk = g.add(sb * bb);
        let d = _mm256_cvtph_ps(_mm_loadu_si128(blk.cast()));
        for j in 0..8 {
            prefetch_ahead::<X>(blk.add(j * bb / 8), bb / 8);
            let b = 8 * sb + j;
            let sub = blk.add(Q6_K_QUANTS + if X { 256 } else { 192 } * j);
            let sa = _mm_loadl_epi64(blk.add(16 + 8 * (2 * j)).cast());
            let sbb = _mm_loadl_epi64(blk.add(16 + 8 * (2 * j + 1)).cast());
            // Row r's scale in 16-bit lanes 2r and 2r+1: `madd` then scales
            // and widens in one step.
            let sc_a = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(sa, sa));
            let sc_b = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(sbb, sbb));
            let sc_ab = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(sa, sbb));
            let mut isum = [_mm256_setzero_si256(); N];
            for pp in [0, 2] {
                let [xl0, xl1, xh0, xh1] = q6_regs::<X>(sub, pp);
                for (s, c) in isum.iter_mut().zip(&c) {
                    let y = c.qs.add(32 * b + 4 * pp);
                    let ta = _mm256_add_epi16(
                        _mm256_maddubs_epi16(xl0, bcast4(y)),
                        _mm256_maddubs_epi16(xl1, bcast4(y.add(4))),
                    );
                    let tb = _mm256_add_epi16(
                        _mm256_maddubs_epi16(xh0, bcast4(y.add(16))),
                        _mm256_maddubs_epi16(xh1, bcast4(y.add(20))),
                    );
                    *s = _mm256_add_epi32(
                        *s,
                        _mm256_add_epi32(_mm256_madd_epi16(ta, sc_a), _mm256_madd_epi16(tb, sc_b)),
                    );
                }
            }
            for jj in 0..N {
                let off = _mm256_madd_epi16(sc_ab, bcast4(c[jj].hsum.add(4 * b)));
                let total = _mm256_sub_epi32(isum[jj], _mm256_slli_epi32::<5>(off));
                acc[jj] = _mm256_fmadd_ps(
                    _mm256_mul_ps(d, _mm256_set1_ps(*c[jj].d.add(b))),
                    _mm256_cvtepi32_ps(total),
                    acc[jj],
                );
            }
        }
    }
    acc
}

/// Sub-block registers `pp, pp + 1` of Q6_K quants at `sub` as four
/// registers of bytes (low elements `pp`, `pp + 1`, then high), or those
/// four read from an unpacked sub-block.
#[inline(always)]
unsafe fn q6_regs<const X: bool>(sub: *const u8, pp: usize) -> [__m256i; 4] {
    if X {
        return std::array::from_fn(|i| _mm256_loadu_si256(sub.add(64 * pp + 32 * i).cast()));
    }
    let (m4, m30) = (_mm256_set1_epi8(0xF), _mm256_set1_epi8(0x30));
    // Bits 2p, 2p+1 of each plane byte to bits 4, 5 (within the byte: a
    // 16-bit shift of at most 4 carries nothing across into bits 4 and 5).
    let high = |plane: __m256i, p: usize| {
        _mm256_and_si256(
            match p {
                0 => _mm256_slli_epi16::<4>(plane),
                1 => _mm256_slli_epi16::<2>(plane),
                2 => plane,
                _ => _mm256_srli_epi16::<2>(plane),
            },
            m30,
        )
    };
    let (plane_a, plane_b) = (_mm256_loadu_si256(sub.add(128).cast()), _mm256_loadu_si256(sub.add(160).cast()));
    let v0 = _mm256_loadu_si256(sub.add(32 * pp).cast());
    let v1 = _mm256_loadu_si256(sub.add(32 * pp + 32).cast());
    [
        _mm256_or_si256(_mm256_and_si256(v0, m4), high(plane_a, pp)),
        _mm256_or_si256(_mm256_and_si256(v1, m4), high(plane_a, pp + 1)),
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(v0), m4), high(plane_b, pp)),
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(v1), m4), high(plane_b, pp + 1)),
    ]
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn unpack_q6_k_impl(blocks: usize, src: *const u8, dst: *mut u8) {
    let (bb, xb) = (PackedFormat::Q6_K.block_bytes(), block_bytes::<true>(PackedFormat::Q6_K));
    for b in 0..blocks {
        let (s, d) = (src.add(b * bb), dst.add(b * xb));
        std::ptr::copy_nonoverlapping(s, d, Q6_K_QUANTS);
        for j in 0..8 {
            for pp in [0, 2] {
                for (i, x) in q6_regs::<false>(s.add(Q6_K_QUANTS + 192 * j), pp).into_iter().enumerate() {
                    _mm256_storeu_si256(d.add(Q6_K_QUANTS + 256 * j + 64 * pp + 32 * i).cast(), x);
                }
            }
        }
    }
}

/// Register `p` of a Q5_0 block (nibble pairs at `blk + 48`, fifth bits
/// `h`) as its two registers of bytes, or those two read from an unpacked
/// block.
#[inline(always)]
unsafe fn q5_regs<const X: bool>(blk: *const u8, h: __m256i, p: usize) -> (__m256i, __m256i) {
    if X {
        return (_mm256_loadu_si256(blk.add(16 + 64 * p).cast()), _mm256_loadu_si256(blk.add(16 + 64 * p + 32).cast()));
    }
    let (m4, bit4) = (_mm256_set1_epi8(0xF), _mm256_set1_epi8(0x10));
    // Bit g of each byte of `h` is the fifth bit of register g's element:
    // moved to bit 4 by a shift within the byte (a 16-bit shift of at most 4
    // brings nothing from the neighbouring byte into bit 4). Shifted where
    // they are used: eight shifted copies of `h` held for the whole block
    // would not fit in the registers beside four columns' sums.
    let (hl, hh) = match p {
        0 => (_mm256_slli_epi16::<4>(h), h),
        1 => (_mm256_slli_epi16::<3>(h), _mm256_srli_epi16::<1>(h)),
        2 => (_mm256_slli_epi16::<2>(h), _mm256_srli_epi16::<2>(h)),
        _ => (_mm256_slli_epi16::<1>(h), _mm256_srli_epi16::<3>(h)),
    };
    let v = _mm256_loadu_si256(blk.add(48 + 32 * p).cast());
    let xl = _mm256_or_si256(_mm256_and_si256(v, m4), _mm256_and_si256(hl, bit4));
    let xh = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(v), m4), _mm256_and_si256(hh, bit4));
    (xl, xh)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn unpack_q5_0_impl(blocks: usize, src: *const u8, dst: *mut u8) {
    let (bb, xb) = (PackedFormat::Q5_0.block_bytes(), block_bytes::<true>(PackedFormat::Q5_0));
    for b in 0..blocks {
        let (s, d) = (src.add(b * bb), dst.add(b * xb));
        std::ptr::copy_nonoverlapping(s, d, 16);
        let h = _mm256_loadu_si256(s.add(16).cast());
        for p in 0..4 {
            let (xl, xh) = q5_regs::<false>(s, h, p);
            _mm256_storeu_si256(d.add(16 + 64 * p).cast(), xl);
            _mm256_storeu_si256(d.add(16 + 64 * p + 32).cast(), xh);
        }
    }
}

/// Bytes of a block of `fmt` as the kernel reads it: packed, or unpacked where `X`.
#[inline(always)]
fn block_bytes<const X: bool>(fmt: PackedFormat) -> usize {
    if X {
        fmt.unpacked_block_bytes().expect("an unpacked layout")
    } else {
        fmt.block_bytes()
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_0_impl<const N: usize, const X: bool>(
    nb: usize,
    g: *const u8,
    a: *const u8,
    stride: usize,
) -> [__m256; N] {
    let bb = block_bytes::<X>(PackedFormat::Q5_0);
    let ones = _mm256_set1_epi16(1);
    let c = cols::<N>(nb, a, stride);
    let mut acc = [_mm256_setzero_ps(); N];
    for b in 0..nb {
        let blk = g.add(b * bb);
        prefetch_ahead::<X>(blk, bb);
        let h = if X { _mm256_setzero_si256() } else { _mm256_loadu_si256(blk.add(16).cast()) };
        let mut lo16 = [_mm256_setzero_si256(); N];
        let mut hi16 = [_mm256_setzero_si256(); N];
        for p in 0..4 {
            let (xl, xh) = q5_regs::<X>(blk, h, p);
            for j in 0..N {
                let y = c[j].qs.add(32 * b + 4 * p);
                lo16[j] = _mm256_add_epi16(lo16[j], _mm256_maddubs_epi16(xl, bcast4(y)));
                hi16[j] = _mm256_add_epi16(hi16[j], _mm256_maddubs_epi16(xh, bcast4(y.add(16))));
            }
        }
        let dx = _mm256_cvtph_ps(_mm_loadu_si128(blk.cast()));
        for j in 0..N {
            let (d, dsum) = (c[j].d, c[j].dsum);
            let isum = _mm256_add_epi32(_mm256_madd_epi16(lo16[j], ones), _mm256_madd_epi16(hi16[j], ones));
            // The quants were stored offset by 16: take 16 d_y Σq_y back.
            let t = _mm256_fmadd_ps(
                _mm256_cvtepi32_ps(isum),
                _mm256_set1_ps(*d.add(b)),
                _mm256_set1_ps(-16.0 * *dsum.add(b)),
            );
            acc[j] = _mm256_fmadd_ps(dx, t, acc[j]);
        }
    }
    acc
}

/// Signed by signed through `maddubs`: |x| once per register, x's sign moved
/// onto each column's y (exact: no quant is -128).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_0_impl<const N: usize, const X: bool>(
    nb: usize,
    g: *const u8,
    a: *const u8,
    stride: usize,
) -> [__m256; N] {
    let bb = PackedFormat::Q8_0.block_bytes();
    let ones = _mm256_set1_epi16(1);
    let c = cols::<N>(nb, a, stride);
    let mut acc = [_mm256_setzero_ps(); N];
    for b in 0..nb {
        let blk = g.add(b * bb);
        prefetch_ahead::<X>(blk, bb);
        let mut s32 = [_mm256_setzero_si256(); N];
        for r in 0..8 {
            let x = _mm256_loadu_si256(blk.add(16 + 32 * r).cast());
            let ax = _mm256_sign_epi8(x, x);
            for (s, c) in s32.iter_mut().zip(&c) {
                let y = bcast4(c.qs.add(32 * b + 4 * r));
                *s = _mm256_add_epi32(*s, _mm256_madd_epi16(_mm256_maddubs_epi16(ax, _mm256_sign_epi8(y, x)), ones));
            }
        }
        let dx = _mm256_cvtph_ps(_mm_loadu_si128(blk.cast()));
        for j in 0..N {
            let d = c[j].d;
            acc[j] = _mm256_fmadd_ps(_mm256_mul_ps(dx, _mm256_set1_ps(*d.add(b))), _mm256_cvtepi32_ps(s32[j]), acc[j]);
        }
    }
    acc
}
