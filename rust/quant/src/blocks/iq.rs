//! The non-linear 4-bit formats IQ4_NL (32 weights, one f16 scale) and IQ4_XS
//! (256 weights, 6-bit sub-block scales): each 4-bit index selects a value of
//! [`KVALUES_IQ4NL`]. Layouts and dequantizers follow ggml.

use half::f16;

use super::float::fp16_to_fp32;

use super::{Block, QK32, QK_K};

/// ggml's `kvalues_iq4nl`: the 16 levels a 4-bit index stands for.
pub const KVALUES_IQ4NL: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// `x = d * KVALUES_IQ4NL[q]`, nibbles packed as in Q4_0.
#[derive(Clone, Copy, Debug)]
#[repr(C, packed)]
pub struct BlockIq4Nl {
    pub d: f16,
    pub qs: [u8; QK32 / 2],
}
const _: () = assert!(std::mem::size_of::<BlockIq4Nl>() == 18);

/// 8 sub-blocks of 32, `x = d * (ls - 32) * KVALUES_IQ4NL[q]`, where the 6-bit
/// `ls` of sub-block `ib` is nibble `ib % 2` of `scales_l[ib / 2]` plus bits
/// `2 ib .. 2 ib + 2` of `scales_h` on top.
#[derive(Clone, Copy, Debug)]
#[repr(C, packed)]
pub struct BlockIq4Xs {
    pub d: f16,
    pub scales_h: u16,
    pub scales_l: [u8; QK_K / 64],
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(std::mem::size_of::<BlockIq4Xs>() == 136);

// SAFETY: packed structs of integers and f16 only.
unsafe impl Block for BlockIq4Nl {
    const QK: usize = QK32;
}
unsafe impl Block for BlockIq4Xs {
    const QK: usize = QK_K;
}

/// Unbiased 6-bit scale (0..64; subtract 32) of IQ4_XS sub-block `ib`.
#[inline(always)]
pub(crate) fn iq4xs_scale(b: &BlockIq4Xs, ib: usize) -> i32 {
    let h = b.scales_h;
    (((b.scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF) as i32) | ((((h >> (2 * ib)) & 3) as i32) << 4)
}

pub(crate) fn dequantize_iq4_nl(x: &[BlockIq4Nl], y: &mut [f32]) {
    for (b, y) in x.iter().zip(y.chunks_exact_mut(QK32)) {
        let d = fp16_to_fp32(b.d);
        for j in 0..QK32 / 2 {
            y[j] = d * KVALUES_IQ4NL[(b.qs[j] & 0xF) as usize] as f32;
            y[j + QK32 / 2] = d * KVALUES_IQ4NL[(b.qs[j] >> 4) as usize] as f32;
        }
    }
}

pub(crate) fn dequantize_iq4_xs(x: &[BlockIq4Xs], y: &mut [f32]) {
    for (b, y) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = fp16_to_fp32(b.d);
        for (ib, (qs, y)) in
            b.qs.chunks_exact(16)
                .zip(y.chunks_exact_mut(32))
                .enumerate()
        {
            let dl = d * (iq4xs_scale(b, ib) - 32) as f32;
            for j in 0..16 {
                y[j] = dl * KVALUES_IQ4NL[(qs[j] & 0xF) as usize] as f32;
                y[j + 16] = dl * KVALUES_IQ4NL[(qs[j] >> 4) as usize] as f32;
            }
        }
    }
}
