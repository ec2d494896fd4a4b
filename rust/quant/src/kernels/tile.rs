//! Tile kernels: groups of repacked weight rows (see [`crate::packed`])
//! against up to [`MAX_TILE_COLS`] activation columns at once, so each weight
//! block is unpacked once for every column of a pass. The scalar twins here
//! define the arithmetic; the SIMD kernels are tested against them.

use half::f16;

use crate::packed::{nibble_at, PackedFormat, GROUP, Q4_K_QUANTS, Q6_K_QUANTS};

/// The most activation columns one tile call takes.
pub const MAX_TILE_COLS: usize = 4;

/// `out[j * out_stride + r] = dot(row r, column j)` for `r < rows`, `j < n`,
/// `n <= MAX_TILE_COLS`. `w` holds the `rows.div_ceil(GROUP)` groups that
/// [`PackedFormat::pack_group`] wrote for those rows (`k` elements each);
/// column `j` is the activation row at `acts[j * act_stride..]`, written by
/// [`crate::packed::quantize_act_row`]. Taking a run of groups per call keeps
/// the dispatch and the bounds checks out of the per-row cost, which matters
/// for short rows (a 640-wide head of 262,144 rows).
pub type TileFn =
    fn(k: usize, w: &[u8], rows: usize, acts: &[u8], act_stride: usize, n: usize, out: &mut [f32], out_stride: usize);

/// Unpacks `groups` consecutive groups of rows of `k` elements (the bytes
/// [`PackedFormat::pack_group`] wrote) into `dst`, in the format's unpacked
/// layout ([`PackedFormat::unpacked_group_bytes`] a group).
pub type UnpackFn = fn(k: usize, w: &[u8], groups: usize, dst: &mut [u8]);

/// A pass of many columns unpacks a tile of rows once with `unpack` and
/// meets it with every group of columns through `tile`, a [`TileFn`] over
/// unpacked groups that gives the packed kernel's results bit for bit:
/// building each register of quants from nibbles and high bits is then paid
/// once per tile, not once per group of columns.
#[derive(Clone, Copy)]
pub struct UnpackedTile {
    pub unpack: UnpackFn,
    pub tile: TileFn,
}

/// Checks the slices the unsafe kernels will read; a violation is a bug in
/// the caller, so it panics rather than reads out of bounds. Returns the
/// bytes of one group.
#[inline]
#[allow(clippy::too_many_arguments)]
pub(crate) fn check_tile(
    fmt: PackedFormat,
    unpacked: bool,
    k: usize,
    w: &[u8],
    rows: usize,
    acts: &[u8],
    act_stride: usize,
    n: usize,
    out: &[f32],
    out_stride: usize,
) -> usize {
    let act_bytes = crate::packed::act_row_bytes(k).expect("k is a whole number of blocks");
    let gb = if unpacked { fmt.unpacked_group_bytes(k) } else { fmt.group_bytes(k) }.unwrap();
    assert!((1..=MAX_TILE_COLS).contains(&n), "tile of {n} columns");
    assert!(
        rows == 0 || (out_stride >= rows || n == 1) && out.len() >= (n - 1) * out_stride + rows,
        "output too short"
    );
    assert!(w.len() >= rows.div_ceil(GROUP) * gb, "weight groups too short");
    assert!(act_stride >= act_bytes && acts.len() >= (n - 1) * act_stride + act_bytes, "activation rows too short");
    gb
}

/// An activation column's parts: per-block scales `d`, Q8_1 sums `s`, exact
/// sums `dsum`, half-block quant sums `hsum` (two i16 per block), and the
/// quants.
pub(crate) struct Col<'a> {
    pub d: &'a [u8],
    pub s: &'a [u8],
    pub dsum: &'a [u8],
    pub hsum: &'a [u8],
    pub qs: &'a [u8],
}

pub(crate) fn col(k: usize, acts: &[u8], stride: usize, j: usize) -> Col<'_> {
    let nb = k / 32;
    let a = &acts[j * stride..];
    let f = 4 * nb;
    Col { d: &a[..f], s: &a[f..2 * f], dsum: &a[2 * f..3 * f], hsum: &a[3 * f..4 * f], qs: &a[4 * f..4 * f + 32 * nb] }
}

/// Half `h` (0 or 1) of block `b`'s quant sums.
#[inline]
fn half_sum(c: &Col, b: usize, h: usize) -> i32 {
    i16::from_le_bytes([c.hsum[4 * b + 2 * h], c.hsum[4 * b + 2 * h + 1]]) as i32
}

#[inline]
pub(crate) fn f32_at(b: &[u8], i: usize) -> f32 {
    f32::from_le_bytes(b[4 * i..4 * i + 4].try_into().unwrap())
}

#[inline]
pub(crate) fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[2 * i], b[2 * i + 1]])).to_f32()
}

/// Runs `row(block bytes, r, column)` → value for every row and column of a
/// tile, one group at a time.
#[allow(clippy::too_many_arguments)]
fn each_dot(
    fmt: PackedFormat,
    k: usize,
    w: &[u8],
    rows: usize,
    acts: &[u8],
    act_stride: usize,
    n: usize,
    out: &mut [f32],
    out_stride: usize,
    dot: impl Fn(&[u8], usize, &Col) -> f32,
) {
    let gb = check_tile(fmt, false, k, w, rows, acts, act_stride, n, out, out_stride);
    for r in 0..rows {
        let group = &w[(r / GROUP) * gb..(r / GROUP + 1) * gb];
        for j in 0..n {
            out[j * out_stride + r] = dot(group, r % GROUP, &col(k, acts, act_stride, j));
        }
    }
}

// Each twin rounds exactly as the SIMD kernels do (fused multiply-adds
// included), so the two agree bit for bit: per block, the scaled block sum,
// then any per-block constant term (a min, an offset).

/// Q4_0: the block's min `-8 d`, made from its scale, meets the exact activation sum.
#[allow(clippy::too_many_arguments)]
pub fn tile_q4_0(
    k: usize,
    w: &[u8],
    rows: usize,
    acts: &[u8],
    act_stride: usize,
    n: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    let min = |blk: &[u8], r: usize| f16_at(blk, r) * -8.0;
    tile_q4(PackedFormat::Q4_0, 16, min, |c| c.dsum, k, w, rows, acts, act_stride, n, out, out_stride);
}

/// Q4_1: the block's stored min meets the activation block's f16-rounded sum, as llama.cpp's Q8_1.
#[allow(clippy::too_many_arguments)]
pub fn tile_q4_1(
    k: usize,
    w: &[u8],
    rows: usize,
    acts: &[u8],
    act_stride: usize,
    n: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    let min = |blk: &[u8], r: usize| f16_at(&blk[16..], r);
    tile_q4(PackedFormat::Q4_1, 32, min, |c| c.s, k, w, rows, acts, act_stride, n, out, out_stride);
}

/// A 32-element block format of scale, min and nibbles (quants at byte
/// `quants` of a block): per block the scaled integer sum, then the min
/// times the activation sum `sums` gives.
#[allow(clippy::too_many_arguments)]
fn tile_q4(
    fmt: PackedFormat,
    quants: usize,
    min: impl Fn(&[u8], usize) -> f32,
    sums: for<'c> fn(&'c Col<'c>) -> &'c [u8],
    k: usize,
    w: &[u8],
    rows: usize,
    acts: &[u8],
    act_stride: usize,
    n: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    let bb = fmt.block_bytes();
    each_dot(fmt, k, w, rows, acts, act_stride, n, out, out_stride, |g, r, c| {
        let mut acc = 0.0f32;
        for b in 0..k / 32 {
            let blk = &g[b * bb..(b + 1) * bb];
            let isum: i32 =
                (0..32).map(|e| nibble_at(&blk[quants..], r, e) as i32 * c.qs[32 * b + e] as i8 as i32).sum();
            acc = (f16_at(blk, r) * f32_at(c.d, b)).mul_add(isum as f32, acc);
            acc = min(blk, r).mul_add(f32_at(sums(c), b), acc);
        }
        acc
    });
}

#[allow(clippy::too_many_arguments)]
pub fn tile_q5_0(
    k: usize,
    w: &[u8],
    rows: usize,
    acts: &[u8],
    act_stride: usize,
    n: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    let bb = PackedFormat::Q5_0.block_bytes();
    each_dot(PackedFormat::Q5_0, k, w, rows, acts, act_stride, n, out, out_stride, |g, r, c| {
        let mut acc = 0.0f32;
        for b in 0..k / 32 {
            let blk = &g[b * bb..(b + 1) * bb];
            let isum: i32 = (0..32)
                .map(|e| {
                    let hi = (blk[16 + 4 * r + e % 4] >> (e / 4)) & 1;
                    (nibble_at(&blk[48..], r, e) | hi << 4) as i32 * c.qs[32 * b + e] as i8 as i32
                })
                .sum();
            // The quants were stored offset by 16: take 16 d_y Σq_y back.
            let t = (isum as f32).mul_add(f32_at(c.d, b), -16.0 * f32_at(c.dsum, b));
            acc = f16_at(blk, r).mul_add(t, acc);
        }
        acc
    });
}

#[allow(clippy::too_many_arguments)]
pub fn tile_q8_0(
    k: usize,
    w: &[u8],
    rows: usize,
    acts: &[u8],
    act_stride: usize,
    n: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    let bb = PackedFormat::Q8_0.block_bytes();
    each_dot(PackedFormat::Q8_0, k, w, rows, acts, act_stride, n, out, out_stride, |g, r, c| {
        let mut acc = 0.0f32;
        for b in 0..k / 32 {
            let blk = &g[b * bb..(b + 1) * bb];
            let isum: i32 = (0..32)
                .map(|e| blk[16 + 32 * (e / 4) + 4 * r + e % 4] as i8 as i32 * c.qs[32 * b + e] as i8 as i32)
                .sum();
            acc = (f16_at(blk, r) * f32_at(c.d, b)).mul_add(isum as f32, acc);
        }
        acc
    });
}

#[allow(clippy::too_many_arguments)]
pub fn tile_q4_k(
    k: usize,
    w: &[u8],
    rows: usize,
    acts: &[u8],
    act_stride: usize,
    n: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    let bb = PackedFormat::Q4_K.block_bytes();
    each_dot(PackedFormat::Q4_K, k, w, rows, acts, act_stride, n, out, out_stride, |g, r, c| {
        let mut acc = 0.0f32;
        for sb in 0..k / 256 {
            let blk = &g[sb * bb..(sb + 1) * bb];
            let (d, dmin) = (f16_at(blk, r), f16_at(&blk[16..], r));
            for j in 0..8 {
                let b = 8 * sb + j;
                let regs = &blk[Q4_K_QUANTS + 128 * j..];
                let isum: i32 = (0..32).map(|e| nibble_at(regs, r, e) as i32 * c.qs[32 * b + e] as i8 as i32).sum();
                let (dx, mx) = (d * blk[32 + 8 * j + r] as f32, dmin * blk[96 + 8 * j + r] as f32);
                acc = (dx * f32_at(c.d, b)).mul_add(isum as f32, acc);
                acc = (-mx).mul_add(f32_at(c.dsum, b), acc);
            }
        }
        acc
    });
}

#[allow(clippy::too_many_arguments)]
pub fn tile_q6_k(
    k: usize,
    w: &[u8],
    rows: usize,
    acts: &[u8],
    act_stride: usize,
    n: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    let bb = PackedFormat::Q6_K.block_bytes();
    each_dot(PackedFormat::Q6_K, k, w, rows, acts, act_stride, n, out, out_stride, |g, r, c| {
        let mut acc = 0.0f32;
        for sb in 0..k / 256 {
            let blk = &g[sb * bb..(sb + 1) * bb];
            for j in 0..8 {
                let b = 8 * sb + j;
                let sub = &blk[Q6_K_QUANTS + 192 * j..];
                let mut isum = 0i32;
                for h in 0..2 {
                    let sc = blk[16 + 8 * (2 * j + h) + r] as i8 as i32;
                    let dot: i32 = (16 * h..16 * h + 16)
                        .map(|e| {
                            let hi = (sub[128 + 32 * h + 4 * r + e % 4] >> (2 * ((e % 16) / 4))) & 3;
                            (nibble_at(sub, r, e) | hi << 4) as i32 * c.qs[32 * b + e] as i8 as i32
                        })
                        .sum();
                    // Unsigned quants: the -32 comes back through the half's sum.
                    isum += sc * (dot - 32 * half_sum(c, b, h));
                }
                acc = (f16_at(blk, r) * f32_at(c.d, b)).mul_add(isum as f32, acc);
            }
        }
        acc
    });
}

/// The scalar tile kernel for a repacked format.
pub fn scalar_tile_fn(fmt: PackedFormat) -> TileFn {
    match fmt {
        PackedFormat::Q4_0 => tile_q4_0,
        PackedFormat::Q4_1 => tile_q4_1,
        PackedFormat::Q5_0 => tile_q5_0,
        PackedFormat::Q8_0 => tile_q8_0,
        PackedFormat::Q4_K => tile_q4_k,
        PackedFormat::Q6_K => tile_q6_k,
    }
}
