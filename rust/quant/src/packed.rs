//! Weight rows repacked at load for the tile kernels, and the activation rows
//! those kernels read.
//!
//! Rows are interleaved in groups of [`GROUP`] (eight): a group stores, block
//! by block, the eight rows' scales side by side (one f16 vector each) and
//! then their quants arranged so that one 32-byte register holds four
//! consecutive elements of each of the eight rows. Against it the kernel
//! broadcasts four activation bytes to all eight lanes, and one
//! `maddubs` + `madd` leaves one 32-bit sum per row in its lane: a group's
//! eight dot products are built lane-parallel and stored as one vector, with
//! one scale conversion and one FMA per block for all eight rows (in the
//! file's layout each row pays those per block, plus a horizontal sum per
//! row). For 4- and 5-bit quants the 16-bit partial sums of a whole block fit
//! without overflow, so the widening `madd` is paid once per block, not once
//! per four elements; on cores with one vector-multiply pipe that is most of
//! the arithmetic saved.
//!
//! Within a block, element `e` of row `r` sits in register `g = e / 4`, byte
//! `4 r + e % 4`. 4-bit quants pack two registers in one: byte `4 r + i` of
//! packed register `p` (0..4) holds element `4 p + i` in its low nibble and
//! element `16 + 4 p + i` in its high one. Q5_0's fifth bits form one 32-byte
//! vector per block: bit `g` of byte `4 r + i` is the high bit of element
//! `4 g + i` of row `r`.
//!
//! The K-quants keep their super-blocks: a group's super-block holds the
//! eight rows' f16 scales, then their integer sub-block scales (and Q4_K's
//! mins) sub-block by sub-block, eight to a row of bytes, then each 32-element
//! sub-block's quants as above. Q6_K's two high bits per element form two
//! 32-byte planes per sub-block: bits `2p, 2p+1` of byte `4 r + i` of plane
//! `h` are the high bits of element `16 h + 4 p + i`.
//!
//! The unpacked layout, for passes of many columns, is the same group with
//! every register of quants as 32 bytes, one quant a byte as the kernels
//! meet them (Q5_0's offset by 16, Q6_K's unsigned six bits): a block's
//! scales as above, then per 32-element (sub-)block its eight registers in
//! the order the kernel builds them (4- and 5-bit: for each packed register
//! `p`, elements `4 p..` then `16 + 4 p..`; Q6_K: for each pair `p, p + 1`,
//! low elements of both, then high). Q8_0's quants are bytes already and it
//! has none.
//!
//! The arithmetic is the file format's own: a repacked row dots to the same
//! integer sums per block as [`crate::vec_dot`] on the original bytes; only the
//! order in which the f32 block terms are added differs, and the K-quants
//! meet the same 32-element activation blocks as the others (finer than the
//! 256-element blocks llama.cpp quantizes their activations in). A group past
//! the matrix's last row is padded with zero rows.

use ember_gguf::GgmlType;
use half::f16;

use crate::blocks::k_quants::{get_scale_min_k4, q6k_quants};
use crate::blocks::{as_blocks, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ6K, BlockQ8_0};
use crate::error::QuantError;
use crate::quantize::{q8_block, Q8Rounding};

const QK: usize = 32;
const QK_K: usize = 256;

/// Where a Q4_K super-block's quants start, after its scales.
pub(crate) const Q4_K_QUANTS: usize = 32 + 64 + 64;
/// Where a Q6_K super-block's quants start, after its scales.
pub(crate) const Q6_K_QUANTS: usize = 16 + 128;

/// Rows interleaved in one group.
pub const GROUP: usize = 8;

/// The file formats that have a repacked layout and tile kernels.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PackedFormat {
    /// Scale per block; quants 0..15 read as `q - 8`, as many bytes as the
    /// file's: the kernels make the block's min `-8 d` (exact in f32) and meet
    /// it with the activation block's exact sum `d_y Σq_y`, so the result is
    /// Q4_0's integer arithmetic. Unpacked, the scales are padded to 32 bytes
    /// so that the quants stay aligned as Q4_1's do.
    Q4_0,
    /// Scale and min per block; quants 0..15.
    Q4_1,
    /// Scale per block; quants 0..31 stored offset by 16 (the offset comes
    /// back as `16 d Σy` from the activation sums).
    Q5_0,
    /// Scale per block; signed 8-bit quants.
    Q8_0,
    /// Super-blocks of 256: f16 scale and min, 6-bit scale and min per
    /// 32-element sub-block, quants 0..15.
    Q4_K,
    /// Super-blocks of 256: f16 scale, signed 8-bit scale per 16 elements,
    /// quants 0..63 read as `q - 32`.
    Q6_K,
}

impl PackedFormat {
    /// The repacked layout for a file type, where there is one.
    pub fn of(ty: GgmlType) -> Option<PackedFormat> {
        match ty {
            GgmlType::Q4_0 => Some(PackedFormat::Q4_0),
            GgmlType::Q4_1 => Some(PackedFormat::Q4_1),
            GgmlType::Q5_0 => Some(PackedFormat::Q5_0),
            GgmlType::Q8_0 => Some(PackedFormat::Q8_0),
            GgmlType::Q4_K => Some(PackedFormat::Q4_K),
            GgmlType::Q6_K => Some(PackedFormat::Q6_K),
            _ => None,
        }
    }

    pub fn ggml_type(self) -> GgmlType {
        match self {
            PackedFormat::Q4_0 => GgmlType::Q4_0,
            PackedFormat::Q4_1 => GgmlType::Q4_1,
            PackedFormat::Q5_0 => GgmlType::Q5_0,
            PackedFormat::Q8_0 => GgmlType::Q8_0,
            PackedFormat::Q4_K => GgmlType::Q4_K,
            PackedFormat::Q6_K => GgmlType::Q6_K,
        }
    }

    /// Elements per block of the format (32, or a K-quant's super-block of 256).
    pub const fn block_elems(self) -> usize {
        match self {
            PackedFormat::Q4_0 | PackedFormat::Q4_1 | PackedFormat::Q5_0 | PackedFormat::Q8_0 => QK,
            PackedFormat::Q4_K | PackedFormat::Q6_K => QK_K,
        }
    }

    /// Bytes of one block of a group: eight rows' scales and quants.
    pub const fn block_bytes(self) -> usize {
        match self {
            // d[8] f16, m[8] f16, 4 registers of nibble pairs
            PackedFormat::Q4_1 => 32 + 128,
            // d[8] f16, 4 registers of nibble pairs
            PackedFormat::Q4_0 => 16 + 128,
            // d[8] f16, fifth bits (32 bytes), 4 registers of nibble pairs
            PackedFormat::Q5_0 => 16 + 32 + 128,
            // d[8] f16, 8 registers of bytes
            PackedFormat::Q8_0 => 16 + 256,
            // d[8], dmin[8] f16, scales[8 sub][8 rows], mins[8 sub][8 rows],
            // then per 32-element sub-block 4 registers of nibble pairs
            PackedFormat::Q4_K => Q4_K_QUANTS + 8 * 128,
            // d[8] f16, scales[16 sub][8 rows] i8, then per 32 elements 4
            // registers of nibble pairs and 64 bytes of high bits
            PackedFormat::Q6_K => Q6_K_QUANTS + 8 * (128 + 64),
        }
    }

    /// Bytes of one block of a group in the unpacked layout, for the formats
    /// that have one.
    pub const fn unpacked_block_bytes(self) -> Option<usize> {
        match self {
            PackedFormat::Q4_0 | PackedFormat::Q4_1 => Some(32 + 256),
            PackedFormat::Q5_0 => Some(16 + 256),
            PackedFormat::Q8_0 => None,
            PackedFormat::Q4_K => Some(Q4_K_QUANTS + 8 * 256),
            PackedFormat::Q6_K => Some(Q6_K_QUANTS + 8 * 256),
        }
    }

    /// Bytes of one unpacked group of rows of `k` elements.
    pub fn unpacked_group_bytes(self, k: usize) -> Option<usize> {
        Some(self.group_bytes(k)? / self.block_bytes() * self.unpacked_block_bytes()?)
    }

    /// Bytes of one group of [`GROUP`] rows of `k` elements, or `None` when
    /// `k` is not a whole number of blocks.
    pub fn group_bytes(self, k: usize) -> Option<usize> {
        if !k.is_multiple_of(self.block_elems()) || k == 0 {
            return None;
        }
        Some(k / self.block_elems() * self.block_bytes())
    }

    /// Bytes of a matrix of `rows` rows of `k` elements, its last group padded.
    pub fn matrix_bytes(self, rows: usize, k: usize) -> Option<usize> {
        Some(rows.div_ceil(GROUP) * self.group_bytes(k)?)
    }

    /// Repacks up to [`GROUP`] consecutive rows of `k` elements, given as the
    /// file's bytes `src` (a whole number of rows), into one group `dst`
    /// (exactly [`group_bytes`](Self::group_bytes) long; rows past the ones
    /// given are zeros).
    pub fn pack_group(self, k: usize, src: &[u8], dst: &mut [u8]) -> Result<(), QuantError> {
        self.pack_group_from(self.ggml_type(), k, src, dst)
    }

    /// [`pack_group`](Self::pack_group) from rows of file type `ty`, which is
    /// the layout's own or one that [`of`](Self::of) maps to it (Q4_0 into
    /// Q5_0's layout).
    pub fn pack_group_from(self, ty: GgmlType, k: usize, src: &[u8], dst: &mut [u8]) -> Result<(), QuantError> {
        if PackedFormat::of(ty) != Some(self) {
            return Err(QuantError::Unsupported { ty, op: "repacking into this layout" });
        }
        let format = ty.name();
        let want =
            self.group_bytes(k).ok_or(QuantError::NotBlockMultiple { format, n: k, block: self.block_elems() })?;
        let row_len = ty.row_bytes(k as u64).unwrap() as usize;
        if src.is_empty() || !src.len().is_multiple_of(row_len) || src.len() / row_len > GROUP {
            return Err(QuantError::Length {
                format,
                what: "file rows of a group",
                expected: GROUP * row_len,
                got: src.len(),
            });
        }
        if dst.len() != want {
            return Err(QuantError::Length { format, what: "repacked group", expected: want, got: dst.len() });
        }
        dst.fill(0);
        let bb = self.block_bytes();
        for (r, row) in src.chunks_exact(row_len).enumerate() {
            match self {
                PackedFormat::Q4_0 => {
                    for (b, x) in as_blocks::<BlockQ4_0>(row).iter().enumerate() {
                        let blk = &mut dst[b * bb..(b + 1) * bb];
                        put_f16(blk, r, x.d);
                        put_nibble_regs(&mut blk[16..], r, &unpack_nibbles(&x.qs));
                    }
                }
                PackedFormat::Q4_1 => {
                    for (b, x) in as_blocks::<BlockQ4_1>(row).iter().enumerate() {
                        let blk = &mut dst[b * bb..(b + 1) * bb];
                        put_f16(blk, r, x.d);
                        put_f16(&mut blk[16..], r, x.m);
                        put_nibble_regs(&mut blk[32..], r, &unpack_nibbles(&x.qs));
                    }
                }
                PackedFormat::Q5_0 => {
                    for (b, x) in as_blocks::<BlockQ5_0>(row).iter().enumerate() {
                        let blk = &mut dst[b * bb..(b + 1) * bb];
                        put_f16(blk, r, x.d);
                        let h = u32::from_le_bytes(x.qh);
                        for e in 0..QK {
                            blk[16 + 4 * r + e % 4] |= (((h >> e) & 1) as u8) << (e / 4);
                        }
                        put_nibble_regs(&mut blk[48..], r, &unpack_nibbles(&x.qs));
                    }
                }
                PackedFormat::Q8_0 => {
                    for (b, x) in as_blocks::<BlockQ8_0>(row).iter().enumerate() {
                        let blk = &mut dst[b * bb..(b + 1) * bb];
                        put_f16(blk, r, x.d);
                        for (e, &q) in x.qs.iter().enumerate() {
                            blk[16 + 32 * (e / 4) + 4 * r + e % 4] = q as u8;
                        }
                    }
                }
                PackedFormat::Q4_K => {
                    for (b, x) in as_blocks::<BlockQ4K>(row).iter().enumerate() {
                        let blk = &mut dst[b * bb..(b + 1) * bb];
                        put_f16(blk, r, x.d);
                        put_f16(&mut blk[16..], r, x.dmin);
                        for j in 0..8 {
                            let (sc, m) = get_scale_min_k4(j, &x.scales);
                            blk[32 + 8 * j + r] = sc;
                            blk[96 + 8 * j + r] = m;
                            let mut q = [0u8; QK];
                            for (l, q) in q.iter_mut().enumerate() {
                                let byte = x.qs[32 * (j / 2) + l];
                                *q = if j % 2 == 0 { byte & 0xF } else { byte >> 4 };
                            }
                            put_nibble_regs(&mut blk[Q4_K_QUANTS + 128 * j..], r, &q);
                        }
                    }
                }
                PackedFormat::Q6_K => {
                    for (b, x) in as_blocks::<BlockQ6K>(row).iter().enumerate() {
                        let blk = &mut dst[b * bb..(b + 1) * bb];
                        put_f16(blk, r, x.d);
                        for (j, &sc) in x.scales.iter().enumerate() {
                            blk[16 + 8 * j + r] = sc as u8;
                        }
                        let q = q6_k_elements(x);
                        for j in 0..8 {
                            let sub = &mut blk[Q6_K_QUANTS + 192 * j..Q6_K_QUANTS + 192 * (j + 1)];
                            let q = &q[QK * j..QK * (j + 1)];
                            let mut low = [0u8; QK];
                            for (l, v) in low.iter_mut().enumerate() {
                                *v = q[l] & 0xF;
                            }
                            put_nibble_regs(sub, r, &low);
                            // Element e's two high bits go to bits 2p, 2p+1 of
                            // byte 4 r + e % 4 of plane e / 16, p = (e % 16) / 4.
                            for (e, &v) in q.iter().enumerate() {
                                sub[128 + 32 * (e / 16) + 4 * r + e % 4] |= (v >> 4) << (2 * ((e % 16) / 4));
                            }
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Repacks a whole matrix of `rows` rows of `k` elements from the file's
    /// bytes, in [`matrix_bytes`](Self::matrix_bytes).
    pub fn pack_matrix(self, rows: usize, k: usize, src: &[u8]) -> Result<Vec<u8>, QuantError> {
        let format = self.ggml_type().name();
        let gb = self.group_bytes(k).ok_or(QuantError::NotBlockMultiple { format, n: k, block: self.block_elems() })?;
        let row_len = self.ggml_type().row_bytes(k as u64).unwrap() as usize;
        if src.len() != rows * row_len {
            return Err(QuantError::Length { format, what: "file matrix", expected: rows * row_len, got: src.len() });
        }
        let mut out = vec![0u8; rows.div_ceil(GROUP) * gb];
        for (dst, src) in out.chunks_exact_mut(gb).zip(src.chunks(GROUP * row_len)) {
            self.pack_group(k, src, dst)?;
        }
        Ok(out)
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

/// A Q6_K block's 256 quants in element order, unsigned (0..63; the value is `q - 32`).
fn q6_k_elements(x: &BlockQ6K) -> [u8; QK_K] {
    std::array::from_fn(|e| {
        let (n, l, i) = (e / 128, e % 32, (e % 128) / 32);
        (q6k_quants(&x.ql[64 * n..64 * n + 64], &x.qh[32 * n..32 * n + 32], l)[i] + 32) as u8
    })
}

/// Row `r`'s 32 4-bit elements into a block's four nibble-pair registers.
fn put_nibble_regs(regs: &mut [u8], r: usize, q: &[u8; QK]) {
    for e in 0..16 {
        regs[32 * (e / 4) + 4 * r + e % 4] |= q[e] | (q[e + 16] << 4);
    }
}

/// Element `e` (0..32) of row `r` in a block's nibble-pair registers.
#[inline]
pub(crate) fn nibble_at(regs: &[u8], r: usize, e: usize) -> u8 {
    let byte = regs[32 * ((e % 16) / 4) + 4 * r + e % 4];
    if e < 16 {
        byte & 0xF
    } else {
        byte >> 4
    }
}

// ---- activations ----

/// Bytes of one activation row of `k` elements in the tile kernels' layout:
/// `d[nb]`, `s[nb]`, `dsum[nb]` as f32, `hsum[nb]` as two i16 (the sums of
/// each half block's quants, for Q6_K's offset), then `nb * 32` i8 quants.
pub fn act_row_bytes(k: usize) -> Option<usize> {
    if !k.is_multiple_of(QK) || k == 0 {
        return None;
    }
    Some(k / QK * (16 + QK))
}

/// Quantizes one activation row as llama.cpp's x86 backend quantizes Q8_0 and
/// Q8_1 (the same quants and scale for both), keeping per block: `d` rounded
/// to f16 as the file formats store it, `s = f16(d Σq)` as Q8_1 stores it
/// (Q4_1's min term), and `dsum = f16(d) Σq` unrounded (Q5_0's offset term).
pub fn quantize_act_row(x: &[f32], out: &mut [u8]) -> Result<(), QuantError> {
    let (nb, head, qs) = act_row_parts(x, out)?;
    #[cfg(target_arch = "x86_64")]
    if crate::kernels::level() >= crate::SimdLevel::Avx2 {
        // SAFETY: AVX2/FMA/F16C checked above; `act_row_parts` checked that
        // `x` holds `nb` blocks, `head` 16 bytes and `qs` 32 bytes a block.
        unsafe { crate::kernels::x86::avx2_act::quantize_row(x.as_ptr(), nb, head.as_mut_ptr(), qs.as_mut_ptr()) };
        return Ok(());
    }
    quantize_act_blocks(x, nb, head, qs);
    Ok(())
}

/// [`quantize_act_row`] without SIMD: the definition the vector form is
/// tested against.
pub fn quantize_act_row_scalar(x: &[f32], out: &mut [u8]) -> Result<(), QuantError> {
    let (nb, head, qs) = act_row_parts(x, out)?;
    quantize_act_blocks(x, nb, head, qs);
    Ok(())
}

/// An activation row's block count, head and quants, once its length is checked.
fn act_row_parts<'a>(x: &[f32], out: &'a mut [u8]) -> Result<(usize, &'a mut [u8], &'a mut [u8]), QuantError> {
    let k = x.len();
    let format = "packed Q8 activations";
    let want = act_row_bytes(k).ok_or(QuantError::NotBlockMultiple { format, n: k, block: QK })?;
    if out.len() != want {
        return Err(QuantError::Length { format, what: "activation row", expected: want, got: out.len() });
    }
    let nb = k / QK;
    let (head, qs) = out.split_at_mut(16 * nb);
    Ok((nb, head, qs))
}

fn quantize_act_blocks(x: &[f32], nb: usize, head: &mut [u8], qs: &mut [u8]) {
    for (b, x) in x.chunks_exact(QK).enumerate() {
        let (d, q, sum) = q8_block(x, Q8Rounding::X86);
        let half = |h: &[i8]| h.iter().map(|&v| v as i32).sum::<i32>();
        put_act_head(head, nb, b, d, sum, [half(&q[..16]), half(&q[16..])]);
        for (o, &v) in qs[QK * b..QK * (b + 1)].iter_mut().zip(&q) {
            *o = v as u8;
        }
    }
}

/// Block `b`'s scale and sums into a row's head (see [`act_row_bytes`]).
fn put_act_head(head: &mut [u8], nb: usize, b: usize, d: f32, sum: i32, halves: [i32; 2]) {
    let d16 = f16::from_f32(d).to_f32();
    let s = f16::from_f32(sum as f32 * d).to_f32();
    let dsum = d16 * sum as f32;
    head[4 * b..4 * b + 4].copy_from_slice(&d16.to_le_bytes());
    head[4 * (nb + b)..4 * (nb + b) + 4].copy_from_slice(&s.to_le_bytes());
    head[4 * (2 * nb + b)..4 * (2 * nb + b) + 4].copy_from_slice(&dsum.to_le_bytes());
    head[4 * (3 * nb + b)..4 * (3 * nb + b) + 2].copy_from_slice(&(halves[0] as i16).to_le_bytes());
    head[4 * (3 * nb + b) + 2..4 * (3 * nb + b) + 4].copy_from_slice(&(halves[1] as i16).to_le_bytes());
}
