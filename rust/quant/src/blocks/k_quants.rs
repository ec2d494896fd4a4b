//! The K-quant super-blocks (Q2_K .. Q6_K, 256 weights with packed sub-block
//! scales), the Q8_K activation block, the scale unpacking they share, and
//! their dequantizers, following ggml-quants.c.

use half::f16;

use super::float::fp16_to_fp32;

use super::{Block, QK_K};

/// Bytes of packed 6-bit scales and mins in Q4_K / Q5_K.
pub const K_SCALE_SIZE: usize = 12;

/// 2-bit: 16 sub-blocks of 16, `x = d * (sc & 15) * q - dmin * (sc >> 4)`.
#[derive(Clone, Copy, Debug)]
#[repr(C, packed)]
pub struct BlockQ2K {
    /// Low nibble: scale, high nibble: min, one byte per 16 weights.
    pub scales: [u8; QK_K / 16],
    pub qs: [u8; QK_K / 4],
    pub d: f16,
    pub dmin: f16,
}
const _: () = assert!(std::mem::size_of::<BlockQ2K>() == 84);

/// 3-bit: 16 sub-blocks of 16, `x = d * (scale - 32) * (q - 4 * !hbit)`.
#[derive(Clone, Copy, Debug)]
#[repr(C, packed)]
pub struct BlockQ3K {
    pub hmask: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 4],
    /// Sixteen 6-bit scales; see [`q3k_scales`] for the packing.
    pub scales: [u8; 12],
    pub d: f16,
}
const _: () = assert!(std::mem::size_of::<BlockQ3K>() == 110);

/// 4-bit: 8 sub-blocks of 32, `x = d * sc * q - dmin * m` (6-bit sc, m).
#[derive(Clone, Copy, Debug)]
#[repr(C, packed)]
pub struct BlockQ4K {
    pub d: f16,
    pub dmin: f16,
    pub scales: [u8; K_SCALE_SIZE],
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ4K>() == 144);

/// 5-bit: as Q4_K with a fifth bit per weight in `qh`.
#[derive(Clone, Copy, Debug)]
#[repr(C, packed)]
pub struct BlockQ5K {
    pub d: f16,
    pub dmin: f16,
    pub scales: [u8; K_SCALE_SIZE],
    pub qh: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ5K>() == 176);

/// 6-bit: 16 sub-blocks of 16, `x = d * scale * (q - 32)` with i8 scales.
#[derive(Clone, Copy, Debug)]
#[repr(C, packed)]
pub struct BlockQ6K {
    pub ql: [u8; QK_K / 2],
    pub qh: [u8; QK_K / 4],
    pub scales: [i8; QK_K / 16],
    pub d: f16,
}
const _: () = assert!(std::mem::size_of::<BlockQ6K>() == 210);

/// 8-bit activation block of the K-quants: `x = d * q`, with the sums of each
/// 16 quants precomputed so the min terms of the weights cost one dot of 16.
#[derive(Clone, Copy, Debug)]
#[repr(C, packed)]
pub struct BlockQ8K {
    pub d: f32,
    pub qs: [i8; QK_K],
    pub bsums: [i16; QK_K / 16],
}
const _: () = assert!(std::mem::size_of::<BlockQ8K>() == 292);

// SAFETY: packed structs of integers, f16 and f32 only.
unsafe impl Block for BlockQ2K {
    const QK: usize = QK_K;
}
unsafe impl Block for BlockQ3K {
    const QK: usize = QK_K;
}
unsafe impl Block for BlockQ4K {
    const QK: usize = QK_K;
}
unsafe impl Block for BlockQ5K {
    const QK: usize = QK_K;
}
unsafe impl Block for BlockQ6K {
    const QK: usize = QK_K;
}
unsafe impl Block for BlockQ8K {
    const QK: usize = QK_K;
}

/// ggml's `get_scale_min_k4`: scale and min of sub-block `j` (0..8) of a
/// Q4_K / Q5_K block. The first four keep their 6 bits in bytes 0..8; the last
/// four take their low nibbles from bytes 8..12 and their top two bits from
/// the spare high bits of bytes 0..8.
#[inline(always)]
pub fn get_scale_min_k4(j: usize, q: &[u8; K_SCALE_SIZE]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        let d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        let m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
        (d, m)
    }
}

/// All eight (scales, mins) of a Q4_K / Q5_K block at once, by ggml's
/// word-wise unpacking (the one its dot products use); equal to
/// [`get_scale_min_k4`] for every `j`.
#[inline(always)]
pub fn k4_scales_mins(q: &[u8; K_SCALE_SIZE]) -> ([u8; 8], [u8; 8]) {
    const KMASK1: u32 = 0x3f3f3f3f;
    const KMASK2: u32 = 0x0f0f0f0f;
    const KMASK3: u32 = 0x03030303;
    let u0 = u32::from_le_bytes([q[0], q[1], q[2], q[3]]);
    let u1 = u32::from_le_bytes([q[4], q[5], q[6], q[7]]);
    let u2 = u32::from_le_bytes([q[8], q[9], q[10], q[11]]);
    let s0 = u0 & KMASK1;
    let s1 = (u2 & KMASK2) | (((u0 >> 6) & KMASK3) << 4);
    let m0 = u1 & KMASK1;
    let m1 = ((u2 >> 4) & KMASK2) | (((u1 >> 6) & KMASK3) << 4);
    let mut sc = [0u8; 8];
    let mut mn = [0u8; 8];
    sc[..4].copy_from_slice(&s0.to_le_bytes());
    sc[4..].copy_from_slice(&s1.to_le_bytes());
    mn[..4].copy_from_slice(&m0.to_le_bytes());
    mn[4..].copy_from_slice(&m1.to_le_bytes());
    (sc, mn)
}

/// The sixteen 6-bit scales of a Q3_K block, unbiased (0..64; subtract 32).
/// Bytes 0..8 hold the low nibbles (scales 0..8 in the low halves, 8..16 in
/// the high halves); bytes 8..12 hold the top two bits, four scales per byte.
#[inline(always)]
pub fn q3k_scales(s: &[u8; 12]) -> [u8; 16] {
    const KMASK1: u32 = 0x03030303;
    const KMASK2: u32 = 0x0f0f0f0f;
    let a0 = u32::from_le_bytes([s[0], s[1], s[2], s[3]]);
    let a1 = u32::from_le_bytes([s[4], s[5], s[6], s[7]]);
    let tmp = u32::from_le_bytes([s[8], s[9], s[10], s[11]]);
    let r = [
        (a0 & KMASK2) | ((tmp & KMASK1) << 4),
        (a1 & KMASK2) | (((tmp >> 2) & KMASK1) << 4),
        ((a0 >> 4) & KMASK2) | (((tmp >> 4) & KMASK1) << 4),
        ((a1 >> 4) & KMASK2) | (((tmp >> 6) & KMASK1) << 4),
    ];
    let mut out = [0u8; 16];
    for (o, w) in out.chunks_exact_mut(4).zip(r) {
        o.copy_from_slice(&w.to_le_bytes());
    }
    out
}

pub(crate) fn dequantize_q2_k(x: &[BlockQ2K], y: &mut [f32]) {
    for (b, y) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = fp16_to_fp32(b.d);
        let min = fp16_to_fp32(b.dmin);
        let mut out = y.iter_mut();
        let mut is = 0;
        for q in b.qs.chunks_exact(32) {
            for shift in [0, 2, 4, 6] {
                for half in [&q[..16], &q[16..]] {
                    let sc = b.scales[is];
                    is += 1;
                    let dl = d * (sc & 0xF) as f32;
                    let ml = min * (sc >> 4) as f32;
                    for &ql in half {
                        *out.next().unwrap() = dl * ((ql >> shift) & 3) as f32 - ml;
                    }
                }
            }
        }
    }
}

pub(crate) fn dequantize_q3_k(x: &[BlockQ3K], y: &mut [f32]) {
    for (b, y) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d_all = fp16_to_fp32(b.d);
        let scales = q3k_scales(&b.scales);
        let mut out = y.iter_mut();
        let mut is = 0;
        let mut m: u8 = 1;
        for q in b.qs.chunks_exact(32) {
            for shift in [0, 2, 4, 6] {
                for off in [0, 16] {
                    let dl = d_all * (scales[is] as i32 - 32) as f32;
                    is += 1;
                    for (&ql, &hm) in q[off..off + 16].iter().zip(&b.hmask[off..off + 16]) {
                        let lo = ((ql >> shift) & 3) as i32;
                        let hi = if hm & m != 0 { 0 } else { 4 };
                        *out.next().unwrap() = dl * (lo - hi) as f32;
                    }
                }
                m <<= 1;
            }
        }
    }
}

pub(crate) fn dequantize_q4_k(x: &[BlockQ4K], y: &mut [f32]) {
    for (b, y) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = fp16_to_fp32(b.d);
        let min = fp16_to_fp32(b.dmin);
        for (j, (q, y)) in
            b.qs.chunks_exact(32)
                .zip(y.chunks_exact_mut(64))
                .enumerate()
        {
            let (sc, m) = get_scale_min_k4(2 * j, &b.scales);
            let (d1, m1) = (d * sc as f32, min * m as f32);
            let (sc, m) = get_scale_min_k4(2 * j + 1, &b.scales);
            let (d2, m2) = (d * sc as f32, min * m as f32);
            for l in 0..32 {
                y[l] = d1 * (q[l] & 0xF) as f32 - m1;
                y[l + 32] = d2 * (q[l] >> 4) as f32 - m2;
            }
        }
    }
}

pub(crate) fn dequantize_q5_k(x: &[BlockQ5K], y: &mut [f32]) {
    for (b, y) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = fp16_to_fp32(b.d);
        let min = fp16_to_fp32(b.dmin);
        let mut u1: u8 = 1;
        let mut u2: u8 = 2;
        for (j, (ql, y)) in
            b.qs.chunks_exact(32)
                .zip(y.chunks_exact_mut(64))
                .enumerate()
        {
            let (sc, m) = get_scale_min_k4(2 * j, &b.scales);
            let (d1, m1) = (d * sc as f32, min * m as f32);
            let (sc, m) = get_scale_min_k4(2 * j + 1, &b.scales);
            let (d2, m2) = (d * sc as f32, min * m as f32);
            for l in 0..32 {
                let h1 = if b.qh[l] & u1 != 0 { 16 } else { 0 };
                let h2 = if b.qh[l] & u2 != 0 { 16 } else { 0 };
                y[l] = d1 * ((ql[l] & 0xF) + h1) as f32 - m1;
                y[l + 32] = d2 * ((ql[l] >> 4) + h2) as f32 - m2;
            }
            u1 <<= 2;
            u2 <<= 2;
        }
    }
}

/// The four 6-bit quants (biased by 32) that share byte `l` of a 32-byte
/// `qh` chunk: elements `l`, `l + 32`, `l + 64`, `l + 96` of a 128-half.
#[inline(always)]
pub(crate) fn q6k_quants(ql: &[u8], qh: &[u8], l: usize) -> [i8; 4] {
    let h = qh[l];
    [
        ((ql[l] & 0xF) | ((h & 3) << 4)) as i8 - 32,
        ((ql[l + 32] & 0xF) | (((h >> 2) & 3) << 4)) as i8 - 32,
        ((ql[l] >> 4) | (((h >> 4) & 3) << 4)) as i8 - 32,
        ((ql[l + 32] >> 4) | (((h >> 6) & 3) << 4)) as i8 - 32,
    ]
}

pub(crate) fn dequantize_q6_k(x: &[BlockQ6K], y: &mut [f32]) {
    for (b, y) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = fp16_to_fp32(b.d);
        for n in 0..2 {
            let ql = &b.ql[64 * n..64 * n + 64];
            let qh = &b.qh[32 * n..32 * n + 32];
            let sc = &b.scales[8 * n..8 * n + 8];
            let y = &mut y[128 * n..128 * n + 128];
            for l in 0..32 {
                let is = l / 16;
                let q = q6k_quants(ql, qh, l);
                for (i, &q) in q.iter().enumerate() {
                    y[l + 32 * i] = d * sc[is + 2 * i] as f32 * q as f32;
                }
            }
        }
    }
}

pub(crate) fn dequantize_q8_k(x: &[BlockQ8K], y: &mut [f32]) {
    for (b, y) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = b.d;
        for (y, &q) in y.iter_mut().zip(b.qs.iter()) {
            *y = d * q as f32;
        }
    }
}
