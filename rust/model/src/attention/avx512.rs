//! The element loops of attention in AVX-512 (F, BW, VL, VNNI), where the
//! level ember runs at has it: sixteen lanes where AVX2 has eight, and twice
//! the registers, rounding as the scalar twin (`super::lanes::Scalar`) does.
//! A score keeps the eight lanes of the module's doc, two keys to a
//! register, and widened keys are met by up to six queries at once (keys
//! read in place, widened two at a time, by three);
//! the lanes are summed in 512-bit steps, the same additions as AVX2's.
//! Keys that every query of a prompt's item sees are laid out sixteen to a
//! register instead (widened, or as bf16 pairs for AVX-512 BF16), each lane
//! of a score a chain of its own, summed in the same order without shuffles. A
//! Q8_0 key's block dots are VNNI's byte dots, exact as AVX2's are. An
//! output element's chain of multiply-adds is its own whatever the width:
//! f16 value rows read in place are walked once for all sixty-four floats of
//! a head, where AVX2's thirty-two take two walks, and Q8_0 value rows read
//! in place are walked once for two blocks, where AVX2 walks them once per
//! block. What gains nothing from the width (the f64 sums, Q8_0 rows widened
//! into a buffer) is AVX2's.

use std::arch::x86_64::*;

use half::{bf16, f16};

use super::avx2::Avx2;
use super::lanes::{Scalar, gather_offsets, in_groups, scores16_q8_0_by_eights, Lanes, Q8Queries, MAX_KEY_BLOCKS};

/// Reachable only through `super::run_avx512` (or `super::run_avx512_bf16`,
/// `BF16` true, where the core has AVX-512 BF16), after `super::level`.
pub(super) struct Avx512<const BF16: bool>;

/// Eight floats at `lo` in the low half of a register, eight at `hi` in the high.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn pair(lo: *const f32, hi: *const f32) -> __m512 {
    let lo = _mm512_castps256_ps512(_mm256_loadu_ps(lo));
    _mm512_castpd_ps(_mm512_insertf64x4::<1>(_mm512_castps_pd(lo), _mm256_castps_pd(_mm256_loadu_ps(hi))))
}

/// Eight dots of one query with eight keys: key `r` in the low half of
/// accumulator `r % 4` for r < 4, in the high half for the others, so each
/// key's eight lanes are those of the AVX2 form; then the same reduction.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn scores8(q: &[f32], k: &[f32], out: &mut [f32; 8]) {
    let n = q.len();
    assert!(n.is_multiple_of(8) && k.len() >= 8 * n);
    let (qp, kp) = (q.as_ptr(), k.as_ptr());
    let mut acc = [_mm512_setzero_ps(); 4];
    let mut i = 0;
    while i < n {
        let qv = pair(qp.add(i), qp.add(i));
        for (r, a) in acc.iter_mut().enumerate() {
            *a = _mm512_fmadd_ps(qv, pair(kp.add(r * n + i), kp.add((r + 4) * n + i)), *a);
        }
        i += 8;
    }
    _mm256_storeu_ps(out.as_mut_ptr(), reduce_pairs(&acc))
}

/// Eight scores from four accumulators laid out as [`scores8`]'s (key `r`'s
/// eight lanes in the low half of `acc[r % 4]`, key `r + 4`'s in the high
/// half), reduced in 512-bit steps: two levels of pairwise sums within each
/// 128-bit quarter give every key's `(l0 + l1) + (l2 + l3)` and
/// `(l4 + l5) + (l6 + l7)`, and one last sum adds them, the same additions as
/// AVX2's `reduce8` in half its instructions.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn reduce_pairs(acc: &[__m512; 4]) -> __m256 {
    // Per quarter, as `_mm256_hadd_ps`: [x0 + x1, x2 + x3, y0 + y1, y2 + y3].
    let hadd = |x: __m512, y: __m512| _mm512_add_ps(_mm512_shuffle_ps::<0x88>(x, y), _mm512_shuffle_ps::<0xDD>(x, y));
    // Quarters: keys 0-3's first four lanes summed, their last four; keys 4-7's likewise.
    let q = hadd(hadd(acc[0], acc[1]), hadd(acc[2], acc[3]));
    let t = _mm512_shuffle_f32x4::<0xD8>(q, q);
    _mm256_add_ps(_mm512_castps512_ps256(t), _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(t))))
}

/// Eight key rows of `n` floats laid out as [`scores8_n`] reads them: for
/// each step of eight elements, four registers of sixteen floats, the `r`-th
/// holding key `r`'s eight then key `r + 4`'s, so that a step's keys are four
/// plain loads (an insert per register would take the port that also
/// executes half the multiply-adds, once per register and query group).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn pair_keys(k: *const f32, n: usize, paired: *mut f32) {
    let mut i = 0;
    while i < n {
        for r in 0..4 {
            let at = paired.add((i / 8 * 4 + r) * 16);
            _mm256_storeu_ps(at, _mm256_loadu_ps(k.add(r * n + i)));
            _mm256_storeu_ps(at.add(8), _mm256_loadu_ps(k.add((r + 4) * n + i)));
        }
        i += 8;
    }
}

/// [`scores8`] of `N` queries with the same eight keys (paired by
/// [`pair_keys`]): each step's four registers of key pairs are loaded once
/// for the `N` queries (`4 * N` accumulators; six queries fill 29 of the 32
/// registers), the same lanes, the same sums.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn scores8_n<const N: usize>(q: [*const f32; N], n: usize, paired: *const f32, scale: f32, dst: *mut f32,
                                    stride: usize) {
    let mut acc = [[_mm512_setzero_ps(); 4]; N];
    let mut i = 0;
    while i < n {
        let kv: [__m512; 4] = std::array::from_fn(|r| _mm512_loadu_ps(paired.add((i / 8 * 4 + r) * 16)));
        for (a, &q) in acc.iter_mut().zip(&q) {
            let qv = _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(_mm256_loadu_ps(q.add(i)))));
            for (a, &kv) in a.iter_mut().zip(&kv) {
                *a = _mm512_fmadd_ps(qv, kv, *a);
            }
        }
        i += 8;
    }
    // Query `i`'s dots times `scale` (1 leaves them as they are) at `dst + i * stride`.
    let scale = _mm256_set1_ps(scale);
    for (i, a) in acc.iter().enumerate() {
        _mm256_storeu_ps(dst.add(i * stride), _mm256_mul_ps(scale, reduce_pairs(a)));
    }
}

/// [`Lanes::scores8_q8_0`] with VNNI's byte dots: per block, two keys to a
/// register (key `r` in the low half, key `r + 4` in the high), each key's
/// quants offset to unsigned (`k + 128`) and met by the query's signed ones
/// in `vpdpbusd`, which starts from `-128` times the query's sums so that
/// what it leaves is the exact `k · q`; the eight partial sums of each key
/// are added as [`reduce_pairs`] adds floats (integers: any order is exact),
/// then scaled and added block after block as AVX2 does.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn scores8_q8_0(q: &[u8], keys: &[&[u8]; 8], dk: &[f32], out: &mut [f32; 8]) {
    use ember_kv::Q8_0_BYTES;
    let nb = q.len() / Q8_0_BYTES;
    assert!(dk.len() >= 8 * nb && keys.iter().all(|k| k.len() >= q.len()));
    // 0x80 in every byte: the offset, and 128 as an unsigned quant.
    let offset = _mm512_set1_epi8(-128);
    let hadd = |x: __m512i, y: __m512i| {
        let (x, y) = (_mm512_castsi512_ps(x), _mm512_castsi512_ps(y));
        _mm512_add_epi32(_mm512_castps_si512(_mm512_shuffle_ps::<0x88>(x, y)), _mm512_castps_si512(_mm512_shuffle_ps::<0xDD>(x, y)))
    };
    let mut acc = _mm256_setzero_ps();
    for b in 0..nb {
        let qb = q.as_ptr().add(b * Q8_0_BYTES);
        let dq = _mm_cvtss_f32(_mm_cvtph_ps(_mm_set1_epi16(i16::from_le_bytes([*qb, *qb.add(1)]))));
        let qv = _mm512_broadcast_i64x4(_mm256_loadu_si256(qb.add(2).cast()));
        // -128 times each four quants' sum: (k + 128) · q - 128 · Σq = k · q.
        let start = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), offset, qv));
        let dot = |r: usize| {
            let lo = _mm512_castsi256_si512(_mm256_loadu_si256(keys[r].as_ptr().add(b * Q8_0_BYTES + 2).cast()));
            let kv = _mm512_inserti64x4::<1>(lo, _mm256_loadu_si256(keys[r + 4].as_ptr().add(b * Q8_0_BYTES + 2).cast()));
            _mm512_dpbusd_epi32(start, _mm512_xor_si512(kv, offset), qv)
        };
        let quarters = hadd(hadd(dot(0), dot(1)), hadd(dot(2), dot(3)));
        let t = _mm512_shuffle_i32x4::<0xD8>(quarters, quarters);
        let sums = _mm256_add_epi32(_mm512_castsi512_si256(t), _mm512_extracti64x4_epi64::<1>(t));
        let scale = _mm256_mul_ps(_mm256_set1_ps(dq), _mm256_loadu_ps(dk.as_ptr().add(8 * b)));
        acc = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(sums), acc);
    }
    _mm256_storeu_ps(out.as_mut_ptr(), acc);
}

/// [`Lanes::scores16_q8_0_scaled`] with the sixteen keys transposed once
/// for all the queries: per block, eight registers whose lane `i` holds four
/// quants of key `i` (offset to unsigned, `k + 128`), so that a query's four
/// quants, broadcast, meet all sixteen keys in one `vpdpbusd` and a block's
/// eight steps leave each key's exact dot in its own lane, with no lanes to
/// sum. The sums start from `-128` times the query's block sum, which takes
/// the offset back out; then each block is scaled and added by a fused
/// multiply-add, block after block, as [`scores8_q8_0`] does per key.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn scores16_q8_0_scaled(q: &Q8Queries, count: usize, keys: &[&[u8]; 16], scale: f32, dst: *mut f32,
                               stride: usize) {
    use ember_kv::Q8_0_BYTES;
    let Some(offsets) = gather_offsets(keys) else {
        return scores16_q8_0_by_eights::<Avx512<false>>(q.rows, count, keys, scale, dst, stride);
    };
    let (len, base) = (keys[0].len(), keys[0].as_ptr());
    let nb = len / Q8_0_BYTES;
    assert!(q.rows.len() >= count * len && q.sums.len() >= count * nb && q.scales.len() >= count * nb);
    let index = _mm512_loadu_si512(offsets.as_ptr().cast());
    let offset = _mm512_set1_epi8(-128);
    // Only the key's own blocks are written, and only they are read.
    let mut kt = [std::mem::MaybeUninit::<__m512i>::uninit(); 8 * MAX_KEY_BLOCKS];
    let mut dk = [std::mem::MaybeUninit::<__m512>::uninit(); MAX_KEY_BLOCKS];
    for b in 0..nb {
        let at = b * Q8_0_BYTES;
        let scales: [u16; 16] = std::array::from_fn(|i| u16::from_le_bytes([keys[i][at], keys[i][at + 1]]));
        dk[b].write(_mm512_cvtph_ps(_mm256_loadu_si256(scales.as_ptr().cast())));
        for (c, kt) in kt[8 * b..8 * b + 8].iter_mut().enumerate() {
            // Quants 4c..4c + 4 of each key's block, one key to a lane.
            kt.write(_mm512_xor_si512(_mm512_i32gather_epi32::<1>(index, base.add(at + 2 + 4 * c).cast()), offset));
        }
    }
    let kt = std::slice::from_raw_parts(kt.as_ptr().cast::<__m512i>(), 8 * nb);
    let dk = std::slice::from_raw_parts(dk.as_ptr().cast::<__m512>(), nb);
    let mut i = 0;
    while i < count {
        let query = |j: usize| {
            let (at, blocks) = ((i + j) * len, (i + j) * nb);
            (q.rows.as_ptr().add(at), q.sums.as_ptr().add(blocks), q.scales.as_ptr().add(blocks), dst.add((i + j) * stride))
        };
        i += match count - i {
            8.. => { q8_0_dots16::<8>(std::array::from_fn(query), kt, dk, scale); 8 }
            4..=7 => { q8_0_dots16::<4>(std::array::from_fn(query), kt, dk, scale); 4 }
            2 | 3 => { q8_0_dots16::<2>(std::array::from_fn(query), kt, dk, scale); 2 }
            _ => { q8_0_dots16::<1>([query(0)], kt, dk, scale); 1 }
        };
    }
}

/// [`scores16_q8_0_scaled`]'s arithmetic for `N` queries (each its Q8_0
/// row, its block sums, its block scales and where its sixteen scores go)
/// and the keys transposed (eight registers and the scales per block), `N`
/// chains of byte dots in flight.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn q8_0_dots16<const N: usize>(queries: [(*const u8, *const i32, *const f32, *mut f32); N], kt: &[__m512i],
                                      dk: &[__m512], scale: f32) {
    use ember_kv::Q8_0_BYTES;
    let mut s = [_mm512_setzero_ps(); N];
    for (b, &dk) in dk.iter().enumerate() {
        let k: [__m512i; 8] = std::array::from_fn(|c| kt[8 * b + c]);
        let mut acc: [__m512i; N] = std::array::from_fn(|n| _mm512_set1_epi32(-128 * *queries[n].1.add(b)));
        for (c, &k) in k.iter().enumerate() {
            for (acc, &(q, ..)) in acc.iter_mut().zip(&queries) {
                let quants = _mm512_set1_epi32(std::ptr::read_unaligned(q.add(b * Q8_0_BYTES + 2 + 4 * c).cast::<i32>()));
                *acc = _mm512_dpbusd_epi32(*acc, k, quants);
            }
        }
        for ((s, acc), &(_, _, dq, _)) in s.iter_mut().zip(&acc).zip(&queries) {
            *s = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(*dq.add(b)), dk), _mm512_cvtepi32_ps(*acc), *s);
        }
    }
    let scale = _mm512_set1_ps(scale);
    for (s, &(.., d)) in s.iter().zip(&queries) {
        _mm512_storeu_ps(d, _mm512_mul_ps(scale, *s));
    }
}

/// [`Lanes::scores8_f16`] for `N` queries at once, with the keys read in
/// place and laid out as [`scores8`]'s: each step widens the eight halves of
/// keys `r` and `r + 4` into one register, once for the `N` queries (`4 N`
/// accumulators: four queries take 16 of the 32 registers), and the lanes
/// are summed by [`reduce_pairs`]. The same lanes, the same sums.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn scores8_f16_n<const N: usize>(q: [&[f32]; N], keys: &[&[f16]; 8], out: [&mut [f32; 8]; N]) {
    let n = q[0].len();
    assert!(n.is_multiple_of(8) && q.iter().all(|q| q.len() == n) && keys.iter().all(|k| k.len() >= n));
    let acc = f16_pair_sums::<N>(q.map(|q| q.as_ptr()), &keys.map(|k| k.as_ptr()), n);
    for (a, out) in acc.iter().zip(out) {
        _mm256_storeu_ps(out.as_mut_ptr(), reduce_pairs(a));
    }
}

/// [`scores8_f16_n`]'s sums before [`reduce_pairs`]: `N` query rows at `q`
/// against eight f16 key rows at `kp`, `n` elements (a multiple of eight)
/// of each.
///
/// # Safety
/// Each pointer starts `n` elements of one allocation.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn f16_pair_sums<const N: usize>(q: [*const f32; N], kp: &[*const f16; 8], n: usize) -> [[__m512; 4]; N] {
    let mut acc = [[_mm512_setzero_ps(); 4]; N];
    let mut i = 0;
    while i < n {
        let qv = q.map(|q| _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(_mm256_loadu_ps(q.add(i))))));
        for r in 0..4 {
            let lo = _mm256_castsi128_si256(_mm_loadu_si128(kp[r].add(i).cast()));
            let kv = _mm512_cvtph_ps(_mm256_inserti128_si256::<1>(lo, _mm_loadu_si128(kp[r + 4].add(i).cast())));
            for (a, qv) in acc.iter_mut().zip(&qv) {
                a[r] = _mm512_fmadd_ps(*qv, kv, a[r]);
            }
        }
        i += 8;
    }
    acc
}

/// [`Lanes::scores8_f16_groups`] for `N` queries a head: each head's dots
/// taken as [`scores8_f16_n`] takes them, scaled and stored by a masked
/// store, the block's heads in one call rather than a call, a check of the
/// slices and an array of key rows per head and block.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
#[allow(clippy::too_many_arguments)]
unsafe fn scores8_f16_groups<const N: usize>(q: &[f32], hk: usize, groups: usize, rows: &[*const f16; 8], scale: f32,
                                             out: *mut f32, stride: usize, lo: usize, hi: usize) {
    assert!(hk.is_multiple_of(8) && q.len() >= groups * N * hk && lo < hi && hi <= 8);
    let lanes = (0xFFu8 >> (8 - (hi - lo))) << lo;
    let scale = _mm256_set1_ps(scale);
    for g in 0..groups {
        let qg = q.as_ptr().add(g * N * hk);
        let acc = f16_pair_sums::<N>(std::array::from_fn(|h| qg.add(h * hk)), &rows.map(|r| r.add(g * hk)), hk);
        for (h, a) in acc.iter().enumerate() {
            _mm256_mask_storeu_ps(out.add((g * N + h) * stride), lanes, _mm256_mul_ps(scale, reduce_pairs(a)));
        }
    }
}

/// `H` heads' outputs over the same value rows (as the AVX2 form), `U`
/// registers of sixteen floats of each head held across all the rows: a
/// value row is loaded once for the `H` heads, and `H * U` chains of
/// multiply-adds are in flight. Each output element is the same chain, in
/// row order, as in the scalar twin.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn weigh_heads<const H: usize, const U: usize>(
    w: *const f32,
    stride: usize,
    rows: usize,
    v: *const f32,
    n: usize,
    o: *mut f32,
    i: usize,
) {
    let at = |g: usize, u: usize| o.add(g * n + i + 16 * u);
    let mut acc: [[__m512; U]; H] = std::array::from_fn(|g| std::array::from_fn(|u| _mm512_loadu_ps(at(g, u))));
    for r in 0..rows {
        let row = v.add(r * n + i);
        let x: [__m512; U] = std::array::from_fn(|u| _mm512_loadu_ps(row.add(16 * u)));
        for (g, a) in acc.iter_mut().enumerate() {
            let wg = _mm512_set1_ps(*w.add(g * stride + r));
            for (a, &x) in a.iter_mut().zip(&x) {
                *a = _mm512_fmadd_ps(wg, x, *a);
            }
        }
    }
    for (g, a) in acc.iter().enumerate() {
        for (u, a) in a.iter().enumerate() {
            _mm512_storeu_ps(at(g, u), *a);
        }
    }
}

/// [`weigh_heads`] over all of each head's `n` floats: four registers per
/// head (eight for one head alone), so that eight or more chains are in
/// flight, then one, then single floats. Up to six heads (a prompt's rows
/// that see the same positions) take 24 registers, a value row's four loads
/// met by 24 multiply-adds.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn weigh_all<const H: usize>(w: *const f32, stride: usize, rows: usize, v: *const f32, n: usize, o: *mut f32) {
    const { assert!(H >= 1 && H <= 6) };
    let mut i = 0;
    if H == 1 {
        while i + 128 <= n {
            weigh_heads::<H, 8>(w, stride, rows, v, n, o, i);
            i += 128;
        }
    }
    while i + 64 <= n {
        weigh_heads::<H, 4>(w, stride, rows, v, n, o, i);
        i += 64;
    }
    while i + 16 <= n {
        weigh_heads::<H, 1>(w, stride, rows, v, n, o, i);
        i += 16;
    }
    for e in i..n {
        for g in 0..H {
            let mut acc = *o.add(g * n + e);
            for r in 0..rows {
                acc = (*w.add(g * stride + r)).mul_add(*v.add(r * n + e), acc);
            }
            *o.add(g * n + e) = acc;
        }
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn max(row: &[f32]) -> f32 {
    let (n, r) = (row.len(), row.as_ptr());
    let mut m = _mm512_set1_ps(f32::NEG_INFINITY);
    let mut i = 0;
    while i + 16 <= n {
        m = _mm512_max_ps(m, _mm512_loadu_ps(r.add(i)));
        i += 16;
    }
    _mm512_reduce_max_ps(m).max(Avx2::max(&row[i..]))
}

/// [`Lanes::weigh_f16_heads`] for `H` heads over f16 value rows of `n`
/// floats read in place: a row is widened sixteen at a time, met by every
/// head's weight, and walked once for up to sixty-four of its floats (four
/// registers per head) rather than twice for AVX2's thirty-two. The rest of
/// a row (n not a multiple of 16) is AVX2's.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn weigh_f16_heads<'r, const H: usize>(w: &[f32], stride: usize, v: impl Iterator<Item = &'r [f16]> + Clone,
                                              o: &mut [f32], n: usize) {
    let wide = |p: *const f16| _mm512_cvtph_ps(_mm256_loadu_si256(p.cast()));
    let e = weigh_wide_heads::<H, f16>(w, stride, v.clone(), o, n, wide);
    if e < n {
        let v = v.map(move |row| &row[e..]);
        for g in 0..H {
            Avx2::weigh_f16(&w[g * stride..], v.clone(), &mut o[g * n + e..][..n - e]);
        }
    }
}

/// [`Lanes::weigh_bf16_in_place`] for `H` heads, as [`weigh_f16_heads`]
/// (a bf16 widened by a shift); the rest of a row (n not a multiple of 16)
/// is the scalar twin's.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn weigh_bf16_in_place<'r, const H: usize>(w: &[f32], stride: usize, v: impl Iterator<Item = &'r [bf16]> + Clone,
                                                  o: &mut [f32], n: usize) {
    let wide = |p: *const bf16| {
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(_mm256_loadu_si256(p.cast()))))
    };
    let e = weigh_wide_heads::<H, bf16>(w, stride, v.clone(), o, n, wide);
    if e < n {
        let v = v.map(move |row| &row[e..]);
        for g in 0..H {
            Scalar::weigh_bf16_in_place(&w[g * stride..], stride, 1, v.clone(), &mut o[g * n + e..][..n - e]);
        }
    }
}

/// The whole sixteens of `H` heads' `n` floats over value rows read in
/// place, sixteen elements at `p` widened by `wide`: sixty-four at a time,
/// then sixteen. Says where the rest of a row starts.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn weigh_wide_heads<'r, const H: usize, T: 'r>(w: &[f32], stride: usize,
                                                      v: impl Iterator<Item = &'r [T]> + Clone, o: &mut [f32], n: usize,
                                                      wide: impl Fn(*const T) -> __m512 + Copy) -> usize {
    let mut e = 0;
    while e + 64 <= n {
        weigh_wide_chunk::<H, 4, T>(w, stride, v.clone(), o, n, e, wide);
        e += 64;
    }
    while e + 16 <= n {
        weigh_wide_chunk::<H, 1, T>(w, stride, v.clone(), o, n, e, wide);
        e += 16;
    }
    e
}

/// [`weigh_wide_heads`] for the `16 * U` floats of each head from `e`: the
/// `H * U` accumulators are fixed in number, so they stay in registers
/// across all the rows.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn weigh_wide_chunk<'r, const H: usize, const U: usize, T: 'r>(w: &[f32], stride: usize,
                                                                      v: impl Iterator<Item = &'r [T]>, o: &mut [f32],
                                                                      n: usize, e: usize,
                                                                      wide: impl Fn(*const T) -> __m512) {
    assert!(e + 16 * U <= n && o.len() >= (H - 1) * n + e + 16 * U);
    let (op, wp) = (o.as_mut_ptr(), w.as_ptr());
    let at = |g: usize, u: usize| op.add(g * n + e + 16 * u);
    let mut acc: [[__m512; U]; H] = std::array::from_fn(|g| std::array::from_fn(|u| _mm512_loadu_ps(at(g, u))));
    for (i, row) in v.enumerate() {
        assert!(row.len() >= e + 16 * U && (H - 1) * stride + i < w.len());
        let r = row.as_ptr().add(e);
        let wg: [__m512; H] = std::array::from_fn(|g| _mm512_set1_ps(*wp.add(g * stride + i)));
        for u in 0..U {
            let x = wide(r.add(16 * u));
            for (a, &wg) in acc.iter_mut().zip(&wg) {
                a[u] = _mm512_fmadd_ps(wg, x, a[u]);
            }
        }
    }
    for (g, a) in acc.iter().enumerate() {
        for (u, a) in a.iter().enumerate() {
            _mm512_storeu_ps(at(g, u), *a);
        }
    }
}

/// [`Lanes::weigh_q8_0_heads`] for `H` heads over Q8_0 value rows of `n`
/// floats read in place: each row is walked once for up to two blocks (64
/// floats, four registers per head), its quants widened sixteen at a time and
/// multiplied by their block's scale (exact, as the scalar twin's), then met
/// by every head's weight. AVX2's form walks every row once per block.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn weigh_q8_0_heads<'r, const H: usize>(w: &[f32], stride: usize, v: impl Iterator<Item = &'r [u8]> + Clone,
                                               o: &mut [f32], n: usize) {
    use ember_kv::Q8_0_BLOCK;
    assert!(n.is_multiple_of(Q8_0_BLOCK) && o.len() >= H * n);
    let mut b = 0;
    while (b + 2) * Q8_0_BLOCK <= n {
        weigh_q8_0_chunk::<H, 2>(w, stride, v.clone(), o, n, b);
        b += 2;
    }
    if b * Q8_0_BLOCK < n {
        weigh_q8_0_chunk::<H, 1>(w, stride, v, o, n, b);
    }
}

/// [`weigh_q8_0_heads`] for blocks `b..b + B` of each head: `H * 2 * B`
/// accumulators, fixed in number so that they stay in registers.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn weigh_q8_0_chunk<'r, const H: usize, const B: usize>(w: &[f32], stride: usize,
                                                               v: impl Iterator<Item = &'r [u8]>, o: &mut [f32],
                                                               n: usize, b: usize) {
    use ember_kv::{Q8_0_BLOCK, Q8_0_BYTES};
    assert!((b + B) * Q8_0_BLOCK <= n && o.len() >= (H - 1) * n + (b + B) * Q8_0_BLOCK);
    let (op, wp) = (o.as_mut_ptr(), w.as_ptr());
    // Sixteen floats `u` of block `b + k` of head `g`.
    let at = |g: usize, k: usize, u: usize| op.add(g * n + (b + k) * Q8_0_BLOCK + 16 * u);
    let mut acc: [[[__m512; 2]; B]; H] =
        std::array::from_fn(|g| std::array::from_fn(|k| std::array::from_fn(|u| _mm512_loadu_ps(at(g, k, u)))));
    for (i, row) in v.enumerate() {
        assert!(row.len() >= (b + B) * Q8_0_BYTES && (H - 1) * stride + i < w.len());
        let wg: [__m512; H] = std::array::from_fn(|g| _mm512_set1_ps(*wp.add(g * stride + i)));
        for k in 0..B {
            let blk = row.as_ptr().add((b + k) * Q8_0_BYTES);
            let d = _mm512_cvtph_ps(_mm256_set1_epi16(std::ptr::read_unaligned(blk.cast::<i16>())));
            for u in 0..2 {
                let q = _mm512_cvtepi8_epi32(_mm_loadu_si128(blk.add(2 + 16 * u).cast()));
                let x = _mm512_mul_ps(d, _mm512_cvtepi32_ps(q));
                for (a, &wg) in acc.iter_mut().zip(&wg) {
                    a[k][u] = _mm512_fmadd_ps(wg, x, a[k][u]);
                }
            }
        }
    }
    for (g, a) in acc.iter().enumerate() {
        for (k, a) in a.iter().enumerate() {
            for (u, a) in a.iter().enumerate() {
                _mm512_storeu_ps(at(g, k, u), *a);
            }
        }
    }
}

/// The scores of `count` queries (`query(i)` the i-th, of `n` floats) with
/// eight key rows `k`, six at a time then fewer, each query's eight times
/// `scale` at `dst + i * stride`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn scores8_queries(query: impl Fn(usize) -> *const f32, count: usize, n: usize, k: &[f32], scale: f32,
                          dst: *mut f32, stride: usize) {
    assert!(n.is_multiple_of(8) && k.len() >= 8 * n);
    // Heads of up to 256 floats pair their keys on the stack.
    let mut stack = [std::mem::MaybeUninit::<__m512>::uninit(); 128];
    let mut heap = Vec::new();
    let kp = if n <= 256 {
        stack.as_mut_ptr().cast::<f32>()
    } else {
        heap.resize(8 * n, 0.0f32);
        heap.as_mut_ptr()
    };
    pair_keys(k.as_ptr(), n, kp);
    let mut i = 0;
    while i < count {
        let d = dst.add(i * stride);
        i += match count - i {
            6.. => { scores8_n::<6>(std::array::from_fn(|j| query(i + j)), n, kp, scale, d, stride); 6 }
            4 | 5 => { scores8_n::<4>(std::array::from_fn(|j| query(i + j)), n, kp, scale, d, stride); 4 }
            2 | 3 => { scores8_n::<2>(std::array::from_fn(|j| query(i + j)), n, kp, scale, d, stride); 2 }
            _ => { scores8_n::<1>([query(i)], n, kp, scale, d, stride); 1 }
        };
    }
}

/// Scores of `N` queries with `B` blocks of sixteen keys laid out sixteen to
/// a register, in 32-bit units (a float, or a pair of bf16s): unit `u` of
/// block `b` at `keys + 64 (b units + u)` bytes, key `i` of the block at lane
/// `i`; unit `u` of query `i` at `q[i] + 4 u`, met by `madd`. Lane `l` of a
/// score is its own chain over the units `l`, `l + 8`, ..., summed as
/// [`reduce_pairs`] sums them, `(l0 + l1) + (l2 + l3)` plus
/// `(l4 + l5) + (l6 + l7)`: the products and sums of the paired forms, in
/// vertical additions where they shuffle. Two lanes' chains are taken at
/// once and finished before the next two begin: twelve chains for three
/// queries and two blocks, enough to cover a product's latency, with two
/// accumulators a query and block live and at most two partial sums. The
/// first `valid` scores of each query, times `scale`, go to `dst + i stride`.
/// A macro, expanded inside each kernel: its closures then take the
/// kernel's target features and inline (in a generic function they were
/// calls, one a product).
macro_rules! scores16 {
    ($N:ident, $B:ident, $q:expr, $units:expr, $keys:expr, $valid:expr, $scale:expr, $dst:expr, $stride:expr,
     $madd:expr) => {{
        type Acc<const N: usize, const B: usize> = [[__m512; B]; N];
        let (q, units, keys, valid, scale, dst, stride) = ($q, $units, $keys, $valid, $scale, $dst, $stride);
        let madd = $madd;
        let lanes = |l: usize| -> [Acc<$N, $B>; 2] {
            let mut acc = [[[_mm512_setzero_ps(); $B]; $N]; 2];
            let mut u = l;
            while u < units {
                for (h, acc) in acc.iter_mut().enumerate() {
                    let k: [__m512i; $B] =
                        std::array::from_fn(|b| _mm512_loadu_si512(keys.add((b * units + u + h) * 64).cast()));
                    for (a, &q) in acc.iter_mut().zip(&q) {
                        for (a, &k) in a.iter_mut().zip(&k) {
                            *a = madd(*a, q.add(4 * (u + h)), k);
                        }
                    }
                }
                u += 8;
            }
            acc
        };
        let add = |x: Acc<$N, $B>, y: Acc<$N, $B>| -> Acc<$N, $B> {
            std::array::from_fn(|i| std::array::from_fn(|b| _mm512_add_ps(x[i][b], y[i][b])))
        };
        let sum_pair = |[x, y]: [Acc<$N, $B>; 2]| add(x, y);
        let low = add(sum_pair(lanes(0)), sum_pair(lanes(2)));
        let high = add(sum_pair(lanes(4)), sum_pair(lanes(6)));
        let scale = _mm512_set1_ps(scale);
        for (i, (lo, hi)) in low.iter().zip(&high).enumerate() {
            for b in 0..$B {
                let kept = valid.saturating_sub(16 * b).min(16);
                let s = _mm512_mul_ps(scale, _mm512_add_ps(lo[b], hi[b]));
                _mm512_mask_storeu_ps(dst.add(i * stride + 16 * b), ((1u32 << kept) - 1) as u16, s);
            }
        }
    }};
}

/// The queries `0..count` (rows of `units` 32-bit units from `q`) through
/// [`scores16!`] in the runs its kernels take: three at a time with two
/// blocks of keys, six with one, then fewer.
macro_rules! scores16_runs {
    ($kernel:ident, $q:expr, $count:expr, $units:expr, $keys:expr, $valid:expr, $scale:expr, $dst:expr,
     $stride:expr) => {{
        let (q, count, units, keys, valid, scale, dst, stride) =
            ($q, $count, $units, $keys, $valid, $scale, $dst, $stride);
        let blocks = valid.div_ceil(16);
        assert!((1..=2).contains(&blocks));
        let query = |i: usize| q.add(4 * i * units);
        let mut i = 0;
        while i < count {
            let d = dst.add(i * stride);
            let at = |j: usize| query(i + j);
            i += match (blocks, count - i) {
                (2, 3..) => { $kernel::<3, 2>(std::array::from_fn(at), units, keys, valid, scale, d, stride); 3 }
                (2, _) => { $kernel::<1, 2>([at(0)], units, keys, valid, scale, d, stride); 1 }
                (_, 6..) => { $kernel::<6, 1>(std::array::from_fn(at), units, keys, valid, scale, d, stride); 6 }
                (_, 3..) => { $kernel::<3, 1>(std::array::from_fn(at), units, keys, valid, scale, d, stride); 3 }
                _ => { $kernel::<1, 1>([at(0)], units, keys, valid, scale, d, stride); 1 }
            };
        }
    }};
}

/// [`scores16!`] with bf16 keys and queries, a pair to a unit: `vdpbf16ps`
/// meets a key's pair with the query's in every lane, the odd element's
/// product added first.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn scores16_bf16_n<const N: usize, const B: usize>(q: [*const u8; N], units: usize, keys: *const u8,
                                                          valid: usize, scale: f32, dst: *mut f32, stride: usize) {
    scores16!(N, B, q, units, keys, valid, scale, dst, stride, |a: __m512, q: *const u8, k: __m512i| {
        let q: __m512bh = std::mem::transmute(_mm512_set1_epi32(q.cast::<i32>().read_unaligned()));
        _mm512_dpbf16_ps(a, q, std::mem::transmute::<__m512i, __m512bh>(k))
    })
}

/// [`scores16!`] with f32 keys and queries, an element to a unit: one fused
/// multiply-add per element, as the f32 loops' lanes take it.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn scores16_f32_n<const N: usize, const B: usize>(q: [*const u8; N], units: usize, keys: *const u8,
                                                         valid: usize, scale: f32, dst: *mut f32, stride: usize) {
    scores16!(N, B, q, units, keys, valid, scale, dst, stride, |a: __m512, q: *const u8, k: __m512i| {
        _mm512_fmadd_ps(_mm512_set1_ps(q.cast::<f32>().read_unaligned()), _mm512_castsi512_ps(k), a)
    })
}

/// Up to `16 * blocks` rows of 32-bit units (each row's start and the units
/// it holds; units past them, and rows past the last, are zero) laid out
/// sixteen rows to a register, `units` a row: unit `u` of block `b` at
/// `out + 64 (b units + u)` bytes. Sixteen units of sixteen rows at a time,
/// loaded as rows (masked to what a row holds) and transposed.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn transpose_units(rows: &[(*const u8, usize)], blocks: usize, units: usize, out: *mut u8) {
    for b in 0..blocks {
        let mut c = 0;
        while c < units {
            let loaded: [__m512i; 16] = std::array::from_fn(|i| match rows.get(16 * b + i) {
                Some(&(row, held)) => {
                    let held = held.saturating_sub(c).min(16);
                    _mm512_maskz_loadu_epi32(((1u32 << held) - 1) as u16, row.add(4 * c).cast())
                }
                None => _mm512_setzero_si512(),
            });
            let t = transpose16(loaded);
            for (r, t) in t.iter().enumerate().take(units - c) {
                _mm512_storeu_si512(out.add((b * units + c + r) * 64).cast(), *t);
            }
            c += 16;
        }
    }
}

/// [`super::lanes::transpose_bf16_keys`] by [`transpose_units`], a pair of
/// elements to a unit.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn transpose_bf16_keys(keys: &[&[bf16]], blocks: usize, n: usize, out: &mut [bf16]) {
    assert!(n.is_multiple_of(16) && keys.len() <= 16 * blocks && out.len() >= 16 * blocks * n && blocks <= 2);
    if keys.iter().any(|k| !k.len().is_multiple_of(2)) {
        return super::lanes::transpose_bf16_keys(keys, blocks, n, out);
    }
    let mut rows = [(std::ptr::null::<u8>(), 0); 32];
    for (r, k) in rows.iter_mut().zip(keys) {
        *r = (k.as_ptr().cast(), k.len() / 2);
    }
    transpose_units(&rows[..keys.len()], blocks, n / 2, out.as_mut_ptr().cast())
}

/// [`super::lanes::transpose_f32_keys`] by [`transpose_units`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn transpose_f32_keys(keys: &[&[f32]], blocks: usize, n: usize, out: &mut [f32]) {
    assert!(keys.len() <= 16 * blocks && out.len() >= 16 * blocks * n && blocks <= 2);
    let mut rows = [(std::ptr::null::<u8>(), 0); 32];
    for (r, k) in rows.iter_mut().zip(keys) {
        *r = (k.as_ptr().cast(), k.len());
    }
    transpose_units(&rows[..keys.len()], blocks, n, out.as_mut_ptr().cast())
}

/// Sixteen registers of sixteen 32-bit elements transposed: element `j` of
/// row `i` becomes element `i` of row `j`. Interleaving 32-bit then 64-bit
/// elements leaves, in quarter `k` of register `4 g + j`, element `4 k + j`
/// of rows `4 g..4 g + 4`; two steps of quarter shuffles gather row `4 k + j`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn transpose16(r: [__m512i; 16]) -> [__m512i; 16] {
    let a: [__m512i; 16] = std::array::from_fn(|i| match i % 2 {
        0 => _mm512_unpacklo_epi32(r[i], r[i + 1]),
        _ => _mm512_unpackhi_epi32(r[i - 1], r[i]),
    });
    let b: [__m512i; 16] = std::array::from_fn(|i| {
        let (g, j) = (i / 4, i % 4);
        let (x, y) = (a[4 * g + j / 2], a[4 * g + j / 2 + 2]);
        match j % 2 {
            0 => _mm512_unpacklo_epi64(x, y),
            _ => _mm512_unpackhi_epi64(x, y),
        }
    });
    let mut t = [_mm512_setzero_si512(); 16];
    for j in 0..4 {
        let c0 = _mm512_shuffle_i32x4::<0x44>(b[j], b[4 + j]);
        let c1 = _mm512_shuffle_i32x4::<0xEE>(b[j], b[4 + j]);
        let c2 = _mm512_shuffle_i32x4::<0x44>(b[8 + j], b[12 + j]);
        let c3 = _mm512_shuffle_i32x4::<0xEE>(b[8 + j], b[12 + j]);
        t[j] = _mm512_shuffle_i32x4::<0x88>(c0, c2);
        t[4 + j] = _mm512_shuffle_i32x4::<0xDD>(c0, c2);
        t[8 + j] = _mm512_shuffle_i32x4::<0x88>(c1, c3);
        t[12 + j] = _mm512_shuffle_i32x4::<0xDD>(c1, c3);
    }
    t
}

/// [`Lanes::weigh_bf16_heads`] for `H` heads and the `16 * U` floats of
/// each from `e`: per pair of positions each head's two weights fill a
/// register (the pair's bf16s in every lane) and meet sixteen of the
/// interleaved value pairs in one `vdpbf16ps`, the second position's product
/// added first, as the f32 loops add them. `fresh`: from zero, whatever `o` holds.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512bf16")]
#[allow(clippy::too_many_arguments)]
unsafe fn weigh_bf16_chunk<const H: usize, const U: usize>(w: *const bf16, stride: usize, pairs: usize,
                                                           v: *const bf16, n: usize, o: *mut f32, e: usize,
                                                           fresh: bool) {
    let at = |g: usize, u: usize| o.add(g * n + e + 16 * u);
    let start = |g: usize, u: usize| if fresh { _mm512_setzero_ps() } else { _mm512_loadu_ps(at(g, u)) };
    let mut acc: [[__m512; U]; H] = std::array::from_fn(|g| std::array::from_fn(|u| start(g, u)));
    for k in 0..pairs {
        let wg: [__m512bh; H] = std::array::from_fn(|g| {
            std::mem::transmute(_mm512_set1_epi32(std::ptr::read_unaligned(w.add(g * stride + 2 * k).cast::<i32>())))
        });
        for u in 0..U {
            let x: __m512bh = std::mem::transmute(_mm512_loadu_si512(v.add(2 * (k * n + e + 16 * u)).cast()));
            for (a, &wg) in acc.iter_mut().zip(&wg) {
                a[u] = _mm512_dpbf16_ps(a[u], wg, x);
            }
        }
    }
    for (g, a) in acc.iter().enumerate() {
        for (u, a) in a.iter().enumerate() {
            _mm512_storeu_ps(at(g, u), *a);
        }
    }
}

/// [`weigh_bf16_chunk`] over all of each of `H` heads' `n` floats: sixty-four
/// at a time, then sixteen, then the rest one by one in the same order.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn weigh_bf16_all<const H: usize>(w: *const bf16, stride: usize, pairs: usize, v: *const bf16, n: usize,
                                         o: *mut f32, fresh: bool) {
    let mut e = 0;
    while e + 64 <= n {
        weigh_bf16_chunk::<H, 4>(w, stride, pairs, v, n, o, e, fresh);
        e += 64;
    }
    while e + 16 <= n {
        weigh_bf16_chunk::<H, 1>(w, stride, pairs, v, n, o, e, fresh);
        e += 16;
    }
    for g in 0..H {
        for d in e..n {
            let out = &mut *o.add(g * n + d);
            if fresh {
                *out = 0.0;
            }
            for k in 0..pairs {
                let (w0, w1) = ((*w.add(g * stride + 2 * k)).to_f32(), (*w.add(g * stride + 2 * k + 1)).to_f32());
                let (v0, v1) = ((*v.add(2 * (k * n + d))).to_f32(), (*v.add(2 * (k * n + d) + 1)).to_f32());
                *out = w0.mul_add(v0, w1.mul_add(v1, *out));
            }
        }
    }
}

/// [`Lanes::pair_bf16_values`] thirty-two elements at a time: the two rows'
/// elements interleaved by one two-source permutation per output register.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn pair_bf16_values(first: Option<&[bf16]>, second: Option<&[bf16]>, out: &mut [bf16]) {
    let n = out.len() / 2;
    assert!(first.is_none_or(|r| r.len() >= n) && second.is_none_or(|r| r.len() >= n));
    let load = |row: Option<&[bf16]>, i: usize| row.map_or(_mm512_setzero_si512(), |r| _mm512_loadu_si512(r.as_ptr().add(i).cast()));
    // Output element 2d is the first row's d, 2d + 1 the second's (its index offset by 32).
    let lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8,
                              39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
    let hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
    let o = out.as_mut_ptr();
    let mut i = 0;
    while i + 32 <= n {
        let (a, b) = (load(first, i), load(second, i));
        _mm512_storeu_si512(o.add(2 * i).cast(), _mm512_permutex2var_epi16(a, lo, b));
        _mm512_storeu_si512(o.add(2 * i + 32).cast(), _mm512_permutex2var_epi16(a, hi, b));
        i += 32;
    }
    super::lanes::pair_bf16_values(first.map(|r| &r[i..]), second.map(|r| &r[i..]), &mut out[2 * i..]);
}

/// [`super::lanes::round_bf16_pairs`] sixteen at a time, the rounding in
/// integers (to nearest even; a subnormal to a zero of its sign), the pairs
/// swapped within each 128-bit lane.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn round_bf16_pairs(src: &[f32], dst: &mut [f32]) {
    assert!(src.len().is_multiple_of(2) && dst.len() >= src.len(), "whole pairs");
    let n = src.len();
    let (s, d) = (src.as_ptr(), dst.as_mut_ptr());
    let (half, exponent, sign) =
        (_mm512_set1_epi32(0x7fff), _mm512_set1_epi32(0x7f80_0000), _mm512_set1_epi32(i32::MIN));
    let mut i = 0;
    while i + 16 <= n {
        let x = _mm512_loadu_si512(s.add(i).cast());
        let odd = _mm512_and_si512(_mm512_srli_epi32::<16>(x), _mm512_set1_epi32(1));
        let rounded = _mm512_add_epi32(x, _mm512_add_epi32(half, odd));
        let rounded = _mm512_and_si512(rounded, _mm512_set1_epi32(-0x1_0000));
        let subnormal = _mm512_testn_epi32_mask(x, exponent);
        let rounded = _mm512_mask_and_epi32(rounded, subnormal, x, sign);
        _mm512_storeu_ps(d.add(i), _mm512_permute_ps::<0b10_11_00_01>(_mm512_castsi512_ps(rounded)));
        i += 16;
    }
    super::lanes::round_bf16_pairs(&src[i..], &mut dst[i..n]);
}

/// [`Lanes::scores8_bf16_n`]: per step of sixteen elements, the halves of
/// keys `r` and `r + 4` in one register, its 32-bit lanes split into the odd
/// elements (the high halves) and the even ones (the low halves, shifted
/// up), each met by the query's eight of them as [`super::lanes::bf16_lane_order`] lays
/// them out: the lanes and sums of [`scores8`] over keys laid out so.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn scores8_bf16_in_place<const N: usize>(q: [&[f32]; N], keys: &[&[bf16]; 8], out: [&mut [f32; 8]; N]) {
    let n = q[0].len();
    assert!(n.is_multiple_of(16) && q.iter().all(|q| q.len() == n) && keys.iter().all(|k| k.len() >= n));
    let kp = keys.map(|k| k.as_ptr());
    let high = _mm512_set1_epi32(0xffff0000u32 as i32);
    let both_halves = |p: *const f32| _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(_mm256_loadu_ps(p))));
    let mut acc = [[_mm512_setzero_ps(); 4]; N];
    let mut i = 0;
    while i < n {
        let odd_q = q.map(|q| both_halves(q.as_ptr().add(i)));
        let even_q = q.map(|q| both_halves(q.as_ptr().add(i + 8)));
        for r in 0..4 {
            let lo = _mm512_castsi256_si512(_mm256_loadu_si256(kp[r].add(i).cast()));
            let x = _mm512_inserti64x4::<1>(lo, _mm256_loadu_si256(kp[r + 4].add(i).cast()));
            let odd = _mm512_castsi512_ps(_mm512_and_si512(x, high));
            let even = _mm512_castsi512_ps(_mm512_slli_epi32::<16>(x));
            for ((a, oq), eq) in acc.iter_mut().zip(&odd_q).zip(&even_q) {
                a[r] = _mm512_fmadd_ps(*oq, odd, a[r]);
                a[r] = _mm512_fmadd_ps(*eq, even, a[r]);
            }
        }
        i += 16;
    }
    for (a, out) in acc.iter().zip(out) {
        _mm256_storeu_ps(out.as_mut_ptr(), reduce_pairs(a));
    }
}

impl<const BF16: bool> Lanes for Avx512<BF16> {
    const BF16_PAIRS: bool = BF16;
    const BF16_IN_PLACE: bool = true;
    #[inline(always)]
    unsafe fn scores8_bf16_n<const N: usize>(q: [&[f32]; N], keys: &[&[bf16]; 8], out: [&mut [f32; 8]; N]) {
        scores8_bf16_in_place(q, keys, out)
    }
    #[inline(always)]
    unsafe fn weigh_bf16_in_place<'r>(w: &[f32], stride: usize, heads: usize,
                                      v: impl Iterator<Item = &'r [bf16]> + Clone, o: &mut [f32]) {
        let n = o.len() / heads;
        in_groups(heads, 4, |g, count| {
            let (w, o) = (&w[g * stride..], &mut o[g * n..]);
            match count {
                1 => weigh_bf16_in_place::<1>(w, stride, v.clone(), o, n),
                2 => weigh_bf16_in_place::<2>(w, stride, v.clone(), o, n),
                3 => weigh_bf16_in_place::<3>(w, stride, v.clone(), o, n),
                _ => weigh_bf16_in_place::<4>(w, stride, v.clone(), o, n),
            }
        });
    }
    #[inline(always)]
    unsafe fn pair_bf16_values(first: Option<&[bf16]>, second: Option<&[bf16]>, out: &mut [bf16]) {
        pair_bf16_values(first, second, out)
    }
    #[inline(always)]
    unsafe fn round_bf16_pairs(src: &[f32], dst: &mut [f32]) {
        round_bf16_pairs(src, dst)
    }
    #[inline(always)]
    unsafe fn scores16_bf16_scaled(q: &[bf16], count: usize, n: usize, keys: &[bf16], valid: usize, scale: f32,
                                   dst: *mut f32, stride: usize) {
        assert!(BF16 && n.is_multiple_of(16) && count * n <= q.len() && keys.len() >= 16 * valid.div_ceil(16) * n);
        let (qp, kp) = (q.as_ptr().cast::<u8>(), keys.as_ptr().cast::<u8>());
        scores16_runs!(scores16_bf16_n, qp, count, n / 2, kp, valid, scale, dst, stride)
    }
    #[inline(always)]
    unsafe fn transpose_bf16_keys(keys: &[&[bf16]], blocks: usize, n: usize, out: &mut [bf16]) {
        transpose_bf16_keys(keys, blocks, n, out)
    }
    const F32_TRANSPOSED: bool = true;
    #[inline(always)]
    unsafe fn scores16_scaled(q: &[f32], count: usize, n: usize, keys: &[f32], valid: usize, scale: f32,
                              dst: *mut f32, stride: usize) {
        assert!(n.is_multiple_of(8) && count * n <= q.len() && keys.len() >= 16 * valid.div_ceil(16) * n);
        let (qp, kp) = (q.as_ptr().cast::<u8>(), keys.as_ptr().cast::<u8>());
        scores16_runs!(scores16_f32_n, qp, count, n, kp, valid, scale, dst, stride)
    }
    #[inline(always)]
    unsafe fn transpose_f32_keys(keys: &[&[f32]], blocks: usize, n: usize, out: &mut [f32]) {
        transpose_f32_keys(keys, blocks, n, out)
    }
    #[inline(always)]
    unsafe fn weigh_bf16_heads(w: &[bf16], stride: usize, heads: usize, v: &[bf16], o: &mut [f32], fresh: bool) {
        let n = o.len() / heads;
        let pairs = v.len() / (2 * n).max(1);
        assert!(BF16 && stride.is_multiple_of(2) && w.len() >= (heads - 1) * stride + 2 * pairs && v.len() >= 2 * pairs * n);
        in_groups(heads, 4, |g, count| {
            let (ws, os) = (w.as_ptr().add(g * stride), o.as_mut_ptr().add(g * n));
            match count {
                1 => weigh_bf16_all::<1>(ws, stride, pairs, v.as_ptr(), n, os, fresh),
                2 => weigh_bf16_all::<2>(ws, stride, pairs, v.as_ptr(), n, os, fresh),
                3 => weigh_bf16_all::<3>(ws, stride, pairs, v.as_ptr(), n, os, fresh),
                _ => weigh_bf16_all::<4>(ws, stride, pairs, v.as_ptr(), n, os, fresh),
            }
        });
    }
    #[inline(always)]
    unsafe fn scores8(q: &[f32], k: &[f32], out: &mut [f32; 8]) {
        scores8(q, k, out)
    }
    #[inline(always)]
    unsafe fn scores8_many(q: &[f32], at: &[usize], n: usize, k: &[f32], out: &mut [[f32; 8]]) {
        assert!(out.len() >= at.len() && at.iter().all(|&a| (a + 1) * n <= q.len()));
        let qp = q.as_ptr();
        scores8_queries(|i| qp.add(at[i] * n), at.len(), n, k, 1.0, out.as_mut_ptr().cast(), 8)
    }
    #[inline(always)]
    unsafe fn scores8_scaled(q: &[f32], count: usize, n: usize, k: &[f32], scale: f32, dst: *mut f32, stride: usize) {
        assert!(count * n <= q.len());
        let qp = q.as_ptr();
        scores8_queries(|i| qp.add(i * n), count, n, k, scale, dst, stride)
    }
    #[inline(always)]
    unsafe fn scores8_f16(q: &[f32], keys: &[&[f16]; 8], out: &mut [f32; 8]) {
        Avx2::scores8_f16(q, keys, out)
    }
    #[inline(always)]
    unsafe fn scores8_f16_n<const N: usize>(q: [&[f32]; N], keys: &[&[f16]; 8], out: [&mut [f32; 8]; N]) {
        scores8_f16_n(q, keys, out)
    }
    #[inline(always)]
    unsafe fn scores8_f16_groups(q: &[f32], heads: usize, hk: usize, groups: usize, rows: &[*const f16; 8], scale: f32,
                                 out: *mut f32, stride: usize, lo: usize, hi: usize) {
        match heads {
            1 => scores8_f16_groups::<1>(q, hk, groups, rows, scale, out, stride, lo, hi),
            2 => scores8_f16_groups::<2>(q, hk, groups, rows, scale, out, stride, lo, hi),
            3 => scores8_f16_groups::<3>(q, hk, groups, rows, scale, out, stride, lo, hi),
            4 => scores8_f16_groups::<4>(q, hk, groups, rows, scale, out, stride, lo, hi),
            _ => panic!("{heads} queries a head: the block's scores hold one to four"),
        }
    }
    #[inline(always)]
    unsafe fn scores8_q8_0(q: &[u8], keys: &[&[u8]; 8], dk: &[f32], out: &mut [f32; 8]) {
        scores8_q8_0(q, keys, dk, out)
    }
    #[inline(always)]
    unsafe fn scores16_q8_0_scaled(q: &Q8Queries, count: usize, keys: &[&[u8]; 16], scale: f32, dst: *mut f32,
                                   stride: usize) {
        scores16_q8_0_scaled(q, count, keys, scale, dst, stride)
    }
    #[inline(always)]
    unsafe fn narrow(src: &[f32], dst: &mut [f16]) {
        Avx2::narrow(src, dst)
    }
    #[inline(always)]
    unsafe fn widen(src: &[f16], dst: &mut [f32]) {
        Avx2::widen(src, dst)
    }
    #[inline(always)]
    unsafe fn widen_q8_0(src: &[u8], dst: &mut [f32]) {
        Avx2::widen_q8_0(src, dst)
    }
    #[inline(always)]
    unsafe fn widen_bf16(src: &[bf16], dst: &mut [f32]) {
        Avx2::widen_bf16(src, dst)
    }
    #[inline(always)]
    unsafe fn widen_bf16_lanes(src: &[bf16], dst: &mut [f32]) {
        Avx2::widen_bf16_lanes(src, dst)
    }
    #[inline(always)]
    unsafe fn max(row: &[f32]) -> f32 {
        max(row)
    }
    #[inline(always)]
    unsafe fn weigh(w: &[f32], v: &[f32], o: &mut [f32]) {
        let n = o.len();
        let rows = w.len().min(v.len() / n.max(1));
        weigh_all::<1>(w.as_ptr(), 0, rows, v.as_ptr(), n, o.as_mut_ptr())
    }
    #[inline(always)]
    unsafe fn weigh_f16<'r>(w: &[f32], v: impl Iterator<Item = &'r [f16]> + Clone, o: &mut [f32]) {
        Avx2::weigh_f16(w, v, o)
    }
    #[inline(always)]
    unsafe fn weigh_q8_0<'r>(w: &[f32], v: impl Iterator<Item = &'r [u8]> + Clone, o: &mut [f32]) {
        Avx2::weigh_q8_0(w, v, o)
    }
    #[inline(always)]
    unsafe fn weigh_f16_heads<'r>(w: &[f32], stride: usize, heads: usize, v: impl Iterator<Item = &'r [f16]> + Clone,
                                  o: &mut [f32]) {
        let n = o.len() / heads;
        in_groups(heads, 4, |g, count| {
            let (w, o) = (&w[g * stride..], &mut o[g * n..]);
            match count {
                1 => weigh_f16_heads::<1>(w, stride, v.clone(), o, n),
                2 => weigh_f16_heads::<2>(w, stride, v.clone(), o, n),
                3 => weigh_f16_heads::<3>(w, stride, v.clone(), o, n),
                _ => weigh_f16_heads::<4>(w, stride, v.clone(), o, n),
            }
        });
    }
    #[inline(always)]
    unsafe fn weigh_q8_0_heads<'r>(w: &[f32], stride: usize, heads: usize, v: impl Iterator<Item = &'r [u8]> + Clone,
                                   o: &mut [f32]) {
        let n = o.len() / heads;
        in_groups(heads, 3, |g, count| {
            let (w, o) = (&w[g * stride..], &mut o[g * n..]);
            match count {
                1 => weigh_q8_0_heads::<1>(w, stride, v.clone(), o, n),
                2 => weigh_q8_0_heads::<2>(w, stride, v.clone(), o, n),
                _ => weigh_q8_0_heads::<3>(w, stride, v.clone(), o, n),
            }
        });
    }
    #[inline(always)]
    unsafe fn weigh_heads(w: &[f32], stride: usize, heads: usize, v: &[f32], o: &mut [f32]) {
        let n = o.len() / heads;
        let rows = v.len() / n.max(1);
        assert!(w.len() >= (heads - 1) * stride + rows && v.len() >= rows * n);
        in_groups(heads, 6, |g, count| {
            let (ws, os) = (w.as_ptr().add(g * stride), o.as_mut_ptr().add(g * n));
            match count {
                1 => weigh_all::<1>(ws, stride, rows, v.as_ptr(), n, os),
                2 => weigh_all::<2>(ws, stride, rows, v.as_ptr(), n, os),
                3 => weigh_all::<3>(ws, stride, rows, v.as_ptr(), n, os),
                4 => weigh_all::<4>(ws, stride, rows, v.as_ptr(), n, os),
                5 => weigh_all::<5>(ws, stride, rows, v.as_ptr(), n, os),
                _ => weigh_all::<6>(ws, stride, rows, v.as_ptr(), n, os),
            }
        });
    }
}
