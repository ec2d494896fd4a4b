//! Tile kernels: one repacked weight row against up to [`MAX_TILE_COLS`]
//! activation columns at once, so each weight block is unpacked once for
//! every column of a pass. The scalar twins here define the arithmetic; the
//! SIMD kernels are tested against them.

use half::f16;

use crate::packed::{PackedFormat, RowLayout};

/// The most activation columns one tile call takes.
pub const MAX_TILE_COLS: usize = 4;

/// `out[j * out_stride + r] = dot(row r, column j)` for `r < rows`, `j < n`,
/// `n <= MAX_TILE_COLS`. `w` holds `rows` consecutive rows repacked by
/// [`PackedFormat::pack_row`] for `k` elements; column `j` is the activation
/// row at `acts[j * act_stride..]`, written by
/// [`crate::packed::quantize_act_row`]. Taking a run of rows per call keeps
/// the dispatch and the bounds checks out of the per-row cost, which matters
/// for short rows (a 640-wide head of 262,144 rows).
pub type TileFn = fn(k: usize, w: &[u8], rows: usize, acts: &[u8], act_stride: usize, n: usize, out: &mut [f32], out_stride: usize);

/// Checks the slices the unsafe kernels will read; a violation is a bug in
/// the caller, so it panics rather than reads out of bounds.
#[inline]
#[allow(clippy::too_many_arguments)]
pub(crate) fn check_tile(fmt: PackedFormat, k: usize, w: &[u8], rows: usize, acts: &[u8], act_stride: usize, n: usize, out: &[f32], out_stride: usize) -> usize {
    let act_bytes = crate::packed::act_row_bytes(k).expect("k is a whole number of blocks");
    let rb = fmt.row_bytes(k).unwrap();
    assert!((1..=MAX_TILE_COLS).contains(&n), "tile of {n} columns");
    assert!(rows == 0 || (out_stride >= rows || n == 1) && out.len() >= (n - 1) * out_stride + rows, "output too short");
    assert!(w.len() >= rows * rb, "weight rows too short");
    assert!(act_stride >= act_bytes && acts.len() >= (n - 1) * act_stride + act_bytes, "activation rows too short");
    rb
}

/// An activation column's parts.
pub(crate) struct Col<'a> {
    pub d: &'a [u8],
    pub s: &'a [u8],
    pub dsum: &'a [u8],
    pub qs: &'a [u8],
}

pub(crate) fn col<'a>(l: &RowLayout, acts: &'a [u8], stride: usize, j: usize) -> Col<'a> {
    let a = &acts[j * stride..];
    let f = 4 * l.nbp;
    Col { d: &a[..f], s: &a[f..2 * f], dsum: &a[2 * f..3 * f], qs: &a[3 * f..3 * f + 32 * l.nbe] }
}

#[inline]
pub(crate) fn f32_at(b: &[u8], i: usize) -> f32 {
    f32::from_le_bytes(b[4 * i..4 * i + 4].try_into().unwrap())
}

#[inline]
pub(crate) fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[2 * i], b[2 * i + 1]])).to_f32()
}

/// Element `e` of block `b` from a nibble-pair region.
#[inline]
fn nibble(qs: &[u8], b: usize, e: usize) -> i32 {
    ((qs[32 * (b / 2) + e] >> (4 * (b % 2))) & 0xF) as i32
}

#[allow(clippy::too_many_arguments)]
pub fn tile_q4_1(k: usize, w: &[u8], rows: usize, acts: &[u8], act_stride: usize, n: usize, out: &mut [f32], out_stride: usize) {
    let rb = check_tile(PackedFormat::Q4_1, k, w, rows, acts, act_stride, n, out, out_stride);
    for r in 0..rows {
        row_q4_1(k, &w[r * rb..(r + 1) * rb], acts, act_stride, n, |j, v| out[j * out_stride + r] = v);
    }
}

fn row_q4_1(k: usize, w_row: &[u8], acts: &[u8], act_stride: usize, n: usize, mut put: impl FnMut(usize, f32)) {
    let l = RowLayout::new(k);
    let (scales, qs) = w_row.split_at(4 * l.nbp);
    for j in 0..n {
        let c = col(&l, acts, act_stride, j);
        let mut sum = 0.0f32;
        for b in 0..l.nb {
            let isum: i32 = (0..32).map(|e| nibble(qs, b, e) * c.qs[32 * b + e] as i8 as i32).sum();
            sum += f16_at(scales, b) * f32_at(c.d, b) * isum as f32 + f16_at(scales, l.nbp + b) * f32_at(c.s, b);
        }
        put(j, sum);
    }
}

#[allow(clippy::too_many_arguments)]
pub fn tile_q5_0(k: usize, w: &[u8], rows: usize, acts: &[u8], act_stride: usize, n: usize, out: &mut [f32], out_stride: usize) {
    let rb = check_tile(PackedFormat::Q5_0, k, w, rows, acts, act_stride, n, out, out_stride);
    for r in 0..rows {
        row_q5_0(k, &w[r * rb..(r + 1) * rb], acts, act_stride, n, |j, v| out[j * out_stride + r] = v);
    }
}

fn row_q5_0(k: usize, w_row: &[u8], acts: &[u8], act_stride: usize, n: usize, mut put: impl FnMut(usize, f32)) {
    let l = RowLayout::new(k);
    let (scales, rest) = w_row.split_at(2 * l.nbp);
    let (qh, qs) = rest.split_at(4 * l.nbe);
    for j in 0..n {
        let c = col(&l, acts, act_stride, j);
        let mut sum = 0.0f32;
        for b in 0..l.nb {
            let h = u32::from_le_bytes(qh[4 * b..4 * b + 4].try_into().unwrap());
            let isum: i32 = (0..32)
                .map(|e| (nibble(qs, b, e) | (((h >> e) & 1) << 4) as i32) * c.qs[32 * b + e] as i8 as i32)
                .sum();
            let dx = f16_at(scales, b);
            sum += dx * f32_at(c.d, b) * isum as f32 - 16.0 * dx * f32_at(c.dsum, b);
        }
        put(j, sum);
    }
}

#[allow(clippy::too_many_arguments)]
pub fn tile_q8_0(k: usize, w: &[u8], rows: usize, acts: &[u8], act_stride: usize, n: usize, out: &mut [f32], out_stride: usize) {
    let rb = check_tile(PackedFormat::Q8_0, k, w, rows, acts, act_stride, n, out, out_stride);
    for r in 0..rows {
        row_q8_0(k, &w[r * rb..(r + 1) * rb], acts, act_stride, n, |j, v| out[j * out_stride + r] = v);
    }
}

fn row_q8_0(k: usize, w_row: &[u8], acts: &[u8], act_stride: usize, n: usize, mut put: impl FnMut(usize, f32)) {
    let l = RowLayout::new(k);
    let (scales, qs) = w_row.split_at(2 * l.nbp);
    for j in 0..n {
        let c = col(&l, acts, act_stride, j);
        let mut sum = 0.0f32;
        for b in 0..l.nb {
            let isum: i32 = (0..32).map(|e| qs[32 * b + e] as i8 as i32 * c.qs[32 * b + e] as i8 as i32).sum();
            sum += f16_at(scales, b) * f32_at(c.d, b) * isum as f32;
        }
        put(j, sum);
    }
}

/// The scalar tile kernel for a repacked format.
pub fn scalar_tile_fn(fmt: PackedFormat) -> TileFn {
    match fmt {
        PackedFormat::Q4_1 => tile_q4_1,
        PackedFormat::Q5_0 => tile_q5_0,
        PackedFormat::Q8_0 => tile_q8_0,
    }
}
