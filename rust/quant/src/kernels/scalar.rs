//! Scalar reference dot products, one per (weight, activation) pair. Inside a
//! block they accumulate in integers exactly as ggml's `*_generic` kernels do
//! (including the 8-lane f32 accumulators of the K-quant kernels), so their
//! results track llama.cpp's to the last few ulps; across blocks they sum in f32.
//!
//! Every kernel has the [`DotFn`](super::DotFn) signature: `k` elements, a
//! weight row and an activation row in the format
//! [`activation_type`](crate::activation_type) names. Rows longer than `k`
//! elements are read only up to `k`; shorter rows panic.

#![allow(non_snake_case)]

use crate::blocks::float::{fp16_to_fp32, read_bf16, read_f16, read_f32};
use crate::blocks::iq::{iq4xs_scale, KVALUES_IQ4NL};
use crate::blocks::k_quants::{k4_scales_mins, q3k_scales, q6k_quants};
use crate::blocks::legacy::q5_high_bits;
use crate::blocks::{
    row_blocks, BlockIq4Nl, BlockIq4Xs, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ4_0, BlockQ4_1,
    BlockQ5K, BlockQ5_0, BlockQ5_1, BlockQ6K, BlockQ8K, BlockQ8_0, BlockQ8_1, QK_K,
};

pub fn vec_dot_q4_0_q8_0(k: usize, w_row: &[u8], act_row: &[u8]) -> f32 {
    let x = row_blocks::<BlockQ4_0>(w_row, k);
    let y = row_blocks::<BlockQ8_0>(act_row, k);
    let mut sumf = 0.0f32;
    for (x, y) in x.iter().zip(y) {
        let (mut s0, mut s1) = (0i32, 0i32);
        for j in 0..16 {
            let v0 = (x.qs[j] & 0x0F) as i32 - 8;
            let v1 = (x.qs[j] >> 4) as i32 - 8;
            s0 += v0 * y.qs[j] as i32;
            s1 += v1 * y.qs[j + 16] as i32;
        }
        sumf += (s0 + s1) as f32 * fp16_to_fp32(x.d) * fp16_to_fp32(y.d);
    }
    sumf
}

/// `Σ (d q + m) (dy qy) = d dy Σ q qy + m (dy Σ qy)`, the last factor being
/// the activation block's precomputed `s`, as ggml's `vec_dot_q4_1_q8_1`.
pub fn vec_dot_q4_1_q8_1(k: usize, w_row: &[u8], act_row: &[u8]) -> f32 {
    let x = row_blocks::<BlockQ4_1>(w_row, k);
    let y = row_blocks::<BlockQ8_1>(act_row, k);
    let mut sumf = 0.0f32;
    for (x, y) in x.iter().zip(y) {
        let (mut s0, mut s1) = (0i32, 0i32);
        for j in 0..16 {
            let v0 = (x.qs[j] & 0x0F) as i32;
            let v1 = (x.qs[j] >> 4) as i32;
            s0 += v0 * y.qs[j] as i32;
            s1 += v1 * y.qs[j + 16] as i32;
        }
        sumf += (fp16_to_fp32(x.d) * fp16_to_fp32(y.d)) * (s0 + s1) as f32
            + fp16_to_fp32(x.m) * fp16_to_fp32(y.s);
    }
    sumf
}

pub fn vec_dot_q5_0_q8_0(k: usize, w_row: &[u8], act_row: &[u8]) -> f32 {
    let x = row_blocks::<BlockQ5_0>(w_row, k);
    let y = row_blocks::<BlockQ8_0>(act_row, k);
    let mut sumf = 0.0f32;
    for (x, y) in x.iter().zip(y) {
        let qh = u32::from_le_bytes(x.qh);
        let (mut s0, mut s1) = (0i32, 0i32);
        for j in 0..16 {
            let (h0, h1) = q5_high_bits(qh, j);
            let x0 = ((x.qs[j] & 0x0F) | h0) as i32 - 16;
            let x1 = ((x.qs[j] >> 4) | h1) as i32 - 16;
            s0 += x0 * y.qs[j] as i32;
            s1 += x1 * y.qs[j + 16] as i32;
        }
        sumf += (fp16_to_fp32(x.d) * fp16_to_fp32(y.d)) * (s0 + s1) as f32;
    }
    sumf
}

/// The min term as in [`vec_dot_q4_1_q8_1`].
pub fn vec_dot_q5_1_q8_1(k: usize, w_row: &[u8], act_row: &[u8]) -> f32 {
    let x = row_blocks::<BlockQ5_1>(w_row, k);
    let y = row_blocks::<BlockQ8_1>(act_row, k);
    let mut sumf = 0.0f32;
    for (x, y) in x.iter().zip(y) {
        let qh = u32::from_le_bytes(x.qh);
        let (mut s0, mut s1) = (0i32, 0i32);
        for j in 0..16 {
            let (h0, h1) = q5_high_bits(qh, j);
            let x0 = ((x.qs[j] & 0x0F) | h0) as i32;
            let x1 = ((x.qs[j] >> 4) | h1) as i32;
            s0 += x0 * y.qs[j] as i32;
            s1 += x1 * y.qs[j + 16] as i32;
        }
        sumf += (fp16_to_fp32(x.d) * fp16_to_fp32(y.d)) * (s0 + s1) as f32
            + fp16_to_fp32(x.m) * fp16_to_fp32(y.s);
    }
    sumf
}

pub fn vec_dot_q8_0_q8_0(k: usize, w_row: &[u8], act_row: &[u8]) -> f32 {
    let x = row_blocks::<BlockQ8_0>(w_row, k);
    let y = row_blocks::<BlockQ8_0>(act_row, k);
    let mut sumf = 0.0f32;
    for (x, y) in x.iter().zip(y) {
        let mut sumi = 0i32;
        for (&a, &b) in x.qs.iter().zip(y.qs.iter()) {
            sumi += a as i32 * b as i32;
        }
        sumf += sumi as f32 * (fp16_to_fp32(x.d) * fp16_to_fp32(y.d));
    }
    sumf
}

pub fn vec_dot_iq4_nl_q8_0(k: usize, w_row: &[u8], act_row: &[u8]) -> f32 {
    let x = row_blocks::<BlockIq4Nl>(w_row, k);
    let y = row_blocks::<BlockQ8_0>(act_row, k);
    let mut sumf = 0.0f32;
    for (x, y) in x.iter().zip(y) {
        let d = fp16_to_fp32(y.d) * fp16_to_fp32(x.d);
        let (mut s1, mut s2) = (0i32, 0i32);
        for j in 0..16 {
            s1 += y.qs[j] as i32 * KVALUES_IQ4NL[(x.qs[j] & 0xF) as usize] as i32;
            s2 += y.qs[j + 16] as i32 * KVALUES_IQ4NL[(x.qs[j] >> 4) as usize] as i32;
        }
        sumf += d * (s1 + s2) as f32;
    }
    sumf
}

pub fn vec_dot_q2_K_q8_K(k: usize, w_row: &[u8], act_row: &[u8]) -> f32 {
    let x = row_blocks::<BlockQ2K>(w_row, k);
    let y = row_blocks::<BlockQ8K>(act_row, k);
    let mut sumf = 0.0f32;
    for (x, y) in x.iter().zip(y) {
        let sc = &x.scales;
        let bsums = y.bsums;
        let summs: i32 = bsums
            .iter()
            .zip(sc)
            .map(|(&b, &s)| b as i32 * (s >> 4) as i32)
            .sum();
        let dall = y.d * fp16_to_fp32(x.d);
        let dmin = y.d * fp16_to_fp32(x.dmin);
        let mut isum = 0i32;
        let mut is = 0;
        let mut q8 = 0;
        for q2 in x.qs.chunks_exact(32) {
            for shift in [0, 2, 4, 6] {
                for half in [0..16, 16..32] {
                    let d = (sc[is] & 0xF) as i32;
                    is += 1;
                    let mut isuml = 0i32;
                    for l in half {
                        isuml += y.qs[q8 + l] as i32 * ((q2[l] >> shift) & 3) as i32;
                    }
                    isum += d * isuml;
                }
                q8 += 32;
            }
        }
        sumf += dall * isum as f32 - dmin * summs as f32;
    }
    sumf
}

/// ggml's K-quant inner loop: `aux32[l] += scale * q8[i] * a[i]` over lanes
/// `l = i % 8`, with one scale per `group` consecutive elements.
#[inline(always)]
fn lanes_i32(
    a: &[i8; QK_K],
    q8: &[i8; QK_K],
    group: usize,
    scale: impl Fn(usize) -> i32,
) -> [i32; 8] {
    let mut aux32 = [0i32; 8];
    for (g, (a, q)) in a
        .chunks_exact(group)
        .zip(q8.chunks_exact(group))
        .enumerate()
    {
        let s = scale(g);
        for (a8, q8) in a.chunks_exact(8).zip(q.chunks_exact(8)) {
            for l in 0..8 {
                aux32[l] += s * (q8[l] as i32 * a8[l] as i32);
            }
        }
    }
    aux32
}

pub fn vec_dot_q3_K_q8_K(k: usize, w_row: &[u8], act_row: &[u8]) -> f32 {
    let x = row_blocks::<BlockQ3K>(w_row, k);
    let y = row_blocks::<BlockQ8K>(act_row, k);
    let mut sums = [0.0f32; 8];
    for (x, y) in x.iter().zip(y) {
        let mut a = [0i8; QK_K];
        let mut m: u8 = 1;
        let mut ai = 0;
        for q3 in x.qs.chunks_exact(32) {
            for shift in [0, 2, 4, 6] {
                for l in 0..32 {
                    let lo = ((q3[l] >> shift) & 3) as i8;
                    a[ai + l] = lo - if x.hmask[l] & m != 0 { 0 } else { 4 };
                }
                ai += 32;
                m = m.wrapping_shl(1);
            }
        }
        let scales = q3k_scales(&x.scales);
        let aux32 = lanes_i32(&a, &y.qs, 16, |g| scales[g] as i32 - 32);
        let d = fp16_to_fp32(x.d) * y.d;
        for l in 0..8 {
            sums[l] += d * aux32[l] as f32;
        }
    }
    sums.iter().fold(0.0f32, |s, &v| s + v)
}

pub fn vec_dot_q4_K_q8_K(k: usize, w_row: &[u8], act_row: &[u8]) -> f32 {
    let x = row_blocks::<BlockQ4K>(w_row, k);
    let y = row_blocks::<BlockQ8K>(act_row, k);
    let mut sums = [0.0f32; 8];
    let mut sumf = 0.0f32;
    for (x, y) in x.iter().zip(y) {
        let mut a = [0i8; QK_K];
        for (q4, a) in x.qs.chunks_exact(32).zip(a.chunks_exact_mut(64)) {
            for l in 0..32 {
                a[l] = (q4[l] & 0xF) as i8;
                a[l + 32] = (q4[l] >> 4) as i8;
            }
        }
        let (scales, mins) = k4_scales_mins(&x.scales);
        let bsums = y.bsums;
        let sumi: i32 = bsums
            .iter()
            .enumerate()
            .map(|(j, &b)| b as i32 * mins[j / 2] as i32)
            .sum();
        let aux32 = lanes_i32(&a, &y.qs, 32, |g| scales[g] as i32);
        let d = fp16_to_fp32(x.d) * y.d;
        for l in 0..8 {
            sums[l] += d * aux32[l] as f32;
        }
        let dmin = fp16_to_fp32(x.dmin) * y.d;
        sumf -= dmin * sumi as f32;
    }
    sums.iter().fold(sumf, |s, &v| s + v)
}

pub fn vec_dot_q5_K_q8_K(k: usize, w_row: &[u8], act_row: &[u8]) -> f32 {
    let x = row_blocks::<BlockQ5K>(w_row, k);
    let y = row_blocks::<BlockQ8K>(act_row, k);
    let mut sums = [0.0f32; 8];
    let mut sumf = 0.0f32;
    for (x, y) in x.iter().zip(y) {
        let mut a = [0i8; QK_K];
        let mut m: u8 = 1;
        for (q4, a) in x.qs.chunks_exact(32).zip(a.chunks_exact_mut(64)) {
            for l in 0..32 {
                a[l] = (q4[l] & 0xF) as i8 + if x.qh[l] & m != 0 { 16 } else { 0 };
            }
            m = m.wrapping_shl(1);
            for l in 0..32 {
                a[l + 32] = (q4[l] >> 4) as i8 + if x.qh[l] & m != 0 { 16 } else { 0 };
            }
            m = m.wrapping_shl(1);
        }
        let (scales, mins) = k4_scales_mins(&x.scales);
        let bsums = y.bsums;
        let sumi: i32 = bsums
            .iter()
            .enumerate()
            .map(|(j, &b)| b as i32 * mins[j / 2] as i32)
            .sum();
        let aux32 = lanes_i32(&a, &y.qs, 32, |g| scales[g] as i32);
        let d = fp16_to_fp32(x.d) * y.d;
        for l in 0..8 {
            sums[l] += d * aux32[l] as f32;
        }
        let dmin = fp16_to_fp32(x.dmin) * y.d;
        sumf -= dmin * sumi as f32;
    }
    sums.iter().fold(sumf, |s, &v| s + v)
}

pub fn vec_dot_q6_K_q8_K(k: usize, w_row: &[u8], act_row: &[u8]) -> f32 {
    let x = row_blocks::<BlockQ6K>(w_row, k);
    let y = row_blocks::<BlockQ8K>(act_row, k);
    let mut sums = [0.0f32; 8];
    for (x, y) in x.iter().zip(y) {
        let mut a = [0i8; QK_K];
        for n in 0..2 {
            let ql = &x.ql[64 * n..64 * n + 64];
            let qh = &x.qh[32 * n..32 * n + 32];
            let a = &mut a[128 * n..128 * n + 128];
            for l in 0..32 {
                let q = q6k_quants(ql, qh, l);
                for (i, &q) in q.iter().enumerate() {
                    a[l + 32 * i] = q;
                }
            }
        }
        let aux32 = lanes_i32(&a, &y.qs, 16, |g| x.scales[g] as i32);
        let d = fp16_to_fp32(x.d) * y.d;
        for l in 0..8 {
            sums[l] += d * aux32[l] as f32;
        }
    }
    sums.iter().fold(0.0f32, |s, &v| s + v)
}

/// Q8_K weights are unusual (ggml has no such kernel); defined the obvious way.
pub fn vec_dot_q8_K_q8_K(k: usize, w_row: &[u8], act_row: &[u8]) -> f32 {
    let x = row_blocks::<BlockQ8K>(w_row, k);
    let y = row_blocks::<BlockQ8K>(act_row, k);
    let mut sumf = 0.0f32;
    for (x, y) in x.iter().zip(y) {
        let mut sumi = 0i32;
        for (&a, &b) in x.qs.iter().zip(y.qs.iter()) {
            sumi += a as i32 * b as i32;
        }
        sumf += (x.d * y.d) * sumi as f32;
    }
    sumf
}

pub fn vec_dot_iq4_xs_q8_K(k: usize, w_row: &[u8], act_row: &[u8]) -> f32 {
    let x = row_blocks::<BlockIq4Xs>(w_row, k);
    let y = row_blocks::<BlockQ8K>(act_row, k);
    let mut sumf = 0.0f32;
    for (x, y) in x.iter().zip(y) {
        let d4d8 = fp16_to_fp32(x.d) * y.d;
        for (ib, (qs, q8)) in x.qs.chunks_exact(16).zip(y.qs.chunks_exact(32)).enumerate() {
            let dl = d4d8 * (iq4xs_scale(x, ib) - 32) as f32;
            let (mut s1, mut s2) = (0i32, 0i32);
            for j in 0..16 {
                s1 += q8[j] as i32 * KVALUES_IQ4NL[(qs[j] & 0xF) as usize] as i32;
                s2 += q8[j + 16] as i32 * KVALUES_IQ4NL[(qs[j] >> 4) as usize] as i32;
            }
            sumf += dl * (s1 + s2) as f32;
        }
    }
    sumf
}

/// Elementwise product summed in eight f32 lanes (as ggml's SIMD float dots
/// do), which also lets the compiler vectorize it. `W` is the element width
/// in bytes; slicing each group of eight to its exact length up front lets
/// the compiler drop every bounds check inside.
#[inline(always)]
fn float_dot<const W: usize>(k: usize, w: &[u8], a: &[u8], read: impl Fn(&[u8]) -> f32) -> f32 {
    let (w, a) = (&w[..k * W], &a[..k * W]);
    let n8 = k / 8 * 8;
    let mut acc = [0.0f32; 8];
    let mut i = 0;
    while i < n8 {
        let wb = &w[i * W..(i + 8) * W];
        let ab = &a[i * W..(i + 8) * W];
        for l in 0..8 {
            acc[l] += read(&wb[l * W..l * W + W]) * read(&ab[l * W..l * W + W]);
        }
        i += 8;
    }
    let mut sum = acc.iter().fold(0.0f32, |s, &v| s + v);
    for i in n8..k {
        sum += read(&w[i * W..i * W + W]) * read(&a[i * W..i * W + W]);
    }
    sum
}

pub fn vec_dot_f32_f32(k: usize, w_row: &[u8], act_row: &[u8]) -> f32 {
    float_dot::<4>(k, w_row, act_row, read_f32)
}

pub fn vec_dot_f16_f16(k: usize, w_row: &[u8], act_row: &[u8]) -> f32 {
    float_dot::<2>(k, w_row, act_row, read_f16)
}

pub fn vec_dot_bf16_bf16(k: usize, w_row: &[u8], act_row: &[u8]) -> f32 {
    float_dot::<2>(k, w_row, act_row, read_bf16)
}
