//! Matrix products of the forward pass: a weight matrix in its file format
//! against a batch of activation rows quantized once to the format its kernel
//! dots with.
//!
//! Work is split by weight rows, and each row meets every column of the batch
//! while it is hot in cache, so a pass of several tokens reads the weights once.

use ember_quant::packed::GROUP;
use ember_quant::{ActType, MAX_DOT_COLS, MAX_TILE_COLS};

use crate::pool::{Pool, SyncPtr};
use crate::weights::{ActFormat, Matrix, PackedRows};

/// Activation rows, quantized on first use per format and reused by every
/// matrix of that format reading the same input (q, k and v share one).
#[derive(Default)]
pub struct Acts {
    entries: Vec<(ActFormat, Vec<u8>, bool)>,
}

impl Acts {
    /// Forgets the quantized rows: the input they came from has changed.
    pub fn invalidate(&mut self) {
        for e in &mut self.entries {
            e.2 = false;
        }
    }

    /// The `t` rows of `x` (each `k` wide) in format `act`.
    pub fn get(&mut self, pool: &Pool, act: ActFormat, x: &[f32], t: usize, k: usize) -> &[u8] {
        let i = match self.entries.iter().position(|e| e.0 == act) {
            Some(i) => i,
            None => {
                self.entries.push((act, Vec::new(), false));
                self.entries.len() - 1
            }
        };
        let e = &mut self.entries[i];
        if !e.2 {
            let rb = match act {
                ActFormat::File(a) => ember_quant::act_row_bytes(a, k),
                ActFormat::Packed => ember_quant::packed::act_row_bytes(k),
            }
            .expect("row width checked when the weights were bound");
            e.1.resize(rb * t, 0);
            pool.rows_mut(&mut e.1[..rb * t], rb, |j, dst| quantize_into(act, &x[j * k..(j + 1) * k], dst));
            e.2 = true;
        }
        &self.entries[i].1
    }
}

/// One activation row written in place (the token loop allocates nothing).
fn quantize_into(act: ActFormat, src: &[f32], dst: &mut [u8]) {
    let act = match act {
        ActFormat::Packed => {
            ember_quant::packed::quantize_act_row(src, dst).expect("row width checked at bind");
            return;
        }
        ActFormat::File(a) => a,
    };
    match act {
        ActType::Q8_0 => ember_quant::quantize_row_q8_0(src, dst).expect("row width checked at bind"),
        ActType::Q8_1 => ember_quant::quantize_row_q8_1(src, dst).expect("row width checked at bind"),
        ActType::Q8_K => ember_quant::quantize_row_q8_K(src, dst).expect("row width checked at bind"),
        ActType::F32 => {
            for (o, v) in dst.chunks_exact_mut(4).zip(src) {
                o.copy_from_slice(&v.to_le_bytes());
            }
        }
        ActType::F16 => {
            for (o, &v) in dst.chunks_exact_mut(2).zip(src) {
                o.copy_from_slice(&half::f16::from_f32(v).to_bits().to_le_bytes());
            }
        }
        ActType::BF16 => {
            for (o, &v) in dst.chunks_exact_mut(2).zip(src) {
                o.copy_from_slice(&ember_quant::blocks::float::fp32_to_bf16(v).to_bits().to_le_bytes());
            }
        }
    }
}

/// `out[j][r] = dot(w.row(r), acts[j])` for `t` columns; `out` is `t` rows of `w.rows`.
pub fn matmul(pool: &Pool, w: &Matrix, acts: &[u8], t: usize, out: &mut [f32]) {
    assert!(out.len() >= t * w.rows);
    if let Some(p) = &w.packed {
        return matmul_tiled(pool, w, p, acts, t, out);
    }
    let arb = acts.len() / t;
    let (rows, k, dot) = (w.rows, w.cols, w.dot);
    let out = SyncPtr(out.as_mut_ptr());
    if let (Some(cols), true) = (w.dot_cols, t > 1) {
        // Several columns per call: the weight block's decoding is shared.
        return pool.for_each(rows.div_ceil(TILE_ROWS), |c| {
            let mut res = [0.0f32; MAX_DOT_COLS];
            for j0 in (0..t).step_by(MAX_DOT_COLS) {
                let n = MAX_DOT_COLS.min(t - j0);
                for r in c * TILE_ROWS..((c + 1) * TILE_ROWS).min(rows) {
                    cols(k, w.row(r), &acts[j0 * arb..], arb, n, &mut res);
                    for (jj, &v) in res[..n].iter().enumerate() {
                        // SAFETY: each (j, r) is written by exactly one task; `out` holds t * rows.
                        unsafe { *out.get().add((j0 + jj) * rows + r) = v };
                    }
                }
            }
        });
    }
    // Several chunks per thread to even out stragglers, each big enough to amortise scheduling.
    let chunk = rows.div_ceil(pool.threads() * 4).max(16);
    pool.for_each(rows.div_ceil(chunk), |c| {
        for r in c * chunk..((c + 1) * chunk).min(rows) {
            let wr = w.row(r);
            for j in 0..t {
                let v = dot(k, wr, &acts[j * arb..(j + 1) * arb]);
                // SAFETY: each (j, r) is written by exactly one task; `out` holds t * rows.
                unsafe { *out.get().add(j * rows + r) = v };
            }
        }
    });
}

/// Rows in a task of a tiled product over several columns: few enough that
/// they stay in L1 while every column group passes over them. A multiple of
/// [`GROUP`].
const TILE_ROWS: usize = 32;

/// As [`matmul`], over repacked row groups. A single column (decode) hands
/// each task a long run of groups in one kernel call; several columns go in
/// tasks of [`TILE_ROWS`] rows met by the columns [`MAX_TILE_COLS`] at a time,
/// so a weight block is unpacked once per column group instead of once per
/// column.
fn matmul_tiled(pool: &Pool, w: &Matrix, p: &PackedRows, acts: &[u8], t: usize, out: &mut [f32]) {
    let stride = acts.len() / t;
    let (rows, k, tile) = (w.rows, w.cols, p.tile);
    let out = SyncPtr(out.as_mut_ptr());
    if t == 1 {
        let chunk = rows.div_ceil(pool.threads() * 4).max(16).next_multiple_of(GROUP);
        pool.for_each(rows.div_ceil(chunk), |c| {
            let r = c * chunk..((c + 1) * chunk).min(rows);
            // SAFETY: tasks own disjoint row ranges of the one output row.
            let o = unsafe { std::slice::from_raw_parts_mut(out.get().add(r.start), r.len()) };
            tile(k, p.groups(r.clone()), r.len(), acts, stride, 1, o, r.len());
        });
        return;
    }
    pool.for_each(rows.div_ceil(TILE_ROWS), |c| {
        let r = c * TILE_ROWS..((c + 1) * TILE_ROWS).min(rows);
        let n_rows = r.len();
        let mut res = [0.0f32; TILE_ROWS * MAX_TILE_COLS];
        for j0 in (0..t).step_by(MAX_TILE_COLS) {
            let n = MAX_TILE_COLS.min(t - j0);
            tile(k, p.groups(r.clone()), n_rows, &acts[j0 * stride..], stride, n, &mut res, n_rows);
            for jj in 0..n {
                // SAFETY: each (j, r) is written by exactly one task; `out` holds t * rows.
                let dst = unsafe { std::slice::from_raw_parts_mut(out.get().add((j0 + jj) * rows + r.start), n_rows) };
                dst.copy_from_slice(&res[jj * n_rows..(jj + 1) * n_rows]);
            }
        }
    });
}
