//! The VNNI level's kernels over unpacked tiles, sixteen rows to a register.
//!
//! At 256 bits a prompt's tile kernels are bound by the two vector ports
//! that the byte products and the float scaling share (0 and 1 on these
//! cores): a Q4_K block of four columns is 32 `dpbusd` and about 20 float
//! operations, 26 cycles or so however the integer part is spelt (AVX2's
//! `maddubs` and adds came out the same). At 512 bits the same instructions
//! do sixteen rows each and issue on ports 0 and 5, so the work per cycle
//! doubles.
//!
//! The unpacked layout at this level pairs groups: groups `2i` and `2i + 1`
//! are unpacked as one, each 8-row array of a block (a field of eight
//! scales, a register of eight rows' quants) followed by the same array of
//! the second group, so one 512-bit load gives sixteen rows. A last, odd
//! group stays in the 8-row layout and goes to the 256-bit kernel. Every row
//! takes the same steps as in the 8-row kernels, so the results are the
//! scalar twins' bit for bit.

use std::arch::x86_64::*;

use super::tile::{
    block_bytes, cols, q4_0_impl, q4_1_impl, q4_k_impl, q5_0_impl, q6_k_impl, store, unpack_q4_0_impl,
    unpack_q4_1_impl, unpack_q4_k_impl, unpack_q5_0_impl, unpack_q6_k_impl, vnni_available, Col, Vnni,
};
use crate::kernels::tile::{check_tile, UnpackedTile};
use crate::packed::{PackedFormat, GROUP, Q4_K_QUANTS, Q6_K_QUANTS};

/// The unpacking into paired groups and the 16-row tile kernel over them,
/// for the formats that have one at this level.
pub(crate) fn unpacked_tile(fmt: PackedFormat) -> Option<UnpackedTile> {
    if !vnni_available() {
        return None;
    }
    Some(match fmt {
        PackedFormat::Q4_0 => UnpackedTile { unpack: unpack_q4_0, tile: tile_q4_0_x },
        PackedFormat::Q4_1 => UnpackedTile { unpack: unpack_q4_1, tile: tile_q4_1_x },
        PackedFormat::Q5_0 => UnpackedTile { unpack: unpack_q5_0, tile: tile_q5_0_x },
        PackedFormat::Q4_K => UnpackedTile { unpack: unpack_q4_k, tile: tile_q4_k_x },
        PackedFormat::Q6_K => UnpackedTile { unpack: unpack_q6_k, tile: tile_q6_k_x },
        PackedFormat::Q8_0 => return None,
    })
}

/// An unpacked block's runs of 8-row arrays: `(bytes, array bytes)`, in
/// order. Pairing writes each array of the first group, then the same array
/// of the second.
fn arrays(fmt: PackedFormat) -> &'static [(usize, usize)] {
    match fmt {
        // d[8] f16 and 16 bytes of padding (or m[8] f16); 8 registers
        PackedFormat::Q4_0 | PackedFormat::Q4_1 => &[(32, 16), (256, 32)],
        // d[8] f16; 8 registers of bytes
        PackedFormat::Q5_0 => &[(16, 16), (256, 32)],
        // d[8], dmin[8] f16; scales and mins [8 sub][8 rows]; 64 registers
        PackedFormat::Q4_K => &[(32, 16), (Q4_K_QUANTS - 32, 8), (2048, 32)],
        // d[8] f16; scales [16 sub][8 rows]; 64 registers
        PackedFormat::Q6_K => &[(16, 16), (Q6_K_QUANTS - 16, 8), (2048, 32)],
        PackedFormat::Q8_0 => unreachable!("no paired layout"),
    }
}

macro_rules! unpacker {
    ($name:ident, $impl:ident, $fmt:expr) => {
        fn $name(k: usize, w: &[u8], groups: usize, dst: &mut [u8]) {
            let (gb, xb) = (
                $fmt.group_bytes(k).expect("k is a whole number of blocks"),
                $fmt.unpacked_group_bytes(k).expect("an unpacked layout"),
            );
            assert!(w.len() >= groups * gb && dst.len() >= groups * xb, "unpacking {groups} groups");
            // SAFETY: handed out only by `unpacked_tile` after
            // `vnni_available()` (which implies AVX2); both slices were
            // checked to hold `groups` groups.
            unsafe { unpack_paired($fmt, k, groups, w.as_ptr(), dst.as_mut_ptr(), |n, s, d| $impl(n, s, d)) }
        }
    };
}

unpacker!(unpack_q4_0, unpack_q4_0_impl, PackedFormat::Q4_0);
unpacker!(unpack_q4_1, unpack_q4_1_impl, PackedFormat::Q4_1);
unpacker!(unpack_q5_0, unpack_q5_0_impl, PackedFormat::Q5_0);
unpacker!(unpack_q4_k, unpack_q4_k_impl, PackedFormat::Q4_K);
unpacker!(unpack_q6_k, unpack_q6_k_impl, PackedFormat::Q6_K);

/// Unpacks `groups` groups, pairs interleaved block by block through a
/// buffer of two unpacked blocks (in L1), a last odd group as it is.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn unpack_paired(
    fmt: PackedFormat,
    k: usize,
    groups: usize,
    src: *const u8,
    dst: *mut u8,
    unpack: impl Fn(usize, *const u8, *mut u8),
) {
    let (bb, xb) = (fmt.block_bytes(), block_bytes::<true>(fmt));
    let (gb, gxb, blocks) = (k / fmt.block_elems() * bb, k / fmt.block_elems() * xb, k / fmt.block_elems());
    let mut two = [0u8; 2 * (Q4_K_QUANTS + 2048)];
    debug_assert!(2 * xb <= two.len());
    for pair in 0..groups / 2 {
        let (a, b) = (src.add(2 * pair * gb), src.add((2 * pair + 1) * gb));
        let out = dst.add(2 * pair * gxb);
        for blk in 0..blocks {
            unpack(1, a.add(blk * bb), two.as_mut_ptr());
            unpack(1, b.add(blk * bb), two.as_mut_ptr().add(xb));
            let mut off = 0;
            let o = out.add(2 * blk * xb);
            for &(bytes, array) in arrays(fmt) {
                for at in (off..off + bytes).step_by(array) {
                    std::ptr::copy_nonoverlapping(two.as_ptr().add(at), o.add(2 * at), array);
                    std::ptr::copy_nonoverlapping(two.as_ptr().add(xb + at), o.add(2 * at + array), array);
                }
                off += bytes;
            }
            debug_assert_eq!(off, xb);
        }
    }
    if groups % 2 == 1 {
        unpack(blocks, src.add((groups - 1) * gb), dst.add((groups - 1) * gxb));
    }
}

macro_rules! tile_entry {
    ($name:ident, $pair:ident, $group:ident, $fmt:expr) => {
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
            let gb = check_tile($fmt, true, k, w, rows, acts, act_stride, n, out, out_stride);
            #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
            #[allow(clippy::too_many_arguments)]
            unsafe fn run(
                k: usize,
                gb: usize,
                w: *const u8,
                rows: usize,
                a: *const u8,
                stride: usize,
                n: usize,
                o: *mut f32,
                out_stride: usize,
            ) {
                let nb = k / 32;
                let groups = rows.div_ceil(GROUP);
                for pair in 0..groups / 2 {
                    let (w, o, lanes) =
                        (w.add(2 * pair * gb), o.add(2 * pair * GROUP), (rows - 2 * pair * GROUP).min(16));
                    match n {
                        1 => store16(&$pair::<1>(nb, w, a, stride), o, out_stride, lanes),
                        2 => store16(&$pair::<2>(nb, w, a, stride), o, out_stride, lanes),
                        3 => store16(&$pair::<3>(nb, w, a, stride), o, out_stride, lanes),
                        _ => store16(&$pair::<4>(nb, w, a, stride), o, out_stride, lanes),
                    }
                }
                if groups % 2 == 1 {
                    let g = groups - 1;
                    let (w, o, lanes) = (w.add(g * gb), o.add(g * GROUP), rows - g * GROUP);
                    match n {
                        1 => store(&$group::<Vnni, 1, true>(nb, w, a, stride), o, out_stride, lanes),
                        2 => store(&$group::<Vnni, 2, true>(nb, w, a, stride), o, out_stride, lanes),
                        3 => store(&$group::<Vnni, 3, true>(nb, w, a, stride), o, out_stride, lanes),
                        _ => store(&$group::<Vnni, 4, true>(nb, w, a, stride), o, out_stride, lanes),
                    }
                }
            }
            // SAFETY: handed out only by `unpacked_tile` after
            // `vnni_available()`; the slices were checked to cover everything
            // the kernel reads and writes.
            unsafe { run(k, gb, w.as_ptr(), rows, acts.as_ptr(), act_stride, n, out.as_mut_ptr(), out_stride) }
        }
    };
}

tile_entry!(tile_q4_0_x, q4_0_pair, q4_0_impl, PackedFormat::Q4_0);
tile_entry!(tile_q4_1_x, q4_1_pair, q4_1_impl, PackedFormat::Q4_1);
tile_entry!(tile_q5_0_x, q5_0_pair, q5_0_impl, PackedFormat::Q5_0);
tile_entry!(tile_q4_k_x, q4_k_pair, q4_k_impl, PackedFormat::Q4_K);
tile_entry!(tile_q6_k_x, q6_k_pair, q6_k_impl, PackedFormat::Q6_K);

/// Column `j`'s sixteen row results to `out[j * stride..]`, the first `lanes`.
#[inline(always)]
unsafe fn store16<const N: usize>(res: &[__m512; N], out: *mut f32, stride: usize, lanes: usize) {
    let mask = if lanes >= 16 { 0xFFFF } else { ((1u32 << lanes) - 1) as __mmask16 };
    for (j, &v) in res.iter().enumerate() {
        _mm512_mask_storeu_ps(out.add(j * stride), mask, v);
    }
}

/// Four activation bytes in every 32-bit lane.
#[inline(always)]
unsafe fn bcast4(p: *const u8) -> __m512i {
    _mm512_set1_epi32(p.cast::<i32>().read_unaligned())
}

/// Sixteen rows' f16 values at `p` as f32.
#[inline(always)]
unsafe fn f16x16(p: *const u8) -> __m512 {
    _mm512_cvtph_ps(_mm256_loadu_si256(p.cast()))
}

/// One 32-element block of byte quants for sixteen rows (eight registers
/// at `regs`: elements `4p..` then `16 + 4p..`, for p in 0..4) against every
/// column: each column's exact `Σ q q_y`. Two running sums per column, so no
/// `dpbusd` waits long on the one before it.
#[inline(always)]
unsafe fn block_dots16<const N: usize>(regs: *const u8, b: usize, c: &[Col; N]) -> [__m512i; N] {
    let mut lo = [_mm512_setzero_si512(); N];
    let mut hi = [_mm512_setzero_si512(); N];
    for p in 0..4 {
        let xl = _mm512_loadu_si512(regs.add(128 * p).cast());
        let xh = _mm512_loadu_si512(regs.add(128 * p + 64).cast());
        for j in 0..N {
            let y = c[j].qs.add(32 * b + 4 * p);
            lo[j] = _mm512_dpbusd_epi32(lo[j], xl, bcast4(y));
            hi[j] = _mm512_dpbusd_epi32(hi[j], xh, bcast4(y.add(16)));
        }
    }
    std::array::from_fn(|j| _mm512_add_epi32(lo[j], hi[j]))
}

/// One block of 4-bit quants for sixteen rows against every column:
/// `acc += (dx d_y) Σ q q_y`, then `acc += mx sums[b]`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn q4_block16<const N: usize>(
    regs: *const u8,
    dx: __m512,
    mx: __m512,
    b: usize,
    c: &[Col; N],
    sums: impl Fn(&Col) -> *const f32,
    acc: &mut [__m512; N],
) {
    let isum = block_dots16::<N>(regs, b, c);
    for j in 0..N {
        acc[j] = _mm512_fmadd_ps(_mm512_mul_ps(dx, _mm512_set1_ps(*c[j].d.add(b))), _mm512_cvtepi32_ps(isum[j]), acc[j]);
        acc[j] = _mm512_fmadd_ps(mx, _mm512_set1_ps(*sums(&c[j]).add(b)), acc[j]);
    }
}

/// Q4_0 over a pair: the min `-8 d` from the scale, met by the exact sums.
#[inline(always)]
unsafe fn q4_0_pair<const N: usize>(nb: usize, g: *const u8, a: *const u8, stride: usize) -> [__m512; N] {
    let bb = 2 * block_bytes::<true>(PackedFormat::Q4_0);
    let c = cols::<N>(nb, a, stride);
    let mut acc = [_mm512_setzero_ps(); N];
    for b in 0..nb {
        let blk = g.add(b * bb);
        let dx = f16x16(blk);
        q4_block16::<N>(blk.add(64), dx, _mm512_mul_ps(dx, _mm512_set1_ps(-8.0)), b, &c, |c| c.dsum, &mut acc);
    }
    acc
}

/// Q4_1 over a pair: the stored min, met by the Q8_1 sums.
#[inline(always)]
unsafe fn q4_1_pair<const N: usize>(nb: usize, g: *const u8, a: *const u8, stride: usize) -> [__m512; N] {
    let bb = 2 * block_bytes::<true>(PackedFormat::Q4_1);
    let c = cols::<N>(nb, a, stride);
    let mut acc = [_mm512_setzero_ps(); N];
    for b in 0..nb {
        let blk = g.add(b * bb);
        q4_block16::<N>(blk.add(64), f16x16(blk), f16x16(blk.add(32)), b, &c, |c| c.s, &mut acc);
    }
    acc
}

/// Q5_0 over a pair: the quants were stored offset by 16, so `16 d_y Σq_y`
/// is taken back per column, in the 8-row kernel's order.
#[inline(always)]
unsafe fn q5_0_pair<const N: usize>(nb: usize, g: *const u8, a: *const u8, stride: usize) -> [__m512; N] {
    let bb = 2 * block_bytes::<true>(PackedFormat::Q5_0);
    let c = cols::<N>(nb, a, stride);
    let mut acc = [_mm512_setzero_ps(); N];
    for b in 0..nb {
        let blk = g.add(b * bb);
        let isum = block_dots16::<N>(blk.add(32), b, &c);
        let dx = f16x16(blk);
        for j in 0..N {
            let t = _mm512_fmadd_ps(
                _mm512_cvtepi32_ps(isum[j]),
                _mm512_set1_ps(*c[j].d.add(b)),
                _mm512_set1_ps(-16.0 * *c[j].dsum.add(b)),
            );
            acc[j] = _mm512_fmadd_ps(dx, t, acc[j]);
        }
    }
    acc
}

/// Q4_K over a pair: each sub-block's `d sc` and `dmin m` for sixteen rows.
#[inline(always)]
unsafe fn q4_k_pair<const N: usize>(nb: usize, g: *const u8, a: *const u8, stride: usize) -> [__m512; N] {
    let bb = 2 * block_bytes::<true>(PackedFormat::Q4_K);
    let c = cols::<N>(nb, a, stride);
    let mut acc = [_mm512_setzero_ps(); N];
    let bytes16 = |p: *const u8| _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(p.cast())));
    for sb in 0..nb / 8 {
        let blk = g.add(sb * bb);
        let d = f16x16(blk);
        let neg_dmin = _mm512_sub_ps(_mm512_setzero_ps(), f16x16(blk.add(32)));
        for j in 0..8 {
            let dx = _mm512_mul_ps(d, bytes16(blk.add(64 + 16 * j)));
            let mx = _mm512_mul_ps(neg_dmin, bytes16(blk.add(192 + 16 * j)));
            q4_block16::<N>(blk.add(2 * Q4_K_QUANTS + 512 * j), dx, mx, 8 * sb + j, &c, |c| c.dsum, &mut acc);
        }
    }
    acc
}

/// Q6_K over a pair, as the 8-row kernel: two `maddubs` per 16-bit sum,
/// `dpwssd` against the sub-block's scale, the `- 32` of every quant taken
/// back through the half-block sums.
#[inline(always)]
unsafe fn q6_k_pair<const N: usize>(nb: usize, g: *const u8, a: *const u8, stride: usize) -> [__m512; N] {
    let bb = 2 * block_bytes::<true>(PackedFormat::Q6_K);
    let c = cols::<N>(nb, a, stride);
    let mut acc = [_mm512_setzero_ps(); N];
    // Sixteen rows' i8 scales as 16-bit lanes 2r and 2r + 1 of row r (or,
    // from two arrays, the first's scale in lane 2r and the second's in 2r + 1).
    let widen = |x: __m128i, y: __m128i| {
        _mm512_cvtepi8_epi16(_mm256_set_m128i(_mm_unpackhi_epi8(x, y), _mm_unpacklo_epi8(x, y)))
    };
    for sb in 0..nb / 8 {
        let blk = g.add(sb * bb);
        let d = f16x16(blk);
        for j in 0..8 {
            let b = 8 * sb + j;
            let sub = blk.add(2 * Q6_K_QUANTS + 512 * j);
            let sa = _mm_loadu_si128(blk.add(32 + 16 * (2 * j)).cast());
            let sbb = _mm_loadu_si128(blk.add(32 + 16 * (2 * j + 1)).cast());
            let (sc_a, sc_b, sc_ab) = (widen(sa, sa), widen(sbb, sbb), widen(sa, sbb));
            let mut isum_a = [_mm512_setzero_si512(); N];
            let mut isum_b = [_mm512_setzero_si512(); N];
            for pp in [0, 2] {
                let [xl0, xl1, xh0, xh1]: [__m512i; 4] =
                    std::array::from_fn(|i| _mm512_loadu_si512(sub.add(128 * pp + 64 * i).cast()));
                for jj in 0..N {
                    let y = c[jj].qs.add(32 * b + 4 * pp);
                    let ta = _mm512_add_epi16(
                        _mm512_maddubs_epi16(xl0, bcast4(y)),
                        _mm512_maddubs_epi16(xl1, bcast4(y.add(4))),
                    );
                    let tb = _mm512_add_epi16(
                        _mm512_maddubs_epi16(xh0, bcast4(y.add(16))),
                        _mm512_maddubs_epi16(xh1, bcast4(y.add(20))),
                    );
                    isum_a[jj] = _mm512_dpwssd_epi32(isum_a[jj], ta, sc_a);
                    isum_b[jj] = _mm512_dpwssd_epi32(isum_b[jj], tb, sc_b);
                }
            }
            for jj in 0..N {
                let off = _mm512_madd_epi16(sc_ab, bcast4(c[jj].hsum.add(4 * b)));
                let total = _mm512_sub_epi32(_mm512_add_epi32(isum_a[jj], isum_b[jj]), _mm512_slli_epi32::<5>(off));
                acc[jj] = _mm512_fmadd_ps(
                    _mm512_mul_ps(d, _mm512_set1_ps(*c[jj].d.add(b))),
                    _mm512_cvtepi32_ps(total),
                    acc[jj],
                );
            }
        }
    }
    acc
}
