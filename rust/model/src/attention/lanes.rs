//! The element loops attention is written over ([`Lanes`]), and their
//! scalar form ([`Scalar`]): the definition the vector forms round as.

use ember_kv::{to_bf16, Rows, Q8_0_BLOCK, Q8_0_BYTES};
use half::{bf16, f16};

/// Queries quantized to Q8_0 (as long as a key each, query `i` at
/// `rows[i * len..]`), with what the byte-dot forms read beside the rows:
/// per query and block (`i * blocks + b`) the sum of its quants, which takes
/// their offset back out, and its scale, widened.
pub(super) struct Q8Queries<'a> {
    pub rows: &'a [u8],
    pub sums: &'a [i32],
    pub scales: &'a [f32],
}

/// Element loops with a scalar form and AVX2/F16C and AVX-512 forms that round identically.
pub(super) trait Lanes {
    /// The dots of a query `q` with eight keys `k` (rows of `q.len()`, a
    /// multiple of eight), in the lane order of the module's doc.
    unsafe fn scores8(q: &[f32], k: &[f32], out: &mut [f32; 8]);
    /// [`Lanes::scores8`] of several queries with the same keys (rows of
    /// `n` floats): query `i` is the row of `q` at `at[i] * n`, and its
    /// dots go to `out[i]`.
    unsafe fn scores8_many(q: &[f32], at: &[usize], n: usize, k: &[f32], out: &mut [[f32; 8]]) {
        for (&a, out) in at.iter().zip(out) {
            Self::scores8(&q[a * n..][..n], k, out);
        }
    }
    /// [`Lanes::scores8_many`] of queries `0..count`, each query's eight
    /// dots times `scale` (one rounding, as `store_scaled`) written at
    /// `dst + i * stride`.
    unsafe fn scores8_scaled(q: &[f32], count: usize, n: usize, k: &[f32], scale: f32, dst: *mut f32, stride: usize) {
        let mut s8 = [[0.0f32; 8]; 2];
        let mut i = 0;
        while i < count {
            let m = (count - i).min(2);
            Self::scores8_many(q, &[i, i + 1][..m], n, k, &mut s8[..m]);
            for (j, s8) in s8[..m].iter().enumerate() {
                for (e, &x) in s8.iter().enumerate() {
                    *dst.add((i + j) * stride + e) = scale * x;
                }
            }
            i += m;
        }
    }
    /// The same with eight f16 key rows read in place (each `q.len()` long).
    unsafe fn scores8_f16(q: &[f32], keys: &[&[f16]; 8], out: &mut [f32; 8]);
    /// [`Lanes::scores8_f16`] of `N` queries with the same keys.
    unsafe fn scores8_f16_n<const N: usize>(q: [&[f32]; N], keys: &[&[f16]; 8], out: [&mut [f32; 8]; N]) {
        for (q, out) in q.into_iter().zip(out) {
            Self::scores8_f16(q, keys, out);
        }
    }
    /// The scores of a block of eight whole f16 cache rows (`rows[r]` row
    /// r's first key head, `groups` heads of `hk` elements one after the
    /// other) for each head's `heads` queries (rows of `hk` floats, head `g`'s
    /// from `g * heads` on): each dot as [`Lanes::scores8_f16_n`] takes it,
    /// times `scale` (one rounding, as `store_scaled`), lanes `lo..hi` of
    /// query `i`'s stored at `out + i * stride + lane`.
    ///
    /// # Safety
    /// Each `rows[r]` starts `groups * hk` elements of one allocation, and
    /// each query's lanes `lo..hi` lie inside the allocation `out` is in.
    #[allow(clippy::too_many_arguments)]
    unsafe fn scores8_f16_groups(q: &[f32], heads: usize, hk: usize, groups: usize, rows: &[*const f16; 8], scale: f32,
                                 out: *mut f32, stride: usize, lo: usize, hi: usize)
    where
        Self: Sized,
    {
        assert!((1..=4).contains(&heads) && lo < hi && hi <= 8, "one to four queries a head, lanes of eight");
        for g in 0..groups {
            let keys: [&[f16]; 8] = std::array::from_fn(|r| std::slice::from_raw_parts(rows[r].add(g * hk), hk));
            let s8 = super::scores_in_place::<Self>(heads, |h| &q[(g * heads + h) * hk..][..hk], &keys);
            for (h, s8) in s8[..heads].iter().enumerate() {
                for (lane, &x) in s8.iter().enumerate().take(hi).skip(lo) {
                    *out.add((g * heads + h) * stride + lane) = scale * x;
                }
            }
        }
    }
    /// The dots of a Q8_0 query `q` (blocks of an f16 scale and 32 quants)
    /// with eight Q8_0 key rows read in place, the keys' block scales given
    /// widened (block `b` of key `i` at `dk[8 * b + i]`): per block the exact
    /// integer dot of the quants, scaled by `dq * dk` (one rounding) and
    /// added by a fused multiply-add, the blocks in order.
    unsafe fn scores8_q8_0(q: &[u8], keys: &[&[u8]; 8], dk: &[f32], out: &mut [f32; 8]);
    /// [`Lanes::scores8_q8_0`] of the queries `0..count` of `q` with sixteen
    /// Q8_0 key rows, each query's sixteen dots times `scale` (one rounding,
    /// as `store_scaled`) written at `dst + i * stride`.
    unsafe fn scores16_q8_0_scaled(q: &Q8Queries, count: usize, keys: &[&[u8]; 16], scale: f32, dst: *mut f32,
                                   stride: usize) {
        scores16_q8_0_by_eights::<Self>(q.rows, count, keys, scale, dst, stride)
    }
    /// f32 to f16, rounding to nearest even (as `f16::from_f32`).
    unsafe fn narrow(src: &[f32], dst: &mut [f16]);
    /// f16 to f32 (exact).
    unsafe fn widen(src: &[f16], dst: &mut [f32]);
    /// Q8_0 blocks to f32: each quant times its block's scale (exact).
    unsafe fn widen_q8_0(src: &[u8], dst: &mut [f32]);
    /// Whether a bf16 cache's full blocks are met by AVX-512 BF16's paired
    /// products ([`Lanes::scores16_bf16_scaled`], [`Lanes::weigh_bf16_heads`])
    /// rather than by the f32 loops over rows in [`bf16_lane_order`] and
    /// weights in [`bf16_pair_order`], which round the same.
    const BF16_PAIRS: bool = false;
    /// [`Lanes::scores8_scaled`] for a bf16 cache with the operands as
    /// stored: queries `0..count` bf16 rows of `n` (a multiple of 16), the
    /// `valid` keys (at most 32) laid out by [`transpose_bf16_keys`] in
    /// whole blocks of sixteen; each query's `valid` dots times `scale`
    /// written at `dst + i * stride`.
    #[allow(clippy::too_many_arguments)]
    unsafe fn scores16_bf16_scaled(_q: &[bf16], _count: usize, _n: usize, _keys: &[bf16], _valid: usize, _scale: f32,
                                   _dst: *mut f32, _stride: usize) {
        unreachable!("only the loops with BF16_PAIRS take bf16 operands")
    }
    /// [`transpose_bf16_keys`], as each level writes it.
    unsafe fn transpose_bf16_keys(keys: &[&[bf16]], blocks: usize, n: usize, out: &mut [bf16]) {
        transpose_bf16_keys(keys, blocks, n, out)
    }
    /// Whether widened keys that every query of an item sees are met sixteen
    /// to a register ([`Lanes::scores16_scaled`]) rather than eight at a time.
    const F32_TRANSPOSED: bool = false;
    /// [`Lanes::scores8_scaled`] with sixteen keys to a register: `valid`
    /// widened keys (at most 32) laid out by [`transpose_f32_keys`] in whole
    /// blocks of sixteen; each query's `valid` dots times `scale` written at
    /// `dst + i * stride`, the same lanes and sums.
    #[allow(clippy::too_many_arguments)]
    unsafe fn scores16_scaled(_q: &[f32], _count: usize, _n: usize, _keys: &[f32], _valid: usize, _scale: f32,
                              _dst: *mut f32, _stride: usize) {
        unreachable!("only the loops with F32_TRANSPOSED lay widened keys out sixteen to a register")
    }
    /// [`transpose_f32_keys`], as each level writes it.
    unsafe fn transpose_f32_keys(keys: &[&[f32]], blocks: usize, n: usize, out: &mut [f32]) {
        transpose_f32_keys(keys, blocks, n, out)
    }
    /// [`Lanes::weigh_heads`] for bf16 values with the operands as stored:
    /// head `g`'s weights the bf16s at `w[g * stride..]` (an even count of
    /// positions from an even one), the value rows interleaved in pairs by
    /// [`pair_bf16_values`]; per pair of positions the second's product is
    /// added, then the first's, as [`bf16_pair_order`] has it. `fresh`: the
    /// sums start from zero, whatever `o` held.
    unsafe fn weigh_bf16_heads(_w: &[bf16], _stride: usize, _heads: usize, _v: &[bf16], _o: &mut [f32], _fresh: bool) {
        unreachable!("only the loops with BF16_PAIRS take bf16 operands")
    }
    /// bf16 to f32 (exact).
    unsafe fn widen_bf16(src: &[bf16], dst: &mut [f32]) {
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = s.to_f32();
        }
    }
    /// Whether [`Lanes::scores8_bf16_n`] and [`Lanes::weigh_bf16_in_place`]
    /// read a bf16 cache's rows in place (a decoded token's few queries),
    /// rather than widened into a buffer first.
    const BF16_IN_PLACE: bool = false;
    /// [`Lanes::scores8`] of `N` queries (f32 rows in [`bf16_lane_order`], a
    /// whole number of steps long) with eight bf16 keys read in place: the
    /// keys widened in that order, met as widened keys are.
    unsafe fn scores8_bf16_n<const N: usize>(_q: [&[f32]; N], _keys: &[&[bf16]; 8], _out: [&mut [f32; 8]; N]) {
        unreachable!("only the loops with BF16_IN_PLACE read bf16 keys in place")
    }
    /// [`Lanes::weigh_heads`] over bf16 value rows read in place (each
    /// widened exactly), in the order given.
    unsafe fn weigh_bf16_in_place<'r>(w: &[f32], stride: usize, heads: usize,
                                      v: impl Iterator<Item = &'r [bf16]> + Clone, o: &mut [f32]) {
        let n = o.len() / heads;
        for (g, o) in o.chunks_exact_mut(n).enumerate() {
            for (&w, row) in w[g * stride..].iter().zip(v.clone()) {
                for (o, x) in o.iter_mut().zip(row) {
                    *o = w.mul_add(x.to_f32(), *o);
                }
            }
        }
    }
    /// [`bf16_lane_order`].
    unsafe fn widen_bf16_lanes(src: &[bf16], dst: &mut [f32]) {
        bf16_lane_order(src, dst)
    }
    /// [`pair_bf16_values`].
    unsafe fn pair_bf16_values(first: Option<&[bf16]>, second: Option<&[bf16]>, out: &mut [bf16]) {
        pair_bf16_values(first, second, out)
    }
    /// [`round_bf16_pairs`].
    unsafe fn round_bf16_pairs(src: &[f32], dst: &mut [f32]) {
        round_bf16_pairs(src, dst)
    }
    /// The largest element (-inf for none; the scores are never NaN). Exact,
    /// so any order gives it.
    unsafe fn max(row: &[f32]) -> f32 {
        row.iter().fold(f32::NEG_INFINITY, |m, &e| m.max(e))
    }
    /// `o = fma(w[i], v[i], o)` for the rows `v[i]` (of `o.len()` floats) in order.
    unsafe fn weigh(w: &[f32], v: &[f32], o: &mut [f32]);
    /// [`Lanes::weigh`] over f16 rows read in place (each widened exactly).
    unsafe fn weigh_f16<'r>(w: &[f32], v: impl Iterator<Item = &'r [f16]> + Clone, o: &mut [f32]);
    /// The same over rows of Q8_0 blocks (each quant times its scale, exact).
    unsafe fn weigh_q8_0<'r>(w: &[f32], v: impl Iterator<Item = &'r [u8]> + Clone, o: &mut [f32]) {
        for (&w, r) in w.iter().zip(v) {
            for (ob, blk) in o.chunks_exact_mut(Q8_0_BLOCK).zip(r.chunks_exact(Q8_0_BYTES)) {
                let d = f16::from_le_bytes([blk[0], blk[1]]).to_f32();
                for (o, &q) in ob.iter_mut().zip(&blk[2..]) {
                    *o = w.mul_add(d * q as i8 as f32, *o);
                }
            }
        }
    }
    /// [`Lanes::weigh_f16`] for `heads` heads over the same rows, laid out
    /// as in [`Lanes::weigh_heads`]: each row is read (and widened) once for
    /// all the heads that share it.
    unsafe fn weigh_f16_heads<'r>(w: &[f32], stride: usize, heads: usize, v: impl Iterator<Item = &'r [f16]> + Clone,
                                  o: &mut [f32]) {
        let n = o.len() / heads;
        for (g, o) in o.chunks_exact_mut(n).enumerate() {
            Self::weigh_f16(&w[g * stride..], v.clone(), o);
        }
    }
    /// The same over rows of Q8_0 blocks.
    unsafe fn weigh_q8_0_heads<'r>(w: &[f32], stride: usize, heads: usize, v: impl Iterator<Item = &'r [u8]> + Clone,
                                   o: &mut [f32]) {
        let n = o.len() / heads;
        for (g, o) in o.chunks_exact_mut(n).enumerate() {
            Self::weigh_q8_0(&w[g * stride..], v.clone(), o);
        }
    }
    /// [`Lanes::weigh`] for `heads` heads over the same value rows: head
    /// `g`'s weights at `w[g * stride..]`, its output the `g`-th of the
    /// `heads` equal parts of `o`.
    unsafe fn weigh_heads(w: &[f32], stride: usize, heads: usize, v: &[f32], o: &mut [f32]) {
        let (n, rows) = (o.len() / heads, v.len() / (o.len() / heads).max(1));
        for (g, o) in o.chunks_exact_mut(n).enumerate() {
            Self::weigh(&w[g * stride..][..rows], v, o);
        }
    }
}

pub(super) struct Scalar;

impl Lanes for Scalar {
    #[inline(always)]
    unsafe fn scores8(q: &[f32], k: &[f32], out: &mut [f32; 8]) {
        for (o, key) in out.iter_mut().zip(k.chunks_exact(q.len())) {
            *o = dot8(q, key);
        }
    }
    #[inline(always)]
    unsafe fn scores8_f16(q: &[f32], keys: &[&[f16]; 8], out: &mut [f32; 8]) {
        for (o, key) in out.iter_mut().zip(keys) {
            *o = dot8_by(q, |i| key[i].to_f32());
        }
    }
    #[inline(always)]
    unsafe fn scores8_q8_0(q: &[u8], keys: &[&[u8]; 8], dk: &[f32], out: &mut [f32; 8]) {
        for (i, (o, key)) in out.iter_mut().zip(keys).enumerate() {
            let mut acc = 0.0f32;
            for (b, (qb, kb)) in q.chunks_exact(Q8_0_BYTES).zip(key.chunks_exact(Q8_0_BYTES)).enumerate() {
                let dq = f16::from_le_bytes([qb[0], qb[1]]).to_f32();
                let dot: i32 = qb[2..].iter().zip(&kb[2..]).map(|(&a, &b)| a as i8 as i32 * b as i8 as i32).sum();
                acc = (dq * dk[8 * b + i]).mul_add(dot as f32, acc);
            }
            *o = acc;
        }
    }
    #[inline(always)]
    unsafe fn narrow(src: &[f32], dst: &mut [f16]) {
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = f16::from_f32(s);
        }
    }
    #[inline(always)]
    unsafe fn widen(src: &[f16], dst: &mut [f32]) {
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = s.to_f32();
        }
    }
    #[inline(always)]
    unsafe fn widen_q8_0(src: &[u8], dst: &mut [f32]) {
        Rows::Q8_0(src).widen(0, dst)
    }
    #[inline(always)]
    unsafe fn weigh_f16<'r>(w: &[f32], v: impl Iterator<Item = &'r [f16]> + Clone, o: &mut [f32]) {
        for (&w, row) in w.iter().zip(v) {
            for (o, x) in o.iter_mut().zip(row) {
                *o = w.mul_add(x.to_f32(), *o);
            }
        }
    }
    #[inline(always)]
    unsafe fn weigh(w: &[f32], v: &[f32], o: &mut [f32]) {
        for (&w, v) in w.iter().zip(v.chunks_exact(o.len())) {
            fma_row(w, v, o);
        }
    }
}

/// Elements of one step of a bf16 dot: AVX-512 BF16 meets sixteen per key
/// in the eight lanes of half a register, two to a lane.
pub(super) const BF16_STEP: usize = 16;

/// A bf16 key (or query) row widened for the f32 loops in the order their
/// eight lanes meet it, so that they round as AVX-512 BF16's paired
/// products do: in each step of sixteen elements, lane `l` adds the product
/// of element `2l + 1`, then that of element `2l` (a product of two bf16s
/// is exact in f32, so a fused multiply-add rounds once, as the paired form
/// does per product). So each step is laid out as its odd elements, then
/// its even ones; `dst` is the row padded with zeros to whole steps.
#[inline(always)]
pub(super) fn bf16_lane_order(src: &[bf16], dst: &mut [f32]) {
    assert!(dst.len() >= src.len().next_multiple_of(BF16_STEP));
    let at = |i: usize| src.get(i).map_or(0.0, |x| x.to_f32());
    for (s, step) in dst[..src.len().next_multiple_of(BF16_STEP)].chunks_exact_mut(BF16_STEP).enumerate() {
        for l in 0..8 {
            step[l] = at(BF16_STEP * s + 2 * l + 1);
            step[8 + l] = at(BF16_STEP * s + 2 * l);
        }
    }
}

/// Where the weight of position `pos` goes among a span's weights in the
/// order a bf16 cache's values are weighed: positions are met in pairs
/// from an even one (`2i`, `2i + 1`), the second first, as AVX-512 BF16's
/// paired products add them; a position outside what a query sees weighs
/// zero, which leaves the sum as it is.
#[inline(always)]
pub(super) fn bf16_pair_order(pos: usize) -> usize {
    pos ^ 1
}

/// Up to `16 * blocks` bf16 keys of `n` elements (a multiple of
/// [`BF16_STEP`]) laid out for [`Lanes::scores16_bf16_scaled`]: per block of
/// sixteen keys and pair of elements `p`, the sixteen keys' pairs `p`, key
/// `i` of the block at 32-bit lane `i`, so that one register holds a pair of
/// sixteen keys. Keys past `keys.len()` and elements past a key's end are zero.
pub(super) fn transpose_bf16_keys(keys: &[&[bf16]], blocks: usize, n: usize, out: &mut [bf16]) {
    assert!(n.is_multiple_of(BF16_STEP) && keys.len() <= 16 * blocks && out.len() >= 16 * blocks * n);
    let pairs = n / 2;
    for (c, lane) in out[..16 * blocks * n].chunks_exact_mut(2).enumerate() {
        let (b, p, i) = (c / (16 * pairs), c / 16 % pairs, c % 16);
        let key = keys.get(16 * b + i);
        for (e, d) in lane.iter_mut().enumerate() {
            *d = key.and_then(|k| k.get(2 * p + e)).copied().unwrap_or(bf16::ZERO);
        }
    }
}

/// Up to `16 * blocks` widened keys of `n` floats laid out for
/// [`Lanes::scores16_scaled`]: per block of sixteen keys and element `d`, the
/// sixteen keys' elements `d`, key `i` of the block at lane `i`. Keys past
/// `keys.len()` and elements past a key's end are zero.
pub(super) fn transpose_f32_keys(keys: &[&[f32]], blocks: usize, n: usize, out: &mut [f32]) {
    assert!(keys.len() <= 16 * blocks && out.len() >= 16 * blocks * n);
    for (c, d) in out[..16 * blocks * n].iter_mut().enumerate() {
        let (b, e, i) = (c / (16 * n), c / 16 % n, c % 16);
        *d = keys.get(16 * b + i).and_then(|k| k.get(e)).copied().unwrap_or(0.0);
    }
}

/// A run of exponentials from an even position rounded to bf16 (as
/// `to_bf16` rounds), widened, and laid out in [`bf16_pair_order`]:
/// `dst[i ^ 1]` from `src[i]`, over an even count. Exponentials are never
/// NaN (the vector forms need not quiet one).
pub(super) fn round_bf16_pairs(src: &[f32], dst: &mut [f32]) {
    assert!(src.len().is_multiple_of(2) && dst.len() >= src.len(), "whole pairs");
    for (i, &w) in src.iter().enumerate() {
        dst[bf16_pair_order(i)] = to_bf16(w).to_f32();
    }
}

/// The value rows of a pair of positions (`None`: a position no query
/// weighs, taken as zeros) interleaved for [`Lanes::weigh_bf16_heads`]:
/// element `d` of the first, then of the second, for every `d`.
pub(super) fn pair_bf16_values(first: Option<&[bf16]>, second: Option<&[bf16]>, out: &mut [bf16]) {
    let at = |row: Option<&[bf16]>, d: usize| row.map_or(bf16::ZERO, |r| r[d]);
    for (d, pair) in out.chunks_exact_mut(2).enumerate() {
        pair[0] = at(first, d);
        pair[1] = at(second, d);
    }
}

/// Most Q8_0 blocks of a key that the transposed forms of
/// [`Lanes::scores16_q8_0_scaled`] hold in registers (heads of 512).
pub(super) const MAX_KEY_BLOCKS: usize = 16;

/// Where sixteen Q8_0 keys (all as long) lie from the first, in bytes, for
/// the transposed forms' gathers; `None` where they cannot take them (keys
/// wider than [`MAX_KEY_BLOCKS`], or an offset past 32 bits), and the keys
/// are scored eight at a time instead.
#[inline(always)]
pub(super) fn gather_offsets(keys: &[&[u8]; 16]) -> Option<[i32; 16]> {
    let len = keys[0].len();
    assert!(keys.iter().all(|k| k.len() == len), "keys of one head");
    if len / Q8_0_BYTES > MAX_KEY_BLOCKS {
        return None;
    }
    let base = keys[0].as_ptr() as isize;
    let offsets: [isize; 16] = std::array::from_fn(|i| keys[i].as_ptr() as isize - base);
    offsets.iter().all(|&o| i32::try_from(o).is_ok()).then(|| offsets.map(|o| o as i32))
}

/// [`Lanes::scores16_q8_0_scaled`] as two calls of [`Lanes::scores8_q8_0`]
/// per query: the definition its other forms round as.
#[inline(always)]
pub(super) unsafe fn scores16_q8_0_by_eights<L: Lanes + ?Sized>(q: &[u8], count: usize, keys: &[&[u8]; 16], scale: f32,
                                                                 dst: *mut f32, stride: usize) {
    let len = keys[0].len();
    let blocks = len / Q8_0_BYTES;
    let key_scale = |i: usize, b: usize| f16::from_le_bytes([keys[i][b * Q8_0_BYTES], keys[i][b * Q8_0_BYTES + 1]]).to_f32();
    for half in 0..2 {
        let keys8: [&[u8]; 8] = std::array::from_fn(|i| keys[8 * half + i]);
        let dk: Vec<f32> = (0..8 * blocks).map(|e| key_scale(8 * half + e % 8, e / 8)).collect();
        for i in 0..count {
            let mut s8 = [0.0f32; 8];
            L::scores8_q8_0(&q[i * len..][..len], &keys8, &dk, &mut s8);
            for (e, &x) in s8.iter().enumerate() {
                *dst.add(i * stride + 8 * half + e) = scale * x;
            }
        }
    }
}

/// One score in the lane order of the module's doc (`q` and `k` of a
/// length that is a multiple of eight).
#[inline]
pub(super) fn dot8(q: &[f32], k: &[f32]) -> f32 {
    dot8_by(q, |i| k[i])
}

/// [`dot8`] with key element `i` given by `key(i)` (an f16 row widened as it
/// is read, without a buffer).
#[inline]
fn dot8_by(q: &[f32], key: impl Fn(usize) -> f32) -> f32 {
    let mut l = [0.0f32; 8];
    for (c, qc) in q.chunks_exact(8).enumerate() {
        for i in 0..8 {
            l[i] = qc[i].mul_add(key(8 * c + i), l[i]);
        }
    }
    ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]))
}

#[inline]
pub(super) fn fma_row(w: f32, v: &[f32], o: &mut [f32]) {
    for (o, &x) in o.iter_mut().zip(v) {
        *o = w.mul_add(x, *o);
    }
}

/// `each(first head, heads)` over `heads` heads taken `most` at a time (the
/// most whose outputs a vector form's weighing holds in registers).
#[inline(always)]
pub(super) fn in_groups(heads: usize, most: usize, mut each: impl FnMut(usize, usize)) {
    for g in (0..heads).step_by(most) {
        each(g, (heads - g).min(most));
    }
}
