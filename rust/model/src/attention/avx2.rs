//! The element loops of attention in AVX2, FMA and F16C: the same
//! operations as the scalar twin (`super::lanes::Scalar`), rounding
//! identically, eight lanes at a time.

use half::{bf16, f16};

use super::lanes::{
    bf16_lane_order, gather_offsets, in_groups, scores16_q8_0_by_eights, Lanes, Q8Queries, MAX_KEY_BLOCKS,
};

/// Reachable only through `super::run_avx2`, after `super::level`.
pub(super) struct Avx2;

mod avx {
    use std::arch::x86_64::*;

    use half::{bf16, f16};

    use super::super::lanes::{Lanes, BF16_STEP};

    /// The f16 scale that starts the Q8_0 block at `blk`, widened into every
    /// lane by F16C (exactly, as `f16::to_f32` does in software).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn block_scale(blk: *const u8) -> __m256 {
        _mm256_cvtph_ps(_mm_set1_epi16(std::ptr::read_unaligned(blk.cast::<i16>())))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn narrow(src: &[f32], dst: &mut [f16]) {
        let n = src.len().min(dst.len());
        let (s, d) = (src.as_ptr(), dst.as_mut_ptr());
        let mut i = 0;
        while i + 8 <= n {
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(s.add(i)));
            _mm_storeu_si128(d.add(i).cast(), h);
            i += 8;
        }
        while i < n {
            *d.add(i) = f16::from_bits(_mm_extract_epi16::<0>(_mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm_set_ss(
                *s.add(i),
            ))) as u16);
            i += 1;
        }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn widen_bf16(src: &[bf16], dst: &mut [f32]) {
        let n = src.len().min(dst.len());
        let (s, d) = (src.as_ptr(), dst.as_mut_ptr());
        let mut i = 0;
        while i + 8 <= n {
            let x = _mm256_cvtepu16_epi32(_mm_loadu_si128(s.add(i).cast()));
            _mm256_storeu_ps(d.add(i), _mm256_castsi256_ps(_mm256_slli_epi32::<16>(x)));
            i += 8;
        }
        super::super::lanes::Scalar::widen_bf16(&src[i..n], &mut dst[i..n]);
    }

    /// [`super::bf16_lane_order`] a step at a time: the step's eight pairs
    /// as 32-bit lanes, whose high halves are the odd elements and whose
    /// low halves, shifted up, the even ones.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn widen_bf16_lanes(src: &[bf16], dst: &mut [f32]) {
        let steps = src.len() / BF16_STEP;
        assert!(dst.len() >= src.len().next_multiple_of(BF16_STEP));
        let (s, d) = (src.as_ptr(), dst.as_mut_ptr());
        let high = _mm256_set1_epi32(0xffff0000u32 as i32);
        for k in 0..steps {
            let x = _mm256_loadu_si256(s.add(BF16_STEP * k).cast());
            _mm256_storeu_si256(d.add(BF16_STEP * k).cast(), _mm256_and_si256(x, high));
            _mm256_storeu_si256(d.add(BF16_STEP * k + 8).cast(), _mm256_slli_epi32::<16>(x));
        }
        super::bf16_lane_order(&src[BF16_STEP * steps..], &mut dst[BF16_STEP * steps..]);
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn widen(src: &[f16], dst: &mut [f32]) {
        let n = src.len().min(dst.len());
        let (s, d) = (src.as_ptr(), dst.as_mut_ptr());
        let mut i = 0;
        while i + 8 <= n {
            _mm256_storeu_ps(d.add(i), _mm256_cvtph_ps(_mm_loadu_si128(s.add(i).cast())));
            i += 8;
        }
        while i < n {
            *d.add(i) = _mm_cvtss_f32(_mm_cvtph_ps(_mm_set1_epi16((*s.add(i)).to_bits() as i16)));
            i += 1;
        }
    }

    /// Per block: each key's quants made non-negative (`|k|`, and the
    /// query's quants given the key's sign) so that `maddubs` multiplies
    /// them in pairs (|k| <= 128 and |q| <= 127, as the quantizer writes a
    /// query, cannot saturate its 16 bits), `madd` against ones widening to
    /// eight 32-bit sums per key, and the eight keys' sums gathered into one
    /// register by horizontal adds: exact integer dots, whatever the order.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn scores8_q8_0(q: &[u8], keys: &[&[u8]; 8], dk: &[f32], out: &mut [f32; 8]) {
        use ember_kv::Q8_0_BYTES;
        let nb = q.len() / Q8_0_BYTES;
        assert!(dk.len() >= 8 * nb && keys.iter().all(|k| k.len() >= q.len()));
        let ones = _mm256_set1_epi16(1);
        let mut acc = _mm256_setzero_ps();
        for b in 0..nb {
            let qb = q.as_ptr().add(b * Q8_0_BYTES);
            let dq = _mm_cvtss_f32(_mm_cvtph_ps(_mm_set1_epi16(i16::from_le_bytes([*qb, *qb.add(1)]))));
            let qv = _mm256_loadu_si256(qb.add(2).cast());
            let dot = |i: usize| {
                let kv = _mm256_loadu_si256(keys[i].as_ptr().add(b * Q8_0_BYTES + 2).cast());
                _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(kv, kv), _mm256_sign_epi8(qv, kv)), ones)
            };
            let h01 = _mm256_hadd_epi32(dot(0), dot(1));
            let h23 = _mm256_hadd_epi32(dot(2), dot(3));
            let h45 = _mm256_hadd_epi32(dot(4), dot(5));
            let h67 = _mm256_hadd_epi32(dot(6), dot(7));
            let (h03, h47) = (_mm256_hadd_epi32(h01, h23), _mm256_hadd_epi32(h45, h67));
            // Each 128-bit half holds four keys' partial sums: low halves plus high halves.
            let sums = _mm256_add_epi32(_mm256_permute2x128_si256::<0x20>(h03, h47),
                                        _mm256_permute2x128_si256::<0x31>(h03, h47));
            let scale = _mm256_mul_ps(_mm256_set1_ps(dq), _mm256_loadu_ps(dk.as_ptr().add(8 * b)));
            acc = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(sums), acc);
        }
        _mm256_storeu_ps(out.as_mut_ptr(), acc);
    }

    /// [`Lanes::scores16_q8_0_scaled`](super::Lanes::scores16_q8_0_scaled)
    /// with each half of the keys transposed once for all the queries: per
    /// block, eight registers whose lane `i` holds four quants of key `i`,
    /// as magnitudes and as the signs the query's quants are given (as in
    /// [`scores8_q8_0`]), so that a query's four quants, broadcast, meet
    /// eight keys in one `maddubs` and `madd` and each key's exact dot ends
    /// in its own lane, with no lanes to sum; then each block is scaled and
    /// added by a fused multiply-add, block after block.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn scores16_q8_0_scaled(q: &super::Q8Queries, count: usize, keys: &[&[u8]; 16], scale: f32,
                                              dst: *mut f32, stride: usize) {
        use super::MAX_KEY_BLOCKS;
        use ember_kv::Q8_0_BYTES;
        use std::mem::MaybeUninit;
        let Some(offsets) = super::gather_offsets(keys) else {
            return super::scores16_q8_0_by_eights::<super::Avx2>(q.rows, count, keys, scale, dst, stride);
        };
        let (len, base) = (keys[0].len(), keys[0].as_ptr());
        let nb = len / Q8_0_BYTES;
        assert!(q.rows.len() >= count * len && q.scales.len() >= count * nb);
        for half in 0..2 {
            // Only the key's own blocks are written, and only they are read.
            let mut magnitudes = [MaybeUninit::<__m256i>::uninit(); 8 * MAX_KEY_BLOCKS];
            let mut signs = [MaybeUninit::<__m256i>::uninit(); 8 * MAX_KEY_BLOCKS];
            let mut dk = [MaybeUninit::<__m256>::uninit(); MAX_KEY_BLOCKS];
            let index = _mm256_loadu_si256(offsets[8 * half..].as_ptr().cast());
            for b in 0..nb {
                let at = b * Q8_0_BYTES;
                let scales: [u16; 8] =
                    std::array::from_fn(|i| u16::from_le_bytes([keys[8 * half + i][at], keys[8 * half + i][at + 1]]));
                dk[b].write(_mm256_cvtph_ps(_mm_loadu_si128(scales.as_ptr().cast())));
                for c in 0..8 {
                    // Quants 4c..4c + 4 of each key's block, one key to a lane.
                    let kv = _mm256_i32gather_epi32::<1>(base.add(at + 2 + 4 * c).cast(), index);
                    magnitudes[8 * b + c].write(_mm256_sign_epi8(kv, kv));
                    signs[8 * b + c].write(kv);
                }
            }
            let magnitudes = std::slice::from_raw_parts(magnitudes.as_ptr().cast::<__m256i>(), 8 * nb);
            let signs = std::slice::from_raw_parts(signs.as_ptr().cast::<__m256i>(), 8 * nb);
            let dk = std::slice::from_raw_parts(dk.as_ptr().cast::<__m256>(), nb);
            let keys = (magnitudes, signs, dk);
            let mut i = 0;
            while i < count {
                let query = |j: usize| {
                    let (at, blocks) = ((i + j) * len, (i + j) * nb);
                    (q.rows.as_ptr().add(at), q.scales.as_ptr().add(blocks), dst.add((i + j) * stride + 8 * half))
                };
                i += match count - i {
                    4.. => { q8_0_dots8::<4>(std::array::from_fn(query), keys, scale); 4 }
                    2 | 3 => { q8_0_dots8::<2>(std::array::from_fn(query), keys, scale); 2 }
                    _ => { q8_0_dots8::<1>([query(0)], keys, scale); 1 }
                };
            }
        }
    }

    /// [`scores16_q8_0_scaled`]'s arithmetic for `N` queries (each its Q8_0
    /// row, its block scales and where its eight scores go) and eight keys
    /// transposed (magnitudes, signs and block scales).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn q8_0_dots8<const N: usize>(queries: [(*const u8, *const f32, *mut f32); N],
                                         (magnitudes, signs, dk): (&[__m256i], &[__m256i], &[__m256]), scale: f32) {
        use ember_kv::Q8_0_BYTES;
        let ones = _mm256_set1_epi16(1);
        let mut s = [_mm256_setzero_ps(); N];
        for (b, &dk) in dk.iter().enumerate() {
            let mut dots = [_mm256_setzero_si256(); N];
            for c in 0..8 {
                let (m, k) = (magnitudes[8 * b + c], signs[8 * b + c]);
                for (dot, &(q, ..)) in dots.iter_mut().zip(&queries) {
                    let quants = _mm256_set1_epi32(std::ptr::read_unaligned(q.add(b * Q8_0_BYTES + 2 + 4 * c).cast::<i32>()));
                    *dot = _mm256_add_epi32(*dot, _mm256_madd_epi16(_mm256_maddubs_epi16(m, _mm256_sign_epi8(quants, k)), ones));
                }
            }
            for ((s, dot), &(_, dq, _)) in s.iter_mut().zip(&dots).zip(&queries) {
                *s = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(*dq.add(b)), dk), _mm256_cvtepi32_ps(*dot), *s);
            }
        }
        let scale = _mm256_set1_ps(scale);
        for (s, &(.., d)) in s.iter().zip(&queries) {
            _mm256_storeu_ps(d, _mm256_mul_ps(scale, *s));
        }
    }

    /// The output held in registers, 64 floats at a time (eight
    /// accumulators, then one for each eight left), while the rows go by;
    /// each row's elements widened as they are met.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn weigh_f16<'r>(w: &[f32], v: impl Iterator<Item = &'r [f16]> + Clone, o: &mut [f32]) {
        let n = o.len();
        let op = o.as_mut_ptr();
        let mut i = 0;
        while i + 64 <= n {
            let mut acc: [__m256; 8] = std::array::from_fn(|u| _mm256_loadu_ps(op.add(i + 8 * u)));
            for (&w, row) in w.iter().zip(v.clone()) {
                assert!(row.len() >= n);
                let (wb, row) = (_mm256_set1_ps(w), row.as_ptr().add(i));
                for (u, a) in acc.iter_mut().enumerate() {
                    *a = _mm256_fmadd_ps(wb, _mm256_cvtph_ps(_mm_loadu_si128(row.add(8 * u).cast())), *a);
                }
            }
            for (u, a) in acc.iter().enumerate() {
                _mm256_storeu_ps(op.add(i + 8 * u), *a);
            }
            i += 64;
        }
        while i + 8 <= n {
            let mut acc = _mm256_loadu_ps(op.add(i));
            for (&w, row) in w.iter().zip(v.clone()) {
                assert!(row.len() >= n);
                acc = _mm256_fmadd_ps(
                    _mm256_set1_ps(w),
                    _mm256_cvtph_ps(_mm_loadu_si128(row.as_ptr().add(i).cast())),
                    acc,
                );
            }
            _mm256_storeu_ps(op.add(i), acc);
            i += 8;
        }
        for e in i..n {
            let mut acc = *op.add(e);
            for (&w, row) in w.iter().zip(v.clone()) {
                acc = w.mul_add(row[e].to_f32(), acc);
            }
            *op.add(e) = acc;
        }
    }

    /// [`weigh_f16`] over rows of Q8_0 blocks: 32 floats of output (one
    /// block) in registers at a time, each quant times its block's scale
    /// (exact) as it is met.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn weigh_q8_0<'r>(w: &[f32], v: impl Iterator<Item = &'r [u8]> + Clone, o: &mut [f32]) {
        use ember_kv::{Q8_0_BLOCK, Q8_0_BYTES};
        assert!(o.len().is_multiple_of(Q8_0_BLOCK));
        let op = o.as_mut_ptr();
        for b in 0..o.len() / Q8_0_BLOCK {
            let mut acc: [__m256; 4] = std::array::from_fn(|u| _mm256_loadu_ps(op.add(Q8_0_BLOCK * b + 8 * u)));
            for (&w, row) in w.iter().zip(v.clone()) {
                assert!(row.len() >= (b + 1) * Q8_0_BYTES);
                let blk = row.as_ptr().add(b * Q8_0_BYTES);
                let d = block_scale(blk);
                let wb = _mm256_set1_ps(w);
                for (u, a) in acc.iter_mut().enumerate() {
                    let q = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(blk.add(2 + 8 * u).cast())));
                    *a = _mm256_fmadd_ps(wb, _mm256_mul_ps(d, q), *a);
                }
            }
            for (u, a) in acc.iter().enumerate() {
                _mm256_storeu_ps(op.add(Q8_0_BLOCK * b + 8 * u), *a);
            }
        }
    }

    /// [`weigh_q8_0`] for up to three heads over the same rows (head `g`'s
    /// weights at `w[g * stride..]`, its output `o[g * n..][..n]`): a row's
    /// block is widened once and met by every head's weight, the heads'
    /// outputs for the block (twelve registers) held while the rows go by.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn weigh_q8_0_heads<'r, const H: usize>(w: &[f32], stride: usize, v: impl Iterator<Item = &'r [u8]> + Clone,
                                                             o: &mut [f32], n: usize) {
        use ember_kv::{Q8_0_BLOCK, Q8_0_BYTES};
        assert!(n.is_multiple_of(Q8_0_BLOCK) && o.len() >= H * n);
        let (op, wp) = (o.as_mut_ptr(), w.as_ptr());
        for b in 0..n / Q8_0_BLOCK {
            let at = |g: usize, u: usize| op.add(g * n + Q8_0_BLOCK * b + 8 * u);
            let mut acc: [[__m256; 4]; H] = std::array::from_fn(|g| std::array::from_fn(|u| _mm256_loadu_ps(at(g, u))));
            for (i, row) in v.clone().enumerate() {
                // Each head's weight of this row is read through the pointer below.
                assert!(row.len() >= (b + 1) * Q8_0_BYTES && (H - 1) * stride + i < w.len());
                let blk = row.as_ptr().add(b * Q8_0_BYTES);
                let d = block_scale(blk);
                for u in 0..4 {
                    let q = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(blk.add(2 + 8 * u).cast()))));
                    for (g, a) in acc.iter_mut().enumerate() {
                        a[u] = _mm256_fmadd_ps(_mm256_set1_ps(*wp.add(g * stride + i)), q, a[u]);
                    }
                }
            }
            for (g, a) in acc.iter().enumerate() {
                for (u, a) in a.iter().enumerate() {
                    _mm256_storeu_ps(at(g, u), *a);
                }
            }
        }
    }

    /// [`weigh_f16`] for up to three heads over the same rows, laid out as in
    /// [`weigh_q8_0_heads`]: 32 floats of each head's output in registers,
    /// each row's elements widened once for every head.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn weigh_f16_heads<'r, const H: usize>(w: &[f32], stride: usize, v: impl Iterator<Item = &'r [f16]> + Clone,
                                                            o: &mut [f32], n: usize) {
        assert!(n.is_multiple_of(8) && o.len() >= H * n);
        let (op, wp) = (o.as_mut_ptr(), w.as_ptr());
        let mut e = 0;
        while e < n {
            let width = (n - e).min(32) / 8;
            let at = |g: usize, u: usize| op.add(g * n + e + 8 * u);
            let mut acc: [[__m256; 4]; H] =
                std::array::from_fn(|g| std::array::from_fn(|u| if u < width { _mm256_loadu_ps(at(g, u)) } else { _mm256_setzero_ps() }));
            for (i, row) in v.clone().enumerate() {
                assert!(row.len() >= n && (H - 1) * stride + i < w.len());
                let r = row.as_ptr().add(e);
                for u in 0..width {
                    let x = _mm256_cvtph_ps(_mm_loadu_si128(r.add(8 * u).cast()));
                    for (g, a) in acc.iter_mut().enumerate() {
                        a[u] = _mm256_fmadd_ps(_mm256_set1_ps(*wp.add(g * stride + i)), x, a[u]);
                    }
                }
            }
            for (g, a) in acc.iter().enumerate() {
                for (u, a) in a.iter().enumerate().take(width) {
                    _mm256_storeu_ps(at(g, u), *a);
                }
            }
            e += 8 * width;
        }
    }

    /// Eight quants at a time, widened and multiplied by the block's scale.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn widen_q8_0(src: &[u8], dst: &mut [f32]) {
        use ember_kv::{Q8_0_BLOCK, Q8_0_BYTES};
        assert!(src.len() / Q8_0_BYTES * Q8_0_BLOCK >= dst.len() && dst.len().is_multiple_of(Q8_0_BLOCK));
        for (b, out) in dst.chunks_exact_mut(Q8_0_BLOCK).enumerate() {
            let blk = src.as_ptr().add(b * Q8_0_BYTES);
            let d = block_scale(blk);
            for i in 0..4 {
                let q = _mm256_cvtepi8_epi32(_mm_loadl_epi64(blk.add(2 + 8 * i).cast()));
                _mm256_storeu_ps(out.as_mut_ptr().add(8 * i), _mm256_mul_ps(d, _mm256_cvtepi32_ps(q)));
            }
        }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn max(row: &[f32]) -> f32 {
        let (n, r) = (row.len(), row.as_ptr());
        let mut m = _mm256_set1_ps(f32::NEG_INFINITY);
        let mut i = 0;
        while i + 8 <= n {
            m = _mm256_max_ps(m, _mm256_loadu_ps(r.add(i)));
            i += 8;
        }
        let mut lanes = [0.0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), m);
        let mut out = lanes.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        while i < n {
            out = out.max(*r.add(i));
            i += 1;
        }
        out
    }

    /// Eight dots of one query with eight keys: one accumulator per key, the
    /// query loaded once per eight elements and met by every key, then the
    /// eight accumulators reduced by pairwise horizontal adds into one vector
    /// (the lane order of the module's doc).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn scores8(q: &[f32], k: &[f32], out: &mut [f32; 8]) {
        let n = q.len();
        assert!(n.is_multiple_of(8) && k.len() >= 8 * n);
        let (qp, kp) = (q.as_ptr(), k.as_ptr());
        let mut acc = [_mm256_setzero_ps(); 8];
        let mut i = 0;
        while i < n {
            let qv = _mm256_loadu_ps(qp.add(i));
            for (r, acc) in acc.iter_mut().enumerate() {
                *acc = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kp.add(r * n + i)), *acc);
            }
            i += 8;
        }
        reduce8(&acc, out)
    }

    /// As [`scores8`], the keys f16 rows read in place.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn scores8_f16(q: &[f32], keys: &[&[f16]; 8], out: &mut [f32; 8]) {
        let n = q.len();
        assert!(n.is_multiple_of(8) && keys.iter().all(|k| k.len() >= n));
        let qp = q.as_ptr();
        let kp = keys.map(|k| k.as_ptr());
        let mut acc = [_mm256_setzero_ps(); 8];
        let mut i = 0;
        while i < n {
            let qv = _mm256_loadu_ps(qp.add(i));
            for (acc, k) in acc.iter_mut().zip(&kp) {
                *acc = _mm256_fmadd_ps(qv, _mm256_cvtph_ps(_mm_loadu_si128(k.add(i).cast())), *acc);
            }
            i += 8;
        }
        reduce8(&acc, out)
    }

    /// The eight accumulators' sums, by pairwise horizontal adds.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn reduce8(acc: &[__m256; 8], out: &mut [f32; 8]) {
        // hadd(a, b) = [a0+a1, a2+a3, b0+b1, b2+b3 | a4+a5, a6+a7, b4+b5, b6+b7]
        let h01 = _mm256_hadd_ps(acc[0], acc[1]);
        let h23 = _mm256_hadd_ps(acc[2], acc[3]);
        let h45 = _mm256_hadd_ps(acc[4], acc[5]);
        let h67 = _mm256_hadd_ps(acc[6], acc[7]);
        // Per key r < 4: lane r holds (l0+l1)+(l2+l3), lane r + 4 (l4+l5)+(l6+l7).
        let lo4 = _mm256_hadd_ps(h01, h23);
        let hi4 = _mm256_hadd_ps(h45, h67);
        let firsts = _mm256_permute2f128_ps::<0x20>(lo4, hi4);
        let seconds = _mm256_permute2f128_ps::<0x31>(lo4, hi4);
        _mm256_storeu_ps(out.as_mut_ptr(), _mm256_add_ps(firsts, seconds));
    }

    /// `H` heads' outputs over the same value rows, sixteen floats of each
    /// held in registers across all the rows: a value row is loaded once for
    /// the `H` heads (one head alone waits on its four accumulators' chains
    /// and loads a value for every multiply-add). Each output element is the
    /// same chain of fused multiply-adds, in row order, as in [`weigh`].
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn weigh_heads<const H: usize>(
        w: *const f32,
        stride: usize,
        rows: usize,
        v: *const f32,
        n: usize,
        o: *mut f32,
    ) {
        let mut i = 0;
        while i + 16 <= n {
            let mut acc = [[_mm256_setzero_ps(); 2]; H];
            for (g, a) in acc.iter_mut().enumerate() {
                *a = [_mm256_loadu_ps(o.add(g * n + i)), _mm256_loadu_ps(o.add(g * n + i + 8))];
            }
            for r in 0..rows {
                let row = v.add(r * n + i);
                let (v0, v1) = (_mm256_loadu_ps(row), _mm256_loadu_ps(row.add(8)));
                for (g, a) in acc.iter_mut().enumerate() {
                    let wg = _mm256_set1_ps(*w.add(g * stride + r));
                    a[0] = _mm256_fmadd_ps(wg, v0, a[0]);
                    a[1] = _mm256_fmadd_ps(wg, v1, a[1]);
                }
            }
            for (g, a) in acc.iter().enumerate() {
                _mm256_storeu_ps(o.add(g * n + i), a[0]);
                _mm256_storeu_ps(o.add(g * n + i + 8), a[1]);
            }
            i += 16;
        }
        while i < n {
            for g in 0..H {
                let mut acc = *o.add(g * n + i);
                for r in 0..rows {
                    acc = (*w.add(g * stride + r)).mul_add(*v.add(r * n + i), acc);
                }
                *o.add(g * n + i) = acc;
            }
            i += 1;
        }
    }

    /// Four output vectors held in registers across all the rows, then eight, then single floats.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn weigh(w: &[f32], v: &[f32], o: &mut [f32]) {
        let n = o.len();
        let rows = w.len().min(v.len() / n.max(1));
        let (v, o) = (v.as_ptr(), o.as_mut_ptr());
        let mut i = 0;
        while i + 32 <= n {
            let mut acc = [
                _mm256_loadu_ps(o.add(i)),
                _mm256_loadu_ps(o.add(i + 8)),
                _mm256_loadu_ps(o.add(i + 16)),
                _mm256_loadu_ps(o.add(i + 24)),
            ];
            for (r, &w) in w[..rows].iter().enumerate() {
                let (vw, row) = (_mm256_set1_ps(w), v.add(r * n + i));
                for (u, acc) in acc.iter_mut().enumerate() {
                    *acc = _mm256_fmadd_ps(vw, _mm256_loadu_ps(row.add(8 * u)), *acc);
                }
            }
            for (u, acc) in acc.iter().enumerate() {
                _mm256_storeu_ps(o.add(i + 8 * u), *acc);
            }
            i += 32;
        }
        while i + 8 <= n {
            let mut acc = _mm256_loadu_ps(o.add(i));
            for (r, &w) in w[..rows].iter().enumerate() {
                acc = _mm256_fmadd_ps(_mm256_set1_ps(w), _mm256_loadu_ps(v.add(r * n + i)), acc);
            }
            _mm256_storeu_ps(o.add(i), acc);
            i += 8;
        }
        while i < n {
            let mut acc = *o.add(i);
            for (r, &w) in w[..rows].iter().enumerate() {
                acc = w.mul_add(*v.add(r * n + i), acc);
            }
            *o.add(i) = acc;
            i += 1;
        }
    }
}

impl Lanes for Avx2 {
    #[inline(always)]
    unsafe fn scores8_q8_0(q: &[u8], keys: &[&[u8]; 8], dk: &[f32], out: &mut [f32; 8]) {
        avx::scores8_q8_0(q, keys, dk, out)
    }
    #[inline(always)]
    unsafe fn scores16_q8_0_scaled(q: &Q8Queries, count: usize, keys: &[&[u8]; 16], scale: f32, dst: *mut f32,
                                   stride: usize) {
        avx::scores16_q8_0_scaled(q, count, keys, scale, dst, stride)
    }
    #[inline(always)]
    unsafe fn scores8(q: &[f32], k: &[f32], out: &mut [f32; 8]) {
        avx::scores8(q, k, out)
    }
    #[inline(always)]
    unsafe fn scores8_f16(q: &[f32], keys: &[&[f16]; 8], out: &mut [f32; 8]) {
        avx::scores8_f16(q, keys, out)
    }
    #[inline(always)]
    unsafe fn narrow(src: &[f32], dst: &mut [f16]) {
        avx::narrow(src, dst)
    }
    #[inline(always)]
    unsafe fn widen(src: &[f16], dst: &mut [f32]) {
        avx::widen(src, dst)
    }
    #[inline(always)]
    unsafe fn widen_bf16(src: &[bf16], dst: &mut [f32]) {
        avx::widen_bf16(src, dst)
    }
    #[inline(always)]
    unsafe fn widen_bf16_lanes(src: &[bf16], dst: &mut [f32]) {
        avx::widen_bf16_lanes(src, dst)
    }
    #[inline(always)]
    unsafe fn widen_q8_0(src: &[u8], dst: &mut [f32]) {
        avx::widen_q8_0(src, dst)
    }
    #[inline(always)]
    unsafe fn weigh_q8_0<'r>(w: &[f32], v: impl Iterator<Item = &'r [u8]> + Clone, o: &mut [f32]) {
        avx::weigh_q8_0(w, v, o)
    }
    #[inline(always)]
    unsafe fn weigh_f16_heads<'r>(w: &[f32], stride: usize, heads: usize, v: impl Iterator<Item = &'r [f16]> + Clone,
                                  o: &mut [f32]) {
        let n = o.len() / heads;
        if !n.is_multiple_of(8) {
            for (g, o) in o.chunks_exact_mut(n).enumerate() {
                avx::weigh_f16(&w[g * stride..], v.clone(), o);
            }
            return;
        }
        in_groups(heads, 3, |g, count| {
            let (w, o) = (&w[g * stride..], &mut o[g * n..]);
            match count {
                1 => avx::weigh_f16_heads::<1>(w, stride, v.clone(), o, n),
                2 => avx::weigh_f16_heads::<2>(w, stride, v.clone(), o, n),
                _ => avx::weigh_f16_heads::<3>(w, stride, v.clone(), o, n),
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
                1 => avx::weigh_q8_0_heads::<1>(w, stride, v.clone(), o, n),
                2 => avx::weigh_q8_0_heads::<2>(w, stride, v.clone(), o, n),
                _ => avx::weigh_q8_0_heads::<3>(w, stride, v.clone(), o, n),
            }
        });
    }
    #[inline(always)]
    unsafe fn weigh_f16<'r>(w: &[f32], v: impl Iterator<Item = &'r [f16]> + Clone, o: &mut [f32]) {
        avx::weigh_f16(w, v, o)
    }
    #[inline(always)]
    unsafe fn max(row: &[f32]) -> f32 {
        avx::max(row)
    }
    #[inline(always)]
    unsafe fn weigh(w: &[f32], v: &[f32], o: &mut [f32]) {
        avx::weigh(w, v, o)
    }
    #[inline(always)]
    unsafe fn weigh_heads(w: &[f32], stride: usize, heads: usize, v: &[f32], o: &mut [f32]) {
        let n = o.len() / heads;
        let rows = v.len() / n.max(1);
        assert!(w.len() >= (heads - 1) * stride + rows && v.len() >= rows * n);
        // Four heads at most per sweep: two outputs vectors each fill eight accumulators.
        in_groups(heads, 4, |g, count| {
            let (ws, os) = (w.as_ptr().add(g * stride), o.as_mut_ptr().add(g * n));
            match count {
                1 => avx::weigh(&w[g * stride..][..rows], v, &mut o[g * n..][..n]),
                2 => avx::weigh_heads::<2>(ws, stride, rows, v.as_ptr(), n, os),
                3 => avx::weigh_heads::<3>(ws, stride, rows, v.as_ptr(), n, os),
                _ => avx::weigh_heads::<4>(ws, stride, rows, v.as_ptr(), n, os),
            }
        });
    }
}
