//! Matrix products of the forward pass: a weight matrix in its file format
//! against a batch of activation rows quantized once to the format its kernel
//! dots with.
//!
//! Work is split by weight rows, and each row meets every column of the batch
//! while it is hot in cache, so a pass of several tokens reads the weights once.
//! Products that can run together share one dispatch, which a decoded token
//! pays for in latency; every dispatch hands its tasks to one routine
//! ([`product_rows`]), so a row's result never depends on which it went through.

use std::cell::RefCell;
use std::mem::MaybeUninit;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};

use ember_quant::packed::GROUP;
use ember_quant::TileFn;
use ember_quant::{ActType, UnpackedTile, MAX_DOT_COLS, MAX_TILE_COLS};

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
        let [rows] = self.get_many(pool, [act], x, t, k);
        rows
    }

    /// The same rows in each of several formats at once, for products that
    /// share one dispatch but not one kernel input.
    pub fn get_many<const N: usize>(
        &mut self,
        pool: &Pool,
        acts: [ActFormat; N],
        x: &[f32],
        t: usize,
        k: usize,
    ) -> [&[u8]; N] {
        for act in acts {
            self.quantize(pool, act, x, t, k);
        }
        acts.map(|act| {
            let e = self.entries.iter().find(|e| e.0 == act).expect("quantized above");
            &e.1[..]
        })
    }

    fn quantize(&mut self, pool: &Pool, act: ActFormat, x: &[f32], t: usize, k: usize) {
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
    matmul_many(pool, t, [Product { w, acts, out }]);
}

/// One product of a dispatch: `out[j * w.rows + r] = dot(w.row(r), column j of acts)`
/// for the `t` columns of the pass; `acts` holds them in `w.input`'s format.
pub struct Product<'a> {
    pub w: &'a Matrix,
    pub acts: &'a [u8],
    pub out: &'a mut [f32],
}

/// Several independent products in one parallel dispatch: on a few cores a
/// fork/join costs a visible share of a decoded token, and products that
/// read the same input (q, k and v) need not wait for one another.
pub fn matmul_many<const N: usize>(pool: &Pool, t: usize, products: [Product<'_>; N]) {
    let parts = products.map(|p| {
        assert!(p.out.len() >= t * p.w.rows, "output of {} for {t} columns of {} rows", p.out.len(), p.w.rows);
        (Operand::new(p.w, p.acts, t), SyncPtr(p.out.as_mut_ptr()))
    });
    let task_rows = parts.each_ref().map(|(p, _)| task_rows(pool, p.w, t));
    let mut first_item = [0usize; N];
    let mut n_items = 0;
    for i in 0..N {
        first_item[i] = n_items;
        n_items += parts[i].0.w.rows.div_ceil(task_rows[i]);
    }
    // Columns in chunks whose activations stay in a core's L2 while every
    // tile of rows passes over them, the chunks one after another: every
    // thread works in the same chunk, and a tile of weights is read once
    // per chunk instead of all columns once per tile.
    let widest = parts.iter().map(|(p, _)| p.stride).max().unwrap_or(0);
    let chunk = (COL_CHUNK_BYTES / widest.max(1)).next_multiple_of(MAX_TILE_COLS).min(t).max(1);
    let n_chunks = t.div_ceil(chunk);
    pool.for_each(n_items * n_chunks, |item| {
        let (c, item) = (item / n_items, item % n_items);
        let cols = c * chunk..((c + 1) * chunk).min(t);
        let i = first_item.iter().rposition(|&f| f <= item).expect("item 0 starts product 0");
        let (p, out) = &parts[i];
        let start = (item - first_item[i]) * task_rows[i];
        let r = start..(start + task_rows[i]).min(p.w.rows);
        // SAFETY: each item is handed out once, the items of a product cover
        // disjoint (row range, column chunk) pairs, and `out` holds every
        // column of every row.
        unsafe { product_rows(p, r.clone(), cols.clone(), out.get().add(cols.start * p.w.rows + r.start), p.w.rows) };
    });
}

/// `gate.out[j * rows + r] = combine(g, u)`, `g` and `u` being what the
/// products of `gate` and of `up` over `up_acts` give for row `r` of column
/// `j` (`combine(out, g, u)` takes runs of rows, so it can be vectorised): the two products and the combination in one dispatch. A task
/// computes a few rows of both in a few columns at a time into buffers of its
/// own and writes only the combination: no join between the products and the
/// activation, and neither product makes a round trip through memory.
pub fn matmul_gated(
    pool: &Pool,
    t: usize,
    gate: Product<'_>,
    up: &Matrix,
    up_acts: &[u8],
    combine: impl Fn(&mut [f32], &[f32], &[f32]) + Sync,
) {
    let Product { w, acts, out } = gate;
    matmul_gated_set(pool, &mut [GatedPart { gate: w, gate_acts: acts, up, up_acts, t, out }], combine);
}

/// One gated product of a set: `t` columns of its own, `out` `t` rows of
/// `gate.rows`.
pub struct GatedPart<'a> {
    pub gate: &'a Matrix,
    pub gate_acts: &'a [u8],
    pub up: &'a Matrix,
    pub up_acts: &'a [u8],
    pub t: usize,
    pub out: &'a mut [f32],
}

/// Several [`matmul_gated`] products, each over its own columns, in one
/// dispatch: a mixture's chosen experts, which a decoded token would
/// otherwise pay a fork/join each for.
pub fn matmul_gated_set(pool: &Pool, parts: &mut [GatedPart<'_>], combine: impl Fn(&mut [f32], &[f32], &[f32]) + Sync) {
    struct Job<'a> {
        gate: Operand<'a>,
        up: Operand<'a>,
        out: SyncPtr<f32>,
        t: usize,
        chunk: usize,
        run_rows: usize,
        col_block: usize,
    }
    let mut first = Vec::with_capacity(parts.len());
    let mut n_items = 0;
    let jobs: Vec<Job<'_>> = parts
        .iter_mut()
        .map(|p| {
            let (rows, t) = (p.gate.rows, p.t);
            assert_eq!(p.up.rows, rows, "gate and up products of different heights");
            assert!(p.out.len() >= t * rows, "output of {} for {t} columns of {rows} rows", p.out.len());
            let (gate, up) = (Operand::new(p.gate, p.gate_acts, t), Operand::new(p.up, p.up_acts, t));
            // A cut that suits both; a packed matrix needs runs that start on a group.
            let chunk = task_rows(pool, gate.w, t).max(task_rows(pool, up.w, t)).next_multiple_of(GROUP);
            // Up to one group of columns: long runs of rows, as a product alone has.
            // More: the product's own tiles, in column groups that fill the buffers.
            let (run_rows, col_block) = match t {
                1 => (GATED_BUF, 1),
                // A few columns (decoded tokens): runs long enough to stream the weights.
                _ if t <= MAX_TILE_COLS => (GATED_BUF / MAX_TILE_COLS, MAX_TILE_COLS),
                _ => (TILE_ROWS, GATED_BUF / TILE_ROWS),
            };
            first.push(n_items);
            n_items += rows.div_ceil(chunk);
            Job { gate, up, out: SyncPtr(p.out.as_mut_ptr()), t, chunk, run_rows, col_block }
        })
        .collect();
    pool.for_each(n_items, |item| {
        let i = first.partition_point(|&f| f <= item) - 1;
        let Job { gate, up, out, t, chunk, run_rows, col_block } = &jobs[i];
        let (rows, c) = (gate.w.rows, item - first[i]);
        // Left uninitialised: every element read is first written by
        // `product_rows` (zeroing them would cost a decode task a few percent).
        let mut g = MaybeUninit::<[f32; GATED_BUF]>::uninit();
        let mut u = MaybeUninit::<[f32; GATED_BUF]>::uninit();
        let (g, u) = (g.as_mut_ptr() as *mut f32, u.as_mut_ptr() as *mut f32);
        let task = c * chunk..((c + 1) * chunk).min(rows);
        for run_start in task.clone().step_by(*run_rows) {
            let r = run_start..(run_start + run_rows).min(task.end);
            for j0 in (0..*t).step_by(*col_block) {
                let cols = j0..(j0 + col_block).min(*t);
                let n = r.len();
                debug_assert!(cols.len() * n <= GATED_BUF);
                // SAFETY: the buffers hold `cols.len()` columns of `n` rows;
                // each task owns rows `task` of its part's `out`, in every
                // column. `product_rows` writes every (row, column) of the
                // run before the slices below read them.
                unsafe {
                    product_rows(gate, r.clone(), cols.clone(), g, n);
                    product_rows(up, r.clone(), cols.clone(), u, n);
                    for (jj, j) in cols.enumerate() {
                        let dst = std::slice::from_raw_parts_mut(out.get().add(j * rows + r.start), n);
                        let g = std::slice::from_raw_parts(g.add(jj * n), n);
                        let u = std::slice::from_raw_parts(u.add(jj * n), n);
                        combine(dst, g, u);
                    }
                }
            }
        }
    });
}

/// One product of a set: `t` columns of its own, `out` `t` rows of `w.rows`.
pub struct Part<'a> {
    pub w: &'a Matrix,
    pub acts: &'a [u8],
    pub t: usize,
    pub out: &'a mut [f32],
}

/// Several products, each over its own columns, in one dispatch (a
/// mixture's chosen experts' down products). Each task is a run of one
/// product's rows in a chunk of its columns, as [`matmul_many`] cuts them.
pub fn matmul_set(pool: &Pool, parts: &mut [Part<'_>]) {
    struct Job<'a> {
        op: Operand<'a>,
        out: SyncPtr<f32>,
        t: usize,
        task_rows: usize,
        chunk: usize,
        row_items: usize,
    }
    let mut first = Vec::with_capacity(parts.len());
    let mut n_items = 0;
    let jobs: Vec<Job<'_>> = parts
        .iter_mut()
        .map(|p| {
            assert!(
                p.out.len() >= p.t * p.w.rows,
                "output of {} for {} columns of {} rows",
                p.out.len(),
                p.t,
                p.w.rows
            );
            let op = Operand::new(p.w, p.acts, p.t);
            let task_rows = task_rows(pool, p.w, p.t);
            let chunk = (COL_CHUNK_BYTES / op.stride.max(1)).next_multiple_of(MAX_TILE_COLS).min(p.t).max(1);
            let row_items = p.w.rows.div_ceil(task_rows);
            first.push(n_items);
            n_items += row_items * p.t.div_ceil(chunk);
            Job { op, out: SyncPtr(p.out.as_mut_ptr()), t: p.t, task_rows, chunk, row_items }
        })
        .collect();
    pool.for_each(n_items, |item| {
        let i = first.partition_point(|&f| f <= item) - 1;
        let Job { op, out, t, task_rows, chunk, row_items } = &jobs[i];
        let local = item - first[i];
        let (c, ri) = (local / row_items, local % row_items);
        let cols = c * chunk..((c + 1) * chunk).min(*t);
        let r = ri * task_rows..(ri * task_rows + task_rows).min(op.w.rows);
        // SAFETY: each item is handed out once, the items of a part cover
        // disjoint (row range, column chunk) pairs, and `out` holds every
        // column of every row.
        unsafe {
            product_rows(op, r.clone(), cols.clone(), out.get().add(cols.start * op.w.rows + r.start), op.w.rows)
        };
    });
}

/// Results a task of [`matmul_gated`] holds per product: a long run of rows
/// in one column, or a tile of [`TILE_ROWS`] rows in several columns (enough
/// of them that alternating between the two products' weight tiles costs
/// little: with only [`MAX_TILE_COLS`], both tiles and the columns crowd L1).
const GATED_BUF: usize = 1024;
const _: () = assert!(
    GATED_BUF.is_multiple_of(GROUP) && GATED_BUF.is_multiple_of(TILE_ROWS) && GATED_BUF / TILE_ROWS >= MAX_TILE_COLS
);

/// A matrix and the activation columns it is multiplied with.
struct Operand<'a> {
    w: &'a Matrix,
    acts: &'a [u8],
    /// Bytes of one activation column.
    stride: usize,
    /// This product's number among all dispatches where its tiles are worth
    /// unpacking (more than one group of columns meets each), else 0.
    unpack: u64,
}

impl<'a> Operand<'a> {
    fn new(w: &'a Matrix, acts: &'a [u8], t: usize) -> Operand<'a> {
        assert!(t > 0, "a product of no columns");
        static DISPATCHES: AtomicU64 = AtomicU64::new(1);
        let unpack = match &w.packed {
            Some(p) if p.unpacked.is_some() && t > MAX_TILE_COLS => DISPATCHES.fetch_add(1, Ordering::Relaxed),
            _ => 0,
        };
        Operand { w, acts, stride: acts.len() / t, unpack }
    }
}

/// The tiles of rows this thread unpacked last, two of them (a gated
/// product alternates between its two matrices), each keyed by the
/// product's dispatch number and its packed groups' place: an entry
/// serves only the dispatch that made it, so weights are never read stale.
#[derive(Default)]
struct UnpackedTiles {
    entries: [((u64, usize, usize), Vec<u8>); 2],
    older: usize,
}

thread_local! {
    static UNPACKED: RefCell<UnpackedTiles> = RefCell::new(UnpackedTiles::default());
    /// Results of a long run of rows in a few columns, before they go to their columns.
    static RUN_OUT: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` over rows `r` of `p`'s packed matrix unpacked (`u`), unpacking
/// them unless this thread just did for the same dispatch.
fn with_unpacked<R>(
    p: &Operand,
    packed: &PackedRows,
    u: &UnpackedTile,
    r: Range<usize>,
    f: impl FnOnce(&[u8]) -> R,
) -> R {
    let k = p.w.cols;
    let groups = packed.groups(r.clone());
    let key = (p.unpack, groups.as_ptr() as usize, groups.len());
    UNPACKED.with_borrow_mut(|cache| {
        let i = match cache.entries.iter().position(|e| e.0 == key) {
            Some(i) => i,
            None => {
                let i = cache.older;
                let n_groups = r.len().div_ceil(GROUP);
                let bytes = n_groups * packed.format.unpacked_group_bytes(k).expect("a format with an unpacked layout");
                let e = &mut cache.entries[i];
                e.1.resize(bytes, 0);
                (u.unpack)(k, groups, n_groups, &mut e.1[..bytes]);
                e.0 = key;
                i
            }
        };
        cache.older = 1 - i;
        f(&cache.entries[i].1)
    })
}

/// Rows in a task of a product over `t` columns.
fn task_rows(pool: &Pool, w: &Matrix, t: usize) -> usize {
    match (&w.packed, w.dot_cols) {
        // Up to one group of columns (a decoded token per conversation): one
        // run of groups per thread, streamed once. Four shorter runs each
        // (which evened out stragglers) cost SmolLM2's generation on a Zen 5
        // 430 t/s against 500, and Gemma 3 270M's 230 against 257: each run
        // starts a stream that the prefetchers must take up again.
        (Some(_), _) if t <= MAX_TILE_COLS => w.rows.div_ceil(pool.threads()).next_multiple_of(GROUP),
        // Several columns: tiles that stay in L1 while every column passes over them.
        (Some(_), _) => TILE_ROWS,
        (None, Some(_)) if t > 1 => TILE_ROWS,
        // Several tasks per thread to even out stragglers, each big enough to amortise scheduling.
        _ => w.rows.div_ceil(pool.threads() * 4).max(16),
    }
}

/// Bytes of activation columns a product works through at a time.
const COL_CHUNK_BYTES: usize = 256 * 1024;

/// Rows per tile of a product over several columns: few enough that they
/// stay in L1 while every column group passes over them. A multiple of
/// [`GROUP`].
const TILE_ROWS: usize = 32;

/// Computes rows `r` of a product in columns `cols`, the result of row `i`
/// in column `j` going to `dst[(j - cols.start) * col_stride + (i - r.start)]`:
/// the work of one task, or of part of one, whatever dispatch it is part of.
/// `r.start` is a multiple of [`GROUP`] where the matrix is packed.
///
/// A single column over packed rows goes to the tile kernel as one run of
/// groups; several columns go in tiles of [`TILE_ROWS`] rows met by
/// [`MAX_TILE_COLS`] columns at a time (or [`MAX_DOT_COLS`] for a file
/// format's multi-column kernel), so a weight block is decoded once per
/// column group instead of once per column.
///
/// # Safety
/// `dst` is valid for those writes, and no other thread accesses those
/// elements meanwhile.
unsafe fn product_rows(p: &Operand, r: Range<usize>, cols: Range<usize>, dst: *mut f32, col_stride: usize) {
    let (w, acts, stride, k) = (p.w, p.acts, p.stride, p.w.cols);
    let at = |j: usize, row: usize| dst.add((j - cols.start) * col_stride + (row - r.start));
    if let Some(packed) = &w.packed {
        if cols.len() == 1 {
            let j = cols.start;
            let o = std::slice::from_raw_parts_mut(at(j, r.start), r.len());
            (packed.tile)(k, packed.groups(r.clone()), r.len(), &acts[j * stride..], stride, 1, o, r.len());
            return;
        }
        if cols.len() <= MAX_TILE_COLS && r.len() > TILE_ROWS {
            // One group of columns over a long run of rows: the weights are
            // streamed once, as for one column (a tile at a time would wait on
            // memory at every tile), into a buffer of this thread's.
            RUN_OUT.with_borrow_mut(|res| {
                let n = cols.len();
                res.resize(n * r.len(), 0.0);
                (packed.tile)(
                    k,
                    packed.groups(r.clone()),
                    r.len(),
                    &acts[cols.start * stride..],
                    stride,
                    n,
                    res,
                    r.len(),
                );
                for (jj, j) in cols.clone().enumerate() {
                    let o = std::slice::from_raw_parts_mut(at(j, r.start), r.len());
                    o.copy_from_slice(&res[jj * r.len()..(jj + 1) * r.len()]);
                }
            });
            return;
        }
        let mut res = [0.0f32; TILE_ROWS * MAX_TILE_COLS];
        for tile_start in r.clone().step_by(TILE_ROWS) {
            let tr = tile_start..(tile_start + TILE_ROWS).min(r.end);
            let n_rows = tr.len();
            let columns = |tile: TileFn, groups: &[u8], res: &mut [f32]| {
                for j0 in cols.clone().step_by(MAX_TILE_COLS) {
                    let n = MAX_TILE_COLS.min(cols.end - j0);
                    tile(k, groups, n_rows, &acts[j0 * stride..], stride, n, res, n_rows);
                    for jj in 0..n {
                        let o = std::slice::from_raw_parts_mut(at(j0 + jj, tr.start), n_rows);
                        o.copy_from_slice(&res[jj * n_rows..(jj + 1) * n_rows]);
                    }
                }
            };
            match &packed.unpacked {
                Some(u) if p.unpack != 0 => {
                    with_unpacked(p, packed, u, tr.clone(), |groups| columns(u.tile, groups, &mut res))
                }
                _ => columns(packed.tile, packed.groups(tr.clone()), &mut res),
            }
        }
        return;
    }
    if let (Some(dot_cols), true) = (w.dot_cols, cols.len() > 1) {
        let mut res = [0.0f32; MAX_DOT_COLS];
        for tile_start in r.clone().step_by(TILE_ROWS) {
            let tr = tile_start..(tile_start + TILE_ROWS).min(r.end);
            for j0 in cols.clone().step_by(MAX_DOT_COLS) {
                let n = MAX_DOT_COLS.min(cols.end - j0);
                for row in tr.clone() {
                    dot_cols(k, w.row(row), &acts[j0 * stride..], stride, n, &mut res);
                    for (jj, &v) in res[..n].iter().enumerate() {
                        *at(j0 + jj, row) = v;
                    }
                }
            }
        }
        return;
    }
    for row in r.clone() {
        let wr = w.row(row);
        for j in cols.clone() {
            *at(j, row) = (w.dot)(k, wr, &acts[j * stride..(j + 1) * stride]);
        }
    }
}

#[cfg(test)]
mod tests {
    use ember_gguf::GgmlType;

    use super::*;

    /// splitmix64, for test data that is the same on every run.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e3779b97f4a7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
            z ^ (z >> 31)
        }

        fn float(&mut self) -> f32 {
            (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        }
    }

    /// Random quants under small, finite scales: Q4_1 and Q4_K blocks both
    /// open with two f16 (scale and min), Q8_0's with its scale and then
    /// quants (two of which get f16 bits: any byte is a quant), the rest is
    /// quant bits.
    fn matrix(ty: GgmlType, rows: usize, cols: usize, repack: bool, rng: &mut Rng) -> Matrix {
        assert!(matches!(ty, GgmlType::Q4_1 | GgmlType::Q4_K | GgmlType::Q8_0));
        let mut data: Vec<u8> =
            (0..rows * ty.row_bytes(cols as u64).unwrap() as usize).map(|_| rng.next() as u8).collect();
        for block in data.chunks_exact_mut(ty.type_size()) {
            block[..2].copy_from_slice(&half::f16::from_f32(0.01 + 0.01 * rng.float().abs()).to_bits().to_le_bytes());
            block[2..4].copy_from_slice(&half::f16::from_f32(0.02 * rng.float()).to_bits().to_le_bytes());
        }
        Matrix::for_test(ty, rows, cols, data, repack)
    }

    fn same_bits(a: &[f32], b: &[f32]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
    }

    /// Each product alone, on one thread: the reference the fused dispatches
    /// must reproduce exactly.
    fn alone(w: &Matrix, x: &[f32], t: usize) -> Vec<f32> {
        let pool = Pool::new(1).unwrap();
        let mut acts = Acts::default();
        let mut out = vec![0.0; t * w.rows];
        matmul(&pool, w, acts.get(&pool, w.input, x, t, w.cols), t, &mut out);
        assert!(
            out.iter().all(|v| v.is_finite()) && out.iter().any(|&v| v != 0.0),
            "test data gives a meaningful product"
        );
        out
    }

    const K: usize = 256;

    /// Packed rows (tile kernel), a file format left unpacked that has a
    /// multi-column kernel (Q4_K on AVX2), the plain dot, and all three mixed
    /// (three activation formats in one dispatch). Heights that are not whole
    /// tiles or groups.
    fn cases(rng: &mut Rng) -> Vec<(&'static str, [Matrix; 3])> {
        let (q, kv) = (200, 75);
        let same = |ty, repack, rng: &mut Rng| {
            [matrix(ty, q, K, repack, rng), matrix(ty, kv, K, repack, rng), matrix(ty, kv, K, repack, rng)]
        };
        vec![
            ("packed", same(GgmlType::Q4_1, true, rng)),
            ("q4_k", same(GgmlType::Q4_K, false, rng)),
            ("plain dot", same(GgmlType::Q4_1, false, rng)),
            (
                "mixed",
                [
                    matrix(GgmlType::Q4_1, q, K, true, rng),
                    matrix(GgmlType::Q4_K, kv, K, false, rng),
                    matrix(GgmlType::Q4_1, kv, K, false, rng),
                ],
            ),
        ]
    }

    #[test]
    fn products_in_one_dispatch_equal_products_alone() {
        let mut rng = Rng(7);
        let pool = Pool::new(3).unwrap();
        let mut cases = cases(&mut rng);
        // Tall packed matrices: a few columns meet long runs of rows per task.
        cases.push((
            "tall",
            [
                matrix(GgmlType::Q4_1, 1200, K, true, &mut rng),
                matrix(GgmlType::Q8_0, 1000, K, true, &mut rng),
                matrix(GgmlType::Q4_1, 75, K, true, &mut rng),
            ],
        ));
        for (name, [a, b, c]) in cases {
            // 700 columns are more than one chunk of activations in every format.
            for t in [1, 2, 3, 4, 9, 37, 700] {
                let x: Vec<f32> = (0..t * K).map(|_| rng.float()).collect();
                let mut acts = Acts::default();
                let [xa, xb, xc] = acts.get_many(&pool, [a.input, b.input, c.input], &x, t, K);
                let (mut oa, mut ob, mut oc) = (vec![0.0; t * a.rows], vec![0.0; t * b.rows], vec![0.0; t * c.rows]);
                matmul_many(
                    &pool,
                    t,
                    [
                        Product { w: &a, acts: xa, out: &mut oa },
                        Product { w: &b, acts: xb, out: &mut ob },
                        Product { w: &c, acts: xc, out: &mut oc },
                    ],
                );
                for (w, out) in [(&a, &oa), (&b, &ob), (&c, &oc)] {
                    assert!(same_bits(out, &alone(w, &x, t)), "{name}, {} rows, t = {t}", w.rows);
                }
            }
        }
    }

    /// The same pairs of formats; t = 37 spans more than one column group of
    /// a task, and the single thread's long tasks more than one run of rows.
    #[test]
    fn gated_product_equals_products_then_activation() {
        let mut rng = Rng(11);
        let combine = |d: &mut [f32], g: &[f32], u: &[f32]| crate::ops::silu_mul(d, g, u);
        let n_ff = 200;
        let pairs = [
            (
                "packed",
                matrix(GgmlType::Q4_1, n_ff, K, true, &mut rng),
                matrix(GgmlType::Q4_1, n_ff, K, true, &mut rng),
            ),
            (
                "q4_k",
                matrix(GgmlType::Q4_K, n_ff, K, false, &mut rng),
                matrix(GgmlType::Q4_K, n_ff, K, false, &mut rng),
            ),
            (
                "plain dot",
                matrix(GgmlType::Q4_1, n_ff, K, false, &mut rng),
                matrix(GgmlType::Q4_1, n_ff, K, false, &mut rng),
            ),
            (
                "mixed",
                matrix(GgmlType::Q4_1, n_ff, K, true, &mut rng),
                matrix(GgmlType::Q4_K, n_ff, K, false, &mut rng),
            ),
            (
                "odd height",
                matrix(GgmlType::Q4_1, 75, K, true, &mut rng),
                matrix(GgmlType::Q4_1, 75, K, false, &mut rng),
            ),
            (
                "long runs",
                matrix(GgmlType::Q4_1, 4400, K, true, &mut rng),
                matrix(GgmlType::Q4_1, 4400, K, true, &mut rng),
            ),
        ];
        for (name, gate, up) in &pairs {
            let (pool, ts): (_, &[usize]) = match *name {
                "long runs" => (Pool::new(1).unwrap(), &[1, 3]),
                _ => (Pool::new(3).unwrap(), &[1, 3, 9, 37]),
            };
            for &t in ts {
                let x: Vec<f32> = (0..t * K).map(|_| rng.float()).collect();
                let (g, u) = (alone(gate, &x, t), alone(up, &x, t));
                let mut want = vec![0.0; g.len()];
                crate::ops::silu_mul_scalar(&mut want, &g, &u);
                let mut acts = Acts::default();
                let [xg, xu] = acts.get_many(&pool, [gate.input, up.input], &x, t, K);
                let mut og = vec![0.0; t * gate.rows];
                matmul_gated(&pool, t, Product { w: gate, acts: xg, out: &mut og }, up, xu, combine);
                assert!(same_bits(&og, &want), "{name}, t = {t}");
            }
        }
    }
}
