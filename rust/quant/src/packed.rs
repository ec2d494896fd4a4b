//! Weight rows repacked at load for the tile kernels, and the activation rows
//! those kernels read.
//!
//! In the file, every 32-element block carries its own f16 scale beside its
//! quants, so a dot product converts two scales per block and per column, and
//! a 4-bit block takes a load, a shift, an insert and a mask to unpack. A
//! repacked row keeps its scales together in front (padded to a multiple of
//! eight blocks, so eight scales convert in one instruction), and pairs its
//! 4-bit blocks: byte `i` of a pair holds element `i` of the first block in
//! its low nibble and element `i` of the second in its high nibble, so one
//! load, one shift and two masks unpack two blocks. The activation side
//! mirrors it: each row's scales and sums as f32 arrays, then its 8-bit quants
//! contiguous.
//!
//! The arithmetic is the file format's own: a repacked row dots to the same
//! integer sums per block as [`crate::vec_dot`] on the original bytes; only the
//! order in which the f32 block terms are added differs.

use ember_gguf::GgmlType;
use half::f16;

use crate::blocks::{as_blocks, BlockQ4_1, BlockQ5_0, BlockQ8_0};
use crate::error::QuantError;
use crate::quantize::{q8_block, Q8Rounding};

const QK: usize = 32;

/// The file formats that have a repacked layout and tile kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PackedFormat {
    /// Scale and min per block; quants 0..15.
    Q4_1,
    /// Scale per block; quants 0..31 stored offset by 16 (the offset comes
    /// back as `16 d Σy` from the activation sums).
    Q5_0,
    /// Scale per block; signed 8-bit quants.
    Q8_0,
}

/// Where the parts of a repacked row (or activation row) of `k` elements lie.
#[derive(Clone, Copy, Debug)]
pub struct RowLayout {
    /// Blocks in the row.
    pub nb: usize,
    /// Blocks rounded up to even: the quants region holds whole pairs.
    pub nbe: usize,
    /// Blocks rounded up to a multiple of 8: the length of each scale array.
    pub nbp: usize,
}

impl RowLayout {
    pub fn new(k: usize) -> RowLayout {
        let nb = k / QK;
        RowLayout { nb, nbe: nb.next_multiple_of(2), nbp: nb.next_multiple_of(8) }
    }
}

impl PackedFormat {
    /// The repacked layout for a file type, where there is one.
    pub fn of(ty: GgmlType) -> Option<PackedFormat> {
        match ty {
            GgmlType::Q4_1 => Some(PackedFormat::Q4_1),
            GgmlType::Q5_0 => Some(PackedFormat::Q5_0),
            GgmlType::Q8_0 => Some(PackedFormat::Q8_0),
            _ => None,
        }
    }

    pub fn ggml_type(self) -> GgmlType {
        match self {
            PackedFormat::Q4_1 => GgmlType::Q4_1,
            PackedFormat::Q5_0 => GgmlType::Q5_0,
            PackedFormat::Q8_0 => GgmlType::Q8_0,
        }
    }

    /// Bytes of one repacked row of `k` elements, or `None` when `k` is not a
    /// whole number of blocks.
    pub fn row_bytes(self, k: usize) -> Option<usize> {
        if k % QK != 0 || k == 0 {
            return None;
        }
        let l = RowLayout::new(k);
        Some(match self {
            // d[nbp] f16, m[nbp] f16, quants as nibble pairs
            PackedFormat::Q4_1 => 4 * l.nbp + 16 * l.nbe,
            // d[nbp] f16, high bits [nbe] u32, quants as nibble pairs
            PackedFormat::Q5_0 => 2 * l.nbp + 4 * l.nbe + 16 * l.nbe,
            // d[nbp] f16, quants [nbe * 32] i8
            PackedFormat::Q8_0 => 2 * l.nbp + QK * l.nbe,
        })
    }

    /// Repacks one row of `k` elements from the file's bytes `src` into `dst`
    /// (exactly [`row_bytes`](Self::row_bytes) long; every byte is written,
    /// padding as zeros).
    pub fn pack_row(self, k: usize, src: &[u8], dst: &mut [u8]) -> Result<(), QuantError> {
        let format = self.ggml_type().name();
        let want = self.row_bytes(k).ok_or(QuantError::NotBlockMultiple { format, n: k, block: QK })?;
        let src_len = self.ggml_type().row_bytes(k as u64).unwrap() as usize;
        if src.len() != src_len {
            return Err(QuantError::Length { format, what: "file row", expected: src_len, got: src.len() });
        }
        if dst.len() != want {
            return Err(QuantError::Length { format, what: "repacked row", expected: want, got: dst.len() });
        }
        dst.fill(0);
        let l = RowLayout::new(k);
        match self {
            PackedFormat::Q4_1 => {
                let (scales, qs) = dst.split_at_mut(4 * l.nbp);
                for (b, x) in as_blocks::<BlockQ4_1>(src).iter().enumerate() {
                    put_f16(scales, b, x.d);
                    put_f16(scales, l.nbp + b, x.m);
                    put_nibbles(qs, b, &unpack_nibbles(&x.qs));
                }
            }
            PackedFormat::Q5_0 => {
                let (scales, rest) = dst.split_at_mut(2 * l.nbp);
                let (qh, qs) = rest.split_at_mut(4 * l.nbe);
                for (b, x) in as_blocks::<BlockQ5_0>(src).iter().enumerate() {
                    put_f16(scales, b, x.d);
                    qh[4 * b..4 * b + 4].copy_from_slice(&x.qh);
                    put_nibbles(qs, b, &unpack_nibbles(&x.qs));
                }
            }
            PackedFormat::Q8_0 => {
                let (scales, qs) = dst.split_at_mut(2 * l.nbp);
                for (b, x) in as_blocks::<BlockQ8_0>(src).iter().enumerate() {
                    put_f16(scales, b, x.d);
                    for (o, &q) in qs[QK * b..QK * (b + 1)].iter_mut().zip(&x.qs) {
                        *o = q as u8;
                    }
                }
            }
        }
        Ok(())
    }
}

fn put_f16(dst: &mut [u8], i: usize, v: f16) {
    dst[2 * i..2 * i + 2].copy_from_slice(&v.to_bits().to_le_bytes());
}

/// A file block's 16 bytes of nibbles as its 32 elements in order.
fn unpack_nibbles(qs: &[u8; 16]) -> [u8; QK] {
    let mut q = [0u8; QK];
    for (i, &b) in qs.iter().enumerate() {
        q[i] = b & 0xF;
        q[i + 16] = b >> 4;
    }
    q
}

/// Block `b`'s 32 4-bit elements into its half of a nibble pair.
fn put_nibbles(qs: &mut [u8], b: usize, q: &[u8; QK]) {
    let pair = &mut qs[QK * (b / 2)..QK * (b / 2 + 1)];
    let shift = 4 * (b % 2);
    for (o, &v) in pair.iter_mut().zip(q) {
        *o |= v << shift;
    }
}

// ---- activations ----

/// Bytes of one activation row of `k` elements in the tile kernels' layout:
/// `d[nbp]`, `s[nbp]`, `dsum[nbp]` as f32, then `nbe * 32` i8 quants.
pub fn act_row_bytes(k: usize) -> Option<usize> {
    if k % QK != 0 || k == 0 {
        return None;
    }
    let l = RowLayout::new(k);
    Some(12 * l.nbp + QK * l.nbe)
}

/// Quantizes one activation row as llama.cpp's x86 backend quantizes Q8_0 and
/// Q8_1 (the same quants and scale for both), keeping per block: `d` rounded
/// to f16 as the file formats store it, `s = f16(d Σq)` as Q8_1 stores it
/// (Q4_1's min term), and `dsum = f16(d) Σq` unrounded (Q5_0's offset term).
pub fn quantize_act_row(x: &[f32], out: &mut [u8]) -> Result<(), QuantError> {
    let k = x.len();
    let format = "packed Q8 activations";
    let want = act_row_bytes(k).ok_or(QuantError::NotBlockMultiple { format, n: k, block: QK })?;
    if out.len() != want {
        return Err(QuantError::Length { format, what: "activation row", expected: want, got: out.len() });
    }
    let l = RowLayout::new(k);
    let (head, qs) = out.split_at_mut(12 * l.nbp);
    for (b, x) in x.chunks_exact(QK).enumerate() {
        let (d, q, sum) = q8_block(x, Q8Rounding::X86);
        let d16 = f16::from_f32(d).to_f32();
        let s = f16::from_f32(sum as f32 * d).to_f32();
        let dsum = d16 * sum as f32;
        head[4 * b..4 * b + 4].copy_from_slice(&d16.to_le_bytes());
        head[4 * (l.nbp + b)..4 * (l.nbp + b) + 4].copy_from_slice(&s.to_le_bytes());
        head[4 * (2 * l.nbp + b)..4 * (2 * l.nbp + b) + 4].copy_from_slice(&dsum.to_le_bytes());
        for (o, &v) in qs[QK * b..QK * (b + 1)].iter_mut().zip(&q) {
            *o = v as u8;
        }
    }
    head[4 * l.nb..4 * l.nbp].fill(0);
    head[4 * (l.nbp + l.nb)..4 * 2 * l.nbp].fill(0);
    head[4 * (2 * l.nbp + l.nb)..].fill(0);
    qs[QK * l.nb..].fill(0);
    Ok(())
}
