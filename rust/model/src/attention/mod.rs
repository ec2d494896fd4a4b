//! Causal attention of a pass's queries over one sequence's KV cache, with a
//! sliding window where the layer has one.
//!
//! The arithmetic is fixed here, not borrowed from a dot kernel, so that the
//! vector loops and their scalar twin round identically: with an f16 cache the
//! query is rounded to f16 before it meets the keys (as llama.cpp does); a
//! score is a dot whose products are accumulated by fused multiply-adds into
//! eight lanes (element `d` into lane `d % 8`), the lanes summed pairwise
//! (`((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7))`), then scaled;
//! scores are exponentiated in f32 and summed over sixteen lanes with
//! `ops::exp_shifted_sum` (then rounded to f16 for an f16 cache); and the
//! outputs are the value rows weighted by fused multiply-adds in position
//! order. With a Q8_0 cache the query is quantized to Q8_0 once per head (as
//! llama.cpp does) and a score is taken in integers: per block of 32 the
//! exact dot of the quants, scaled by the product of the two block scales
//! (one rounding) and added by a fused multiply-add, block after block; its
//! values are widened exactly (quant times scale) and met by the f32
//! probabilities. With a bf16 cache every operand is a bf16 and every
//! product is exact, as AVX-512 BF16's paired products (`vdpbf16ps`) take
//! them: the query is rounded to bf16; a score's lane `l` adds, per step of
//! sixteen elements, the product of element `2l + 1` then that of `2l`
//! ([`lanes::bf16_lane_order`]); the exponentials are rounded to bf16; and
//! the value rows are weighed in pairs of positions from an even one, the
//! second's product added first ([`lanes::bf16_pair_order`]). Where the
//! core has AVX-512 BF16 a prompt's full blocks take the paired products,
//! twice the multiply-adds of an f32 instruction, with the keys every query
//! of an item sees laid out sixteen to a register, so that a score's lanes
//! are chains of their own, summed without shuffles; elsewhere the f32 loops
//! meet the same operands in that order and round the same (as long as no
//! sum falls below f32's smallest normal, which the paired form makes zero).
//!
//! Positions are met in spans of [`SPAN`], aligned on multiples of it. A
//! query's softmax is taken over each span it sees (the span's maximum, the
//! sum of its exponentials, the value rows weighted by them), and the
//! spans are folded in position order ([`fold`]): the running outputs and sum
//! scaled to the larger maximum, the next span's added, the outputs divided by
//! the sum at the end. No row of scores longer than a span is ever held.
//!
//! The work is split into items of (a tile of consecutive query rows, a run of
//! query heads sharing one kv head, a run of spans). An item widens each block
//! of eight key rows of its span once and meets it with every query of the
//! tile, eight scores at a time in the lanes of one register; at the AVX-512
//! levels it lays out up to thirty-two keys that all its queries see sixteen
//! to a register, each lane of a score a chain of its own. An item that
//! covers every span of its rows folds them itself; where there are too few
//! rows to keep the threads busy (a decoded token), a head group's spans are
//! shared out among several items, each writing its spans' results apart, and
//! a second step folds them in order. Such an item (with an f16 cache) meets
//! each block of eight cache rows with every group's queries in turn, so the
//! rows are read once, in order. Every output element is the same
//! sequence of roundings whatever the split: a token gets the same attention
//! alone, in a prompt, or in a batch, and a long conversation's positions are
//! read by every thread.

use std::cell::RefCell;

use ember_kv::{to_bf16, KvCache, RingRows, Rows, Q8_0_BLOCK, Q8_0_BYTES};
use ember_quant::SimdLevel;
use half::{bf16, f16};

use crate::pool::Pool;

pub use both_ways::{attend_rows, BothWays};

mod both_ways;
mod lanes;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;

use lanes::{bf16_pair_order, Lanes, Q8Queries, Scalar, BF16_STEP};
#[cfg(test)]
use lanes::{bf16_lane_order, pair_bf16_values, round_bf16_pairs, transpose_bf16_keys, transpose_f32_keys};
#[cfg(test)]
use lanes::{dot8, fma_row};

pub struct AttnShape {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim_k: usize,
    pub head_dim_v: usize,
    pub scale: f32,
    pub window: Option<usize>,
}

/// Per-thread buffers of one item: its scores (then probabilities), one row
/// per query with a stride of the item's key span; its queries in f16 and
/// then as f32 rows padded with zeros to a multiple of eight; a block of eight
/// key rows likewise; a block of value rows widened to f32; and its outputs.
#[derive(Default)]
struct Scratch {
    scores: Vec<f32>,
    q16: Vec<f16>,
    qw: Vec<f32>,
    /// The queries quantized to Q8_0, for a Q8_0 cache's keys, with each
    /// query's sum of quants and scale per block ([`Q8Queries`]); and the
    /// block scales of the eight keys being scored, as stored and widened.
    q8: Vec<u8>,
    q8_sums: Vec<i32>,
    q8_scales: Vec<f32>,
    dk16: Vec<f16>,
    dk: Vec<f32>,
    /// Widened keys: a block of eight (of up to thirty-two, where the loops
    /// lay them out sixteen to a register), and that layout.
    k8: Vec<f32>,
    kt: Vec<f32>,
    /// For a bf16 cache: the queries rounded to bf16, as stored; a block of
    /// up to thirty-two keys laid out sixteen to a register for the paired
    /// products; the span's weights in their order
    /// ([`lanes::bf16_pair_order`]), or as bf16s for the paired products;
    /// and a block of value rows paired for them (or a row of zeros, for a
    /// decoded token's in-place weighing).
    qb: Vec<bf16>,
    kb: Vec<bf16>,
    w_pairs: Vec<f32>,
    wb: Vec<bf16>,
    vb: Vec<bf16>,
    /// The queries that meet a block of widened keys (their indices, the
    /// positions of the block each sees) and their scores.
    met: Vec<usize>,
    met_seen: Vec<(usize, usize)>,
    met_s8: Vec<[f32; 8]>,
    v32: Vec<f32>,
    o: Vec<f32>,
    /// One span's maximum and sum per query (the maximum -inf where the
    /// query sees none of the span).
    span_m: Vec<f32>,
    span_l: Vec<f64>,
    /// The spans folded so far, per query, and the factors a fold scales
    /// them and the next span by.
    acc_m: Vec<f32>,
    acc_l: Vec<f64>,
    acc_o: Vec<f32>,
    fold_scales: Vec<f32>,
}

/// One span's results, or the spans folded so far: the maximum score, the
/// sum of the exponentials shifted by it, and the value rows weighted by
/// them. A maximum of -inf is nothing (no position seen).
#[inline(always)]
fn fold(acc_m: &mut f32, acc_l: &mut f64, acc_o: &mut [f32], m: f32, l: f64, o: &[f32]) {
    let mx = acc_m.max(m);
    let (a, b) = (crate::ops::exp_softmax(*acc_m - mx), crate::ops::exp_softmax(m - mx));
    fold_scaled(acc_m, acc_l, acc_o, m, l, o, a, b);
}

/// [`fold`] with its factors `a = exp(acc_m - mx)` and `b = exp(m - mx)`
/// (`mx` the larger maximum) taken already, for many queries at once by
/// [`fold_span`]; where either maximum is -inf they are not read.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn fold_scaled(acc_m: &mut f32, acc_l: &mut f64, acc_o: &mut [f32], m: f32, l: f64, o: &[f32], a: f32, b: f32) {
    if m == f32::NEG_INFINITY {
        return;
    }
    if *acc_m == f32::NEG_INFINITY {
        (*acc_m, *acc_l) = (m, l);
        acc_o.copy_from_slice(o);
        return;
    }
    for (x, &y) in acc_o.iter_mut().zip(o) {
        // One rounding, the same in the scalar and the vector paths.
        *x = x.mul_add(a, y * b);
    }
    *acc_l = *acc_l * a as f64 + l * b as f64;
    *acc_m = acc_m.max(m);
}

/// Every query's span (`span_m`, `span_l`, `o`) folded into its running
/// results, as [`fold`] folds one, the factors' exponentials taken together
/// as one row (the same bits as one at a time).
#[inline(always)]
fn fold_span(sc: &mut Scratch, hv: usize) {
    let nq = sc.span_m.len();
    let Scratch { acc_m, acc_l, acc_o, span_m, span_l, o, fold_scales, .. } = sc;
    fold_scales.clear();
    fold_scales.extend(acc_m.iter().zip(span_m.iter()).map(|(&am, &m)| am - am.max(m)));
    fold_scales.extend(acc_m.iter().zip(span_m.iter()).map(|(&am, &m)| m - am.max(m)));
    // Where both maxima are -inf the differences are NaN, not read.
    crate::ops::exp_shifted_sum(fold_scales, 0.0, &[]);
    for qi in 0..nq {
        let (a, b) = (fold_scales[qi], fold_scales[nq + qi]);
        let (acc, span) = (&mut acc_o[qi * hv..][..hv], &o[qi * hv..][..hv]);
        fold_scaled(&mut acc_m[qi], &mut acc_l[qi], acc, span_m[qi], span_l[qi], span, a, b);
    }
}

/// The folded outputs of one query's head, divided by their sum.
#[inline(always)]
fn finish(acc_l: f64, acc_o: &[f32], out: &mut [f32]) {
    let inv = (1.0 / acc_l) as f32;
    for (o, &x) in out.iter_mut().zip(acc_o) {
        *o = x * inv;
    }
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// Which element loops run: the level ember runs at (see
/// `ember_quant::level`): the scalar twin, AVX2 with FMA and F16C, or
/// AVX-512 where the level has it.
fn level() -> SimdLevel {
    ember_quant::level()
}

/// Query row budget of one item: its outputs (and a span's scores, a row
/// per query) stay in the core's second-level cache. A larger tile meets
/// each laid out key and value row with more queries: 24576 floats against
/// 8192 took a prompt of 512 at depth 4096 up by 8% (f16 cache), 13% (Q8_0)
/// and 3% (bf16) on SmolLM2 (heads of 64: tiles of 128 rows), by 2-4% on
/// Gemma 3; 16384 gave less, and 49152 (two tiles a head group) left a
/// thread idle. (Widening value blocks of 8192 floats apart gained nothing.)
const ITEM_FLOATS: usize = 24576;

/// Below this many queries, an item reads f16 keys (and values) in place
/// instead of widening each block once for all its queries. At four, a
/// decoded token of Gemma 3 (four query heads to a key head) at depth 16384
/// spent a third less time scoring and weighing (about 115 and 57 cycles of
/// the time-stamp counter a position, to 90 and 36) than with the keys and
/// values stored widened and read back.
const DIRECT_QUERIES: usize = 5;

/// From this many queries on, an item transposes each block of sixteen
/// Q8_0 keys for them all ([`Lanes::scores16_q8_0_scaled`]) rather than
/// meeting the keys in place one query at a time.
const Q8_0_TRANSPOSED_QUERIES: usize = 8;

/// From this many queries on, an item with a bf16 cache on a core with
/// paired bf16 products lays out the keys they all see, sixteen to a
/// register, and each block of value rows in pairs, once for them all;
/// fewer meet the keys and values widened, as the other levels do (same
/// roundings). A decoded token of
/// SmolLM2 (three queries to a key head) at depth 4096 spent a fifth of its
/// time pairing them.
const BF16_PAIRED_QUERIES: usize = 8;

/// Items per thread to aim for, so that uneven items (later rows see more
/// keys) still balance.
const ITEMS_PER_THREAD: usize = 4;

/// Items per thread where a sequence's spans are shared out: those items
/// are even (as many spans, the same rows), so fewer balance, and each one
/// starts its walk of the cache cold. A decoded token of SmolLM2 at depth
/// 1024 spent 9% less in attention with two than with four (at 4096, 2-5%
/// less).
const RANGES_PER_THREAD: usize = 2;

/// Positions of a span (see the module's doc): a tile's scores for one span
/// stay in the core's second-level cache, and the fold's cost (a row of
/// outputs scaled per span) stays a small share of the span's. 256 against
/// 128 took a prompt of 512 at depth 4096 up by 3-5% on SmolLM2 (f16, bf16
/// and Q8_0 caches) and Gemma 3 (f16; level with bf16), with decoding at
/// that depth level; 64 was 13% slower.
pub const SPAN: usize = 256;

/// Budget, in floats, of the per-span results a split pass keeps for its
/// second step; a pass that would need more splits by heads instead.
const PARTIAL_FLOATS: usize = 1 << 22;

/// One sequence's part of [`attention_many`]: `q` holds `t` rows of
/// n_head * head_dim_k, `out` receives `t` rows of n_head * head_dim_v; query
/// row j sits at position `start + j`, and the cache already holds its key.
pub struct AttnPart<'a> {
    pub cache: &'a KvCache,
    pub q: &'a [f32],
    pub start: usize,
    pub t: usize,
    pub out: &'a mut [f32],
}

/// Attention for several sequences in one parallel operation (a pass over
/// several conversations): their items share the workers, so a handful of
/// heads per sequence still balances and the pass pays one dispatch per
/// layer, not one per sequence (two where a sequence's spans are shared out).
/// Each sequence's output is what it would get alone.
pub fn attention_many(pool: &Pool, il: usize, s: &AttnShape, parts: &mut [AttnPart<'_>]) {
    let level = level();
    let mut plans = Vec::with_capacity(parts.len());
    // The items of all sequences share the threads: each sequence needs only
    // its share of them, so several decoded tokens keep whole head groups
    // (a key and value row read once for the group's heads).
    let sharing = parts.iter().filter(|p| p.t > 0).count().max(1);
    let want = (ITEMS_PER_THREAD * pool.threads()).div_ceil(sharing);
    for p in parts.iter_mut() {
        if p.t == 0 {
            continue;
        }
        assert!(p.q.len() >= p.t * s.n_head * s.head_dim_k, "query rows");
        let plan = Plan::new(p.cache, il, s, p.q, p.start, p.t, want, ITEM_FLOATS);
        let out = &mut p.out[..p.t * s.n_head * s.head_dim_v];
        plans.push((plan, OutPtr(out.as_mut_ptr())));
    }
    execute(pool, &plans, level);
}

/// One sequence's attention split for `threads` threads with items of about
/// `item_floats` floats of output, with the element loops of `level` (one
/// this CPU runs): every split the planner can make, for the tests.
#[cfg(test)]
#[allow(clippy::too_many_arguments)]
fn attention_with(
    pool: &Pool,
    cache: &KvCache,
    il: usize,
    s: &AttnShape,
    q: &[f32],
    start: usize,
    t: usize,
    out: &mut [f32],
    threads: usize,
    item_floats: usize,
    level: SimdLevel,
) {
    if t == 0 {
        return;
    }
    assert!(level.runs_here(), "vector loops on a CPU without them");
    let plan = Plan::new(cache, il, s, q, start, t, ITEMS_PER_THREAD * threads.max(1), item_floats);
    assert!(q.len() >= t * s.n_head * s.head_dim_k, "query rows");
    let out = &mut out[..t * s.n_head * s.head_dim_v];
    execute(pool, &[(plan, OutPtr(out.as_mut_ptr()))], level);
}

/// Runs every item of `plans` on the pool, then folds the spans of the plans
/// that shared them out.
fn execute(pool: &Pool, plans: &[(Plan, OutPtr)], level: SimdLevel) {
    // Where each plan's items, and its kept span results, begin.
    let (mut ends, mut merges, mut at) = (Vec::with_capacity(plans.len()), Vec::new(), Vec::new());
    let (mut total, mut n_merge, mut floats) = (0, 0, 0);
    for (plan, _) in plans {
        total += plan.items();
        ends.push(total);
        at.push(floats);
        if plan.ranges > 1 {
            floats += plan.partial_entries();
            // One merge item per (row, head): a decoded token's few head groups
            // would leave a thread idle for one group's fold.
            n_merge += plan.t * plan.n_head;
            merges.push(n_merge);
        } else {
            merges.push(n_merge);
        }
    }
    PARTIALS.with_borrow_mut(|part| {
        let hv = plans.first().map_or(0, |(p, _)| p.hv);
        if part.m.len() < floats {
            part.m.resize(floats, 0.0);
            part.l.resize(floats, 0.0);
        }
        if part.o.len() < floats * hv {
            part.o.resize(floats * hv, 0.0);
        }
        let kept = Kept { m: part.m.as_mut_ptr(), l: part.l.as_mut_ptr(), o: part.o.as_mut_ptr() };
        pool.for_each(total, |i| {
            let k = ends.partition_point(|&e| e <= i);
            let (plan, dst) = &plans[k];
            let first = if k == 0 { 0 } else { ends[k - 1] };
            SCRATCH.with_borrow_mut(|sc| {
                // SAFETY: as in `attention_with`: each plan's items write disjoint
                // parts of its own output (and of the kept span results, at its
                // own offset), which outlive the loop.
                unsafe { plan.run(i - first, sc, *dst, kept.at(at[k], hv), level) }
            })
        });
        if n_merge > 0 {
            pool.for_each(n_merge, |i| {
                let k = merges.partition_point(|&e| e <= i);
                let first = if k == 0 { 0 } else { merges[k - 1] };
                let (plan, dst) = &plans[k];
                SCRATCH.with_borrow_mut(|sc| {
                    // SAFETY: each merge item writes its own (row, head) of
                    // the plan's output, reading what the first step kept.
                    unsafe { plan.merge(i - first, sc, *dst, kept.at(at[k], hv), level) }
                })
            });
        }
    });
}

/// The per-span results a split pass keeps between its two steps, reused
/// from pass to pass (attention is dispatched from one thread).
#[derive(Default)]
struct Partials {
    m: Vec<f32>,
    l: Vec<f64>,
    o: Vec<f32>,
}

thread_local! {
    static PARTIALS: RefCell<Partials> = RefCell::new(Partials::default());
}

/// Where a plan's kept span results are: entry `e` is (`m[e]`, `l[e]`, the
/// `hv` floats of `o` from `e * hv`).
#[derive(Clone, Copy)]
struct Kept {
    m: *mut f32,
    l: *mut f64,
    o: *mut f32,
}
// SAFETY: only used to write and read disjoint entries from different threads.
unsafe impl Send for Kept {}
unsafe impl Sync for Kept {}

impl Kept {
    fn at(self, entry: usize, hv: usize) -> Kept {
        // SAFETY: the offsets stay inside the buffers sized for every plan.
        unsafe { Kept { m: self.m.add(entry), l: self.l.add(entry), o: self.o.add(entry * hv) } }
    }
}

/// The output of a pass, shared by items that write disjoint parts of it.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: only used to write disjoint ranges from different threads.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

/// How a pass's attention is split into items, and what every item reads.
struct Plan<'a> {
    cache: &'a KvCache,
    il: usize,
    keys: Rows<'a>,
    values: Rows<'a>,
    kw: usize,
    vw: usize,
    q: &'a [f32],
    start: usize,
    t: usize,
    n_head: usize,
    hk: usize,
    hv: usize,
    group: usize,
    scale: f32,
    window: Option<usize>,
    /// Query rows per tile.
    tile: usize,
    n_tiles: usize,
    /// Query heads per item (a divisor of `group`).
    heads: usize,
    /// Head groups per item: 1, or every group where a decoded token's spans
    /// are shared out (an item then reads whole cache rows, in order).
    kv_groups: usize,
    /// Runs of spans a tile's head group is shared out in (1: its items fold
    /// their spans themselves).
    ranges: usize,
    /// The first span any row sees, and how many spans the pass's rows see
    /// from it (the kept results are indexed from it).
    span_base: usize,
    n_spans: usize,
}

impl<'a> Plan<'a> {
    /// Splits a sequence's attention into about `want` items (more where
    /// its rows need it), each of about `item_floats` floats of output.
    #[allow(clippy::too_many_arguments)]
    fn new(
        cache: &'a KvCache,
        il: usize,
        s: &AttnShape,
        q: &'a [f32],
        start: usize,
        t: usize,
        want: usize,
        item_floats: usize,
    ) -> Self {
        let group = s.n_head / s.n_head_kv;
        let rows = (item_floats / s.head_dim_k.max(s.head_dim_v).max(1)).max(1);
        let first = |j: usize| s.window.map_or(0, |w| (start + j + 1).saturating_sub(w));
        let (span_base, span_last) = (first(0) / SPAN, (start + t - 1) / SPAN);
        let n_spans = span_last + 1 - span_base;
        // A whole group per item shares each key and value row between the
        // group's heads. Where that gives too few items, a long context's
        // spans are shared out (the rows are few, so their kept results are
        // small); otherwise single heads give more items.
        let (mut heads, mut tile, mut ranges, mut kv_groups) = (group, (rows / group).max(1).min(t), 1, 1);
        let whole = s.n_head_kv * t.div_ceil(tile);
        if whole < want {
            let spans_of_last = span_last + 1 - first(t - 1) / SPAN;
            if spans_of_last > 1 && t * s.n_head * n_spans * (s.head_dim_v + 2) <= PARTIAL_FLOATS {
                // Every head group in each item, the spans shared out: an item
                // reads its spans' cache rows whole and in order, as memory
                // streams best, where an item per group would read a third of
                // each row.
                kv_groups = s.n_head_kv;
                let want = (want * RANGES_PER_THREAD).div_ceil(ITEMS_PER_THREAD);
                ranges = want.div_ceil(t.div_ceil(tile)).min(spans_of_last);
            } else {
                heads = 1;
                tile = (t * s.n_head / want).clamp(1, rows).min(t);
            }
        }
        let shape = cache.shape(il);
        Plan {
            cache,
            il,
            keys: cache.keys(il),
            values: cache.values(il),
            kw: shape.k_width,
            vw: shape.v_width,
            q,
            start,
            t,
            n_head: s.n_head,
            hk: s.head_dim_k,
            hv: s.head_dim_v,
            group,
            scale: s.scale,
            window: s.window,
            tile,
            n_tiles: t.div_ceil(tile),
            heads,
            kv_groups,
            ranges,
            span_base,
            n_spans,
        }
    }

    fn items(&self) -> usize {
        self.n_tiles * (self.n_head / (self.heads * self.kv_groups)) * self.ranges
    }

    /// Kept span results of a split pass: one per (row, head, span).
    fn partial_entries(&self) -> usize {
        self.t * self.n_head * self.n_spans
    }

    /// Item `i`: (query rows j0..j1, query heads h0..h0 + heads, spans
    /// k0..k1). The last tiles, whose rows see the most keys, come first.
    fn item(&self, i: usize) -> (usize, usize, usize, usize, usize) {
        let per_tile = self.n_head / (self.heads * self.kv_groups) * self.ranges;
        let tile = self.n_tiles - 1 - i / per_tile;
        let (h, r) = ((i % per_tile) / self.ranges * self.kv_groups, i % self.ranges);
        let j0 = tile * self.tile;
        let j1 = (j0 + self.tile).min(self.t);
        let (lo, hi) = (self.first(j0) / SPAN, (self.start + j1 - 1) / SPAN + 1);
        let n = hi - lo;
        (j0, j1, h * self.heads, lo + n * r / self.ranges, lo + n * (r + 1) / self.ranges)
    }

    /// The first position query row `j` sees.
    #[inline]
    fn first(&self, j: usize) -> usize {
        match self.window {
            Some(w) => (self.start + j + 1).saturating_sub(w),
            None => 0,
        }
    }

    /// The positions of s0..s1 (a span, or a block of it) query row `j`
    /// sees, as (first, end): none where first >= end.
    #[inline]
    fn seen(&self, j: usize, s0: usize, s1: usize) -> (usize, usize) {
        (self.first(j).max(s0), (self.start + j + 1).min(s1))
    }

    /// The query rows among j0..j1 that see position `p`.
    #[inline]
    fn rows_seeing(&self, p: usize, j0: usize, j1: usize) -> std::ops::Range<usize> {
        let ja = j0.max(p.saturating_sub(self.start));
        let jb = match self.window {
            Some(w) => j1.min((p + w).saturating_sub(self.start)),
            None => j1,
        };
        ja..jb.max(ja)
    }

    /// The kept result of row `j`, head `h`, span `k`.
    #[inline]
    fn entry(&self, j: usize, h: usize, k: usize) -> usize {
        (j * self.n_head + h) * self.n_spans + k - self.span_base
    }

    /// # Safety
    /// `level` one this CPU runs; `dst` is the pass's output and
    /// `kept` the plan's span results, and no other item runs `i` at the
    /// same time.
    unsafe fn run(&self, i: usize, sc: &mut Scratch, dst: OutPtr, kept: Kept, level: SimdLevel) {
        match level {
            SimdLevel::Scalar => run_item::<Scalar>(self, i, sc, dst, kept),
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx2 => run_avx2(self, i, sc, dst, kept),
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx512Vnni => run_avx512(self, i, sc, dst, kept),
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx512Bf16 => run_avx512_bf16(self, i, sc, dst, kept),
            #[cfg(not(target_arch = "x86_64"))]
            _ => run_item::<Scalar>(self, i, sc, dst, kept),
        }
    }

    /// The second step of a split pass: merge item `i` (a row, a head)
    /// folds its kept span results in order and writes its outputs.
    ///
    /// # Safety
    /// `kept` holds what the first step wrote; no other merge item runs `i`.
    unsafe fn merge(&self, i: usize, sc: &mut Scratch, dst: OutPtr, kept: Kept, level: SimdLevel) {
        match level {
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx2 | SimdLevel::Avx512Vnni | SimdLevel::Avx512Bf16 => self.merge_fma(i, sc, dst, kept),
            _ => self.merge_item(i, sc, dst, kept),
        }
    }

    /// [`Plan::merge_item`] with the fold's fused multiply-adds as
    /// instructions rather than calls (the same roundings).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "fma")]
    unsafe fn merge_fma(&self, i: usize, sc: &mut Scratch, dst: OutPtr, kept: Kept) {
        self.merge_item(i, sc, dst, kept)
    }

    #[inline(always)]
    unsafe fn merge_item(&self, i: usize, sc: &mut Scratch, dst: OutPtr, kept: Kept) {
        let (j, h) = (i / self.n_head, i % self.n_head);
        let hv = self.hv;
        let (k0, k1) = (self.first(j) / SPAN, (self.start + j) / SPAN + 1);
        sc.acc_o.resize(hv.max(sc.acc_o.len()), 0.0);
        let (mut m, mut l) = (f32::NEG_INFINITY, 0.0f64);
        let acc = &mut sc.acc_o[..hv];
        for k in k0..k1 {
            let e = self.entry(j, h, k);
            let o = std::slice::from_raw_parts(kept.o.add(e * hv), hv);
            fold(&mut m, &mut l, acc, *kept.m.add(e), *kept.l.add(e), o);
        }
        let out = std::slice::from_raw_parts_mut(dst.0.add(j * self.n_head * hv + h * hv), hv);
        finish(l, acc, out);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn run_avx2(plan: &Plan, i: usize, sc: &mut Scratch, dst: OutPtr, kept: Kept) {
    run_item::<avx2::Avx2>(plan, i, sc, dst, kept)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn run_avx512(plan: &Plan, i: usize, sc: &mut Scratch, dst: OutPtr, kept: Kept) {
    run_item::<avx512::Avx512<false>>(plan, i, sc, dst, kept)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512bf16")]
unsafe fn run_avx512_bf16(plan: &Plan, i: usize, sc: &mut Scratch, dst: OutPtr, kept: Kept) {
    run_item::<avx512::Avx512<true>>(plan, i, sc, dst, kept)
}

/// One item, written once for the scalar and the vector element loops: its
/// spans one after the other, each folded into the rows' running results,
/// or kept apart where the plan shares spans out.
#[inline(always)]
unsafe fn run_item<L: Lanes>(p: &Plan, i: usize, sc: &mut Scratch, dst: OutPtr, kept: Kept) {
    let (j0, j1, h0, k0, k1) = p.item(i);
    let (hv, heads) = (p.hv, p.heads);
    let nq = (j1 - j0) * heads;
    let rows_at_once = reads_rows_at_once::<L>(p, j1 - j0);
    if p.kv_groups == 1 || rows_at_once {
        prepare_queries::<L>(p, j0, j1, h0, heads * p.kv_groups, sc);
    }
    let inline = p.ranges == 1;
    debug_assert!(inline <= (p.kv_groups == 1), "an item of several groups keeps its spans apart");
    if inline {
        sc.acc_m.clear();
        sc.acc_m.resize(nq, f32::NEG_INFINITY);
        sc.acc_l.clear();
        sc.acc_l.resize(nq, 0.0);
        sc.acc_o.clear();
        sc.acc_o.resize(nq * hv, 0.0);
    }
    let (lo, hi) = (p.first(j0), p.start + j1 - 1);
    for k in k0..k1 {
        let (s0, s1) = (lo.max(k * SPAN), (hi + 1).min((k + 1) * SPAN));
        if s0 >= s1 {
            continue;
        }
        if rows_at_once {
            span_rows::<L>(p, j0, j1, h0, s0, s1, sc);
            let hh = heads * p.kv_groups;
            for qi in 0..nq * p.kv_groups {
                let e = p.entry(j0 + qi / hh, h0 + qi % hh, k);
                *kept.m.add(e) = sc.span_m[qi];
                *kept.l.add(e) = sc.span_l[qi];
                std::slice::from_raw_parts_mut(kept.o.add(e * hv), hv).copy_from_slice(&sc.o[qi * hv..][..hv]);
            }
            continue;
        }
        for g in 0..p.kv_groups {
            let hg = h0 + g * heads;
            if p.kv_groups > 1 {
                prepare_queries::<L>(p, j0, j1, hg, heads, sc);
            }
            // The first group of a whole-row item asks for the rows whole.
            span::<L>(p, j0, j1, hg, s0, s1, p.kv_groups > 1 && g == 0, sc);
            if inline {
                fold_span(sc, hv);
                continue;
            }
            for qi in 0..nq {
                let (j, h) = (j0 + qi / heads, hg + qi % heads);
                let e = p.entry(j, h, k);
                *kept.m.add(e) = sc.span_m[qi];
                *kept.l.add(e) = sc.span_l[qi];
                std::slice::from_raw_parts_mut(kept.o.add(e * hv), hv).copy_from_slice(&sc.o[qi * hv..][..hv]);
            }
        }
    }
    if inline {
        for j in j0..j1 {
            let n = heads * hv;
            // SAFETY: rows j0..j1 and heads h0..h0 + heads belong to this item alone.
            let out = std::slice::from_raw_parts_mut(dst.0.add(j * p.n_head * hv + h0 * hv), n);
            for g in 0..heads {
                let qi = (j - j0) * heads + g;
                finish(sc.acc_l[qi], &sc.acc_o[qi * hv..][..hv], &mut out[g * hv..][..hv]);
            }
        }
    }
}

/// The floats a key (and a query) takes in the f32 loops: a head padded
/// with zeros to whole steps of the lanes (of a bf16 dot's for bf16 keys).
#[inline(always)]
fn key_stride(keys: &Rows, hk: usize) -> usize {
    match keys {
        Rows::BF16(_) => hk.next_multiple_of(BF16_STEP),
        _ => hk.next_multiple_of(8),
    }
}

/// The queries of rows j0..j1 and heads h0..h0 + heads as zero-padded f32
/// rows (through f16 for an f16 cache; through bf16, in the lanes' order,
/// for a bf16 cache, and kept as bf16s for the paired products).
#[inline(always)]
unsafe fn prepare_queries<L: Lanes>(p: &Plan, j0: usize, j1: usize, h0: usize, heads: usize, sc: &mut Scratch) {
    let hk = p.hk;
    let nq = (j1 - j0) * heads;
    let hkp = key_stride(&p.keys, hk);
    if matches!(p.keys, Rows::Q8_0(_)) {
        let bytes = hk / Q8_0_BLOCK * Q8_0_BYTES;
        sc.q8.resize(nq * bytes, 0);
        for j in j0..j1 {
            let src = &p.q[j * p.n_head * hk + h0 * hk..][..heads * hk];
            let dst = &mut sc.q8[(j - j0) * heads * bytes..][..heads * bytes];
            ember_quant::quantize_row_q8_0(src, dst).expect("a Q8_0 cache's heads are whole blocks");
        }
        let blocks = || sc.q8[..nq * bytes].chunks_exact(Q8_0_BYTES);
        sc.q8_sums.clear();
        sc.q8_sums.extend(blocks().map(|b| b[2..].iter().map(|&x| x as i8 as i32).sum::<i32>()));
        sc.q8_scales.clear();
        sc.q8_scales.extend(blocks().map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32()));
        return;
    }
    let Scratch { q16, qw, qb, .. } = sc;
    qw.clear();
    qw.resize(nq * hkp, 0.0);
    if matches!(p.keys, Rows::BF16(_)) {
        qb.clear();
        qb.resize(nq * hkp, bf16::ZERO);
        for j in j0..j1 {
            let src = &p.q[j * p.n_head * hk + h0 * hk..][..heads * hk];
            for (g, src) in src.chunks_exact(hk).enumerate() {
                let qi = (j - j0) * heads + g;
                let rounded = &mut qb[qi * hkp..][..hk];
                for (d, &x) in rounded.iter_mut().zip(src) {
                    *d = to_bf16(x);
                }
                L::widen_bf16_lanes(rounded, &mut qw[qi * hkp..][..hkp]);
            }
        }
        return;
    }
    for j in j0..j1 {
        for g in 0..heads {
            let qi = (j - j0) * heads + g;
            // Queries of row j and heads h0.. are contiguous in `q`.
            let src = &p.q[j * p.n_head * hk + (h0 + g) * hk..][..hk];
            let dst = &mut qw[qi * hkp..][..hk];
            if matches!(p.keys, Rows::F16(_)) {
                if q16.len() < hk {
                    q16.resize(hk, f16::ZERO);
                }
                L::narrow(src, &mut q16[..hk]);
                L::widen(&q16[..hk], dst);
            } else {
                dst.copy_from_slice(src);
            }
        }
    }
}

/// One span, positions s0..s1, of the item's queries: per query its
/// maximum score and sum of exponentials (`span_m`, `span_l`; -inf and 0
/// where it sees none of them) and the value rows weighted by those
/// exponentials (`o`).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn span<L: Lanes>(
    p: &Plan,
    j0: usize,
    j1: usize,
    h0: usize,
    s0: usize,
    s1: usize,
    whole_rows: bool,
    sc: &mut Scratch,
) {
    let (hk, hv, heads) = (p.hk, p.hv, p.heads);
    let kvh = h0 / p.group;
    let nq = (j1 - j0) * heads;
    let hkp = key_stride(&p.keys, hk);
    let width = s1 - s0;
    let hi = s1 - 1;
    let Scratch {
        scores, qw, q8, q8_sums, q8_scales, dk16, dk, k8, kt, v32, o, span_m, span_l, met, met_seen, met_s8, qb, kb,
        w_pairs, wb, vb, ..
    } = sc;
    let ring = p.cache.ring_rows(p.il, s0);
    if scores.len() < nq * width {
        scores.resize(nq * width, 0.0);
    }

    // Scores: query (j, g) against position pos goes to
    // scores[(j - j0) * heads + g][pos - s0], eight positions at a time.
    // With few queries an item reads f16 (or bf16, where the loops have the
    // form) keys in place, converting them in the dot exactly as widening
    // would, rather than widening each block first.
    let direct = match p.keys {
        Rows::F16(_) => true,
        Rows::BF16(_) => L::BF16_IN_PLACE,
        _ => false,
    } && hk == hkp && nq < DIRECT_QUERIES;
    // Q8_0 keys are always met in place, by the quantized queries.
    let q8_keys = matches!(p.keys, Rows::Q8_0(_));
    let (kbytes, kblocks) = (hk / Q8_0_BLOCK * Q8_0_BYTES, hk / Q8_0_BLOCK);
    if q8_keys {
        dk16.resize(8 * kblocks, f16::ZERO);
        dk.resize(8 * kblocks, 0.0);
    } else if !direct {
        k8.clear();
        k8.resize(if L::F32_TRANSPOSED { 32 } else { 8 } * hkp, 0.0);
    }
    // Whether every query of the item sees positions a..b.
    let all_see = |a: usize, b: usize| p.first(j1 - 1) <= a && p.start + j0 + 1 >= b;
    // The end of a run of up to thirty-two positions from `b0`, each seen by
    // some query of the item (all of s0..=hi are).
    let run = |b0: usize| (b0 + 32).min(hi + 1);
    let mut b0 = s0;
    while b0 <= hi {
        // Sixteen Q8_0 keys that every query of a prompt's item sees are
        // transposed once and met by all its queries in byte dots.
        if q8_keys && nq >= Q8_0_TRANSPOSED_QUERIES && b0 + 16 <= hi + 1 && all_see(b0, b0 + 16) {
            for pos in (b0 + 32).min(hi + 1)..(b0 + 48).min(hi + 1) {
                prefetch_head_row(&p.keys, ring.row(pos), p.kw, kvh, hk);
            }
            for pos in b0..b0 + 16 {
                prefetch_head_row(&p.values, ring.row(pos), p.vw, kvh, hv);
            }
            let keys16 = std::array::from_fn(|i| p.keys.slice(ring.row(b0 + i) * p.kw + kvh * hk, hk).bytes());
            assert!(scores.len() >= (nq - 1) * width + b0 + 16 - s0);
            let queries = Q8Queries { rows: q8, sums: q8_sums, scales: q8_scales };
            L::scores16_q8_0_scaled(&queries, nq, &keys16, p.scale, scores.as_mut_ptr().add(b0 - s0), width);
            b0 += 16;
            continue;
        }
        // Up to thirty-two keys, where the loops lay them out sixteen to a
        // register (as bf16 pairs on a core with paired bf16 products,
        // widened for the f32 loops): laid out once, met by every query of
        // the item, even one that does not see some of them (near the
        // diagonal, or the window's start); such a score is written and
        // never read, which costs less than meeting the keys apart.
        let bf16_pairs = L::BF16_PAIRS && nq >= BF16_PAIRED_QUERIES && matches!(p.keys, Rows::BF16(_));
        let widened = L::F32_TRANSPOSED && !q8_keys && !direct;
        if bf16_pairs || widened {
            let b1 = run(b0);
            prefetch_block(p, &ring, kvh, whole_rows, b0, b1, hi);
            assert!(scores.len() >= (nq - 1) * width + b1 - s0);
            let (n, dst) = (b1 - b0, scores.as_mut_ptr().add(b0 - s0));
            let blocks = n.div_ceil(16);
            match &p.keys {
                Rows::BF16(kc) if bf16_pairs => {
                    let keys: [&[bf16]; 32] =
                        std::array::from_fn(|i| &kc[ring.row(b0 + i.min(n - 1)) * p.kw + kvh * hk..][..hk]);
                    kb.resize(32 * hkp, bf16::ZERO);
                    L::transpose_bf16_keys(&keys[..n], blocks, hkp, kb);
                    assert!(qb.len() >= nq * hkp);
                    L::scores16_bf16_scaled(qb, nq, hkp, kb, n, p.scale, dst, width);
                }
                _ => {
                    for (i, row) in k8.chunks_exact_mut(hkp).take(n).enumerate() {
                        key_row::<L>(&p.keys, ring.row(b0 + i), p.kw, kvh, hk, row);
                    }
                    let keys: [&[f32]; 32] = std::array::from_fn(|i| &k8[i * hkp..][..hkp]);
                    kt.resize(32 * hkp, 0.0);
                    L::transpose_f32_keys(&keys[..n], blocks, hkp, kt);
                    assert!(qw.len() >= nq * hkp);
                    L::scores16_scaled(qw, nq, hkp, kt, n, p.scale, dst, width);
                }
            }
            b0 = b1;
            continue;
        }
        let b1 = (b0 + 8).min(hi + 1);
        let mut rows8 = [0usize; 8];
        for (i, r) in rows8.iter_mut().enumerate() {
            // Past the span, the last row again: those lanes are never stored.
            *r = ring.row((b0 + i).min(b1 - 1));
        }
        // A long cache comes from memory, a row of a head at a time: ask for
        // the keys of the block after next, and for this block's values
        // (read after the softmax), while this block is scored.
        for pos in (b1 + 8).min(hi + 1)..(b1 + 16).min(hi + 1) {
            match whole_rows {
                true => prefetch_head_row(&p.keys, ring.row(pos), p.kw, 0, p.kw),
                false => prefetch_head_row(&p.keys, ring.row(pos), p.kw, kvh, hk),
            }
        }
        for &row in &rows8[..b1 - b0] {
            match whole_rows {
                true => prefetch_head_row(&p.values, row, p.vw, 0, p.vw),
                false => prefetch_head_row(&p.values, row, p.vw, kvh, hv),
            }
        }
        let keys8 = q8_keys.then(|| rows8.map(|row| p.keys.slice(row * p.kw + kvh * hk, hk).bytes()));
        if let Some(keys8) = &keys8 {
            for (i, key) in keys8.iter().enumerate() {
                for b in 0..kblocks {
                    dk16[8 * b + i] = f16::from_le_bytes([key[b * Q8_0_BYTES], key[b * Q8_0_BYTES + 1]]);
                }
            }
            // Widened together, eight or sixteen at a time (exactly, as one at
            // a time would): one at a time they were widened in software.
            L::widen(dk16, dk);
        } else if !direct {
            for pos in b0..b1 {
                key_row::<L>(&p.keys, rows8[pos - b0], p.kw, kvh, hk, &mut k8[(pos - b0) * hkp..][..hkp]);
            }
        }
        let (ja, jb) = (p.rows_seeing(b0, j0, j1).start, p.rows_seeing(b1 - 1, j0, j1).end);
        // A block of eight widened keys that every query of the item sees
        // (most blocks of a long context) is met by them all at once, its
        // scores scaled and stored by the kernel straight into the rows.
        if !q8_keys && !direct && b1 - b0 == 8 && all_see(b0, b1) {
            assert!(scores.len() >= (nq - 1) * width + b1 - s0 && qw.len() >= nq * hkp);
            L::scores8_scaled(qw, nq, hkp, &k8[..8 * hkp], p.scale, scores.as_mut_ptr().add(b0 - s0), width);
            b0 = b1;
            continue;
        }
        // Query qi's scores of positions a..b, scaled, into its row of scores.
        let mut store = |qi: usize, a: usize, b: usize, s8: &[f32; 8]| {
            store_scaled(scores.get_unchecked_mut(qi * width + a - s0..qi * width + b - s0), &s8[a - b0..b - b0], p.scale)
        };
        // Widened keys are met by all the block's queries at once, below.
        met.clear();
        met_seen.clear();
        // Keys read in place are met by all the block's queries (fewer than
        // DIRECT_QUERIES) at once.
        let (mut direct_q, mut n_direct) = ([(0usize, 0usize, 0usize); DIRECT_QUERIES], 0);
        for j in ja..jb {
            let (a, b) = p.seen(j, b0, b1);
            if a >= b {
                continue;
            }
            for g in 0..heads {
                let qi = (j - j0) * heads + g;
                let mut s8 = [0.0f32; 8];
                match &p.keys {
                    Rows::Q8_0(_) => {
                        let keys8 = keys8.as_ref().expect("Q8_0 keys are met in place");
                        L::scores8_q8_0(&q8[qi * kbytes..][..kbytes], keys8, dk, &mut s8);
                    }
                    Rows::F16(_) | Rows::BF16(_) if direct => {
                        // Met below, with the block's other queries.
                        direct_q[n_direct] = (qi, a, b);
                        n_direct += 1;
                        continue;
                    }
                    _ => {
                        met.push(qi);
                        met_seen.push((a, b));
                        continue;
                    }
                }
                store(qi, a, b, &s8);
            }
        }
        if !met.is_empty() {
            met_s8.resize(met.len().max(met_s8.len()), [0.0; 8]);
            L::scores8_many(qw, met, hkp, &k8[..8 * hkp], met_s8);
            for ((&qi, &(a, b)), s8) in met.iter().zip(met_seen.iter()).zip(met_s8.iter()) {
                store(qi, a, b, s8);
            }
        }
        if let (Rows::F16(k), 1..) = (&p.keys, n_direct) {
            let keys = rows8.map(|row| &k[row * p.kw + kvh * hk..][..hk]);
            let s8 = scores_in_place::<L>(n_direct, |i| &qw[direct_q[i].0 * hkp..][..hkp], &keys);
            for (&(qi, a, b), s8) in direct_q[..n_direct].iter().zip(&s8) {
                store(qi, a, b, s8);
            }
        }
        if let (Rows::BF16(k), 1..) = (&p.keys, n_direct) {
            let keys = rows8.map(|row| &k[row * p.kw + kvh * hk..][..hk]);
            let s8 = scores_in_place_bf16::<L>(n_direct, |i| &qw[direct_q[i].0 * hkp..][..hkp], &keys);
            for (&(qi, a, b), s8) in direct_q[..n_direct].iter().zip(&s8) {
                store(qi, a, b, s8);
            }
        }
        b0 = b1;
    }

    let paired = weighs_paired::<L>(p, nq).then_some(&mut *wb);
    span_softmax::<L>(p, j0, j1, heads, s0, s1, scores, paired, span_m, span_l);
    let seen = |j: usize| p.seen(j, s0, s1);

    // Outputs: the value rows weighted by the exponentials, in position
    // order (bf16 values in pairs of positions, apart), a block of value rows
    // (widened to f32) at a time.
    if let Rows::BF16(vc) = p.values {
        // Zeroed where it must be by the weighing itself.
        o.resize(nq * hv, 0.0);
        let bufs = Bf16Weighing { w_pairs, wb, v32, vb };
        weigh_bf16_span::<L>(p, j0, j1, heads, kvh, s0, s1, vc, scores, bufs, o);
        return;
    }
    o.clear();
    o.resize(nq * hv, 0.0);
    // With few queries an item reads f16 values in place, converting each as
    // it meets it: widened into a buffer first, a value would be stored and
    // read back for a single multiply-add.
    let direct_values = matches!(p.values, Rows::F16(_) | Rows::Q8_0(_)) && nq < DIRECT_QUERIES;
    if direct_values {
        for j in j0..j1 {
            let (a, b) = seen(j);
            if a >= b {
                continue;
            }
            // The row's heads see the same positions: each value row is read once for all of them.
            let qi = (j - j0) * heads;
            let w = &scores[qi * width + a - s0..][..(heads - 1) * width + b - a];
            let o = &mut o[qi * hv..][..heads * hv];
            match p.values {
                Rows::F16(v) => {
                    L::weigh_f16_heads(w, width, heads, (a..b).map(|pos| &v[ring.row(pos) * p.vw + kvh * hv..][..hv]), o)
                }
                Rows::Q8_0(_) => L::weigh_q8_0_heads(w, width, heads,
                    (a..b).map(|pos| p.values.slice(ring.row(pos) * p.vw + kvh * hv, hv).bytes()), o),
                Rows::F32(_) | Rows::BF16(_) => unreachable!("f32 values are widened by copy, bf16 ones weighed apart"),
            }
        }
        return;
    }
    let block = (ITEM_FLOATS / hv.max(1)).clamp(1, width);
    if v32.len() < block * hv {
        v32.resize(block * hv, 0.0);
    }
    // Otherwise a block of value rows is widened once for all the queries.
    let mut c0 = s0;
    while c0 <= hi {
        let c1 = (c0 + block).min(hi + 1);
        for pos in c0..c1 {
            head_row::<L>(&p.values, ring.row(pos), p.vw, kvh, hv, &mut v32[(pos - c0) * hv..][..hv]);
        }
        let (ja, jb) = (p.rows_seeing(c0, j0, j1).start, p.rows_seeing(c1 - 1, j0, j1).end);
        let seen = |j: usize| p.seen(j, c0, c1);
        let mut j = ja;
        while j < jb {
            let (a, b) = seen(j);
            // The row's heads, and those of the following rows that see the
            // same positions (most of a prompt's rows, away from the
            // diagonal), share each value row: their queries are consecutive.
            let rows = (j + 1..jb).take_while(|&r| seen(r) == (a, b)).count() + 1;
            if a < b {
                let (qi, n) = ((j - j0) * heads, rows * heads);
                let w = &scores[qi * width + a - s0..][..(n - 1) * width + b - a];
                L::weigh_heads(w, width, n, &v32[(a - c0) * hv..][..(b - a) * hv], &mut o[qi * hv..][..n * hv]);
            }
            j += rows;
        }
        c0 = c1;
    }
}

/// The scores of `n` queries (1 to 4, `query(i)` the i-th) with eight f16
/// key rows read in place.
#[inline(always)]
unsafe fn scores_in_place<'q, L: Lanes>(n: usize, query: impl Fn(usize) -> &'q [f32], keys: &[&[f16]; 8]) -> [[f32; 8]; 4] {
    let query = |i: usize| query(i.min(n - 1));
    let mut s8 = [[0.0f32; 8]; 4];
    let [sa, sb, sc, sd] = &mut s8;
    match n {
        1 => L::scores8_f16(query(0), keys, sa),
        // Two queries: the second's scores taken twice, the copy unused.
        2 | 3 => L::scores8_f16_n([query(0), query(1), query(2)], keys, [sa, sb, sc]),
        _ => L::scores8_f16_n([query(0), query(1), query(2), query(3)], keys, [sa, sb, sc, sd]),
    }
    s8
}

/// [`scores_in_place`] with eight bf16 key rows.
#[inline(always)]
unsafe fn scores_in_place_bf16<'q, L: Lanes>(n: usize, query: impl Fn(usize) -> &'q [f32], keys: &[&[bf16]; 8])
                                             -> [[f32; 8]; 4] {
    let query = |i: usize| query(i.min(n - 1));
    let mut s8 = [[0.0f32; 8]; 4];
    let [sa, sb, sc, sd] = &mut s8;
    match n {
        1 => L::scores8_bf16_n([query(0)], keys, [sa]),
        2 | 3 => L::scores8_bf16_n([query(0), query(1), query(2)], keys, [sa, sb, sc]),
        _ => L::scores8_bf16_n([query(0), query(1), query(2), query(3)], keys, [sa, sb, sc, sd]),
    }
    s8
}

/// A block's scores of one query, scaled, into its row of scores.
#[inline(always)]
fn store_scaled(row: &mut [f32], s8: &[f32], scale: f32) {
    // A block the row sees whole (most of them) is scaled and stored as one vector.
    if let (Ok(row), Ok(s8)) = (<&mut [f32; 8]>::try_from(&mut *row), <&[f32; 8]>::try_from(s8)) {
        for (d, &x) in row.iter_mut().zip(s8) {
            *d = scale * x;
        }
    } else {
        for (d, &x) in row.iter_mut().zip(s8) {
            *d = scale * x;
        }
    }
}

/// The exponentials per query of rows j0..j1 and `heads` heads over the
/// positions of s0..s1 it sees, shifted by their maximum, in position order;
/// they replace the scores (rounded to f16 for f16 values), or, for bf16
/// values weighed by the paired products, go to `paired` rounded to bf16,
/// laid out as [`weigh_bf16_span`] reads them. Each query's maximum and sum
/// go to `span_m` and `span_l` (-inf and 0 where it sees none of the span).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn span_softmax<L: Lanes>(
    p: &Plan,
    j0: usize,
    j1: usize,
    heads: usize,
    s0: usize,
    s1: usize,
    scores: &mut [f32],
    mut paired: Option<&mut Vec<bf16>>,
    span_m: &mut Vec<f32>,
    span_l: &mut Vec<f64>,
) {
    let (nq, width) = ((j1 - j0) * heads, s1 - s0);
    let (f0, fw) = bf16_frame(s0, s1);
    if let Some(wb) = &mut paired {
        wb.resize(nq * fw, bf16::ZERO);
    }
    // (bf16 values' exponentials are rounded where they are laid out to be
    // weighed: into `paired` here, or by the weighing's f32 loops.)
    let f16_values = matches!(p.values, Rows::F16(_));
    span_m.clear();
    span_m.resize(nq, f32::NEG_INFINITY);
    span_l.clear();
    span_l.resize(nq, 0.0);
    // Query `qi`'s positions in the span, if it sees any.
    let seen = |qi: usize| {
        let j = j0 + qi / heads;
        let (a, b) = p.seen(j, s0, s1);
        (a < b).then_some((a, b))
    };
    let mut rows = (0..nq).filter_map(|qi| seen(qi).map(|ab| (qi, ab))).peekable();
    let Some(&(qi, (a, b))) = rows.peek() else { return };
    // Each later row's maximum is read by the loop that exponentiates the row
    // before it.
    let mut m = L::max(&scores[qi * width..][a - s0..b - s0]);
    while let Some((qi, (a, b))) = rows.next() {
        span_m[qi] = m;
        // The next row seen lies past this one.
        let (this, rest) = scores.split_at_mut((qi + 1) * width);
        let row = &mut this[qi * width..][a - s0..b - s0];
        let next: &[f32] = match rows.peek() {
            Some(&(qn, (a, b))) => &rest[(qn - qi - 1) * width..][a - s0..b - s0],
            None => &[],
        };
        let e = match &mut paired {
            // The paired products take a row over whole pairs of
            // positions, so only a pair's unseen half need be zero.
            Some(wb) => {
                let frame = &mut wb[qi * fw..][..fw];
                if a % 2 == 1 {
                    frame[a - 1 - f0] = bf16::ZERO;
                }
                if b % 2 == 1 {
                    frame[b - f0] = bf16::ZERO;
                }
                crate::ops::exp_shifted_sum_bf16(row, m, &mut frame[a - f0..b - f0], next)
            }
            None if f16_values => crate::ops::exp_shifted_sum_f16(row, m, next),
            None => crate::ops::exp_shifted_sum(row, m, next),
        };
        (span_l[qi], m) = (e.sum as f64, e.next_max);
    }
}

/// Whether a span of an item of `nq` queries is weighed by AVX-512 BF16's
/// paired products: bf16 values, on a core that has them, with queries
/// enough to fill their kernels.
#[inline(always)]
fn weighs_paired<L: Lanes>(p: &Plan, nq: usize) -> bool {
    L::BF16_PAIRS && nq >= BF16_PAIRED_QUERIES && matches!(p.values, Rows::BF16(_))
}

/// Whether an item of `rows` query rows meets every head group in one walk
/// of the span ([`span_rows`]): a decoded token's item of whole rows, with
/// f16 keys and values (or bf16 ones, where the loops read them in place)
/// and few enough queries per group that they are read in place.
#[inline(always)]
fn reads_rows_at_once<L: Lanes>(p: &Plan, rows: usize) -> bool {
    let in_place = match (&p.keys, &p.values) {
        (Rows::F16(_), Rows::F16(_)) => p.hk.is_multiple_of(8),
        (Rows::BF16(_), Rows::BF16(_)) => L::BF16_IN_PLACE && p.hk.is_multiple_of(BF16_STEP),
        _ => false,
    };
    p.kv_groups > 1 && in_place && rows * p.heads < DIRECT_QUERIES
}

/// How far ahead of the block being scored a walk of whole cache rows asks
/// for keys: far enough that memory's latency is hidden by the scoring of
/// the blocks between (24 to 40 measured alike at depth 4096), near enough
/// that the rows are still in the second-level cache when they are read.
const KEYS_AHEAD: usize = 32;

/// Value rows a [`span_rows`] walk weighs for every group before the next.
const ROWS_AT_ONCE: usize = 16;

/// While a walk of whole rows weighs the value rows `done` on from its
/// span's start, the next span's whole key rows (from `next`, short of
/// `last`) in the same share of that span, so they are on their way when
/// its scoring starts.
#[inline(always)]
fn ask_for_next_span_keys(p: &Plan, next: usize, last: usize, done: usize) {
    let ahead = next + done * KEYS_AHEAD / SPAN;
    for pos in ahead.min(last)..(ahead + ROWS_AT_ONCE * KEYS_AHEAD / SPAN).min(last) {
        prefetch_head_row(&p.keys, p.cache.row_of(p.il, pos), p.kw, 0, p.kw);
    }
}

/// [`span`] for an item of whole cache rows ([`reads_rows_at_once`]), its
/// queries those of rows j0..j1 and heads h0..h0 + heads * kv_groups: each
/// block of eight rows is met by every group's queries in turn, then the
/// value rows likewise, so the rows are read once and in order, and the
/// requests for the next ones are spread over all the groups' arithmetic
/// rather than bunched in the first group's. Each query meets the same
/// positions in the same order as in [`span`], so its results are the same.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn span_rows<L: Lanes>(p: &Plan, j0: usize, j1: usize, h0: usize, s0: usize, s1: usize, sc: &mut Scratch) {
    let (hk, hv, heads) = (p.hk, p.hv, p.heads);
    let hh = heads * p.kv_groups;
    let kvh0 = h0 / p.group;
    let nq = (j1 - j0) * hh;
    let (width, hi) = (s1 - s0, s1 - 1);
    // f16 or bf16 keys and values: two bytes an element either way.
    let bf16 = matches!(p.keys, Rows::BF16(_));
    let kc = p.keys.bytes();
    let Scratch { scores, qw, o, span_m, span_l, w_pairs, vb, .. } = sc;
    assert!((kvh0 + p.kv_groups) * hk <= p.kw && (kvh0 + p.kv_groups) * hv <= p.vw);
    let ring = p.cache.ring_rows(p.il, s0);
    if scores.len() < nq * width {
        scores.resize(nq * width, 0.0);
    }
    let mut b0 = s0;
    while b0 <= hi {
        let b1 = (b0 + 8).min(hi + 1);
        // Past the span, the last row again: those lanes are never stored.
        let rows8: [usize; 8] = std::array::from_fn(|i| ring.row((b0 + i).min(b1 - 1)));
        for pos in (b1 + KEYS_AHEAD - 8).min(hi + 1)..(b1 + KEYS_AHEAD).min(hi + 1) {
            prefetch_head_row(&p.keys, ring.row(pos), p.kw, 0, p.kw);
        }
        for &row in &rows8[..b1 - b0] {
            prefetch_head_row(&p.values, row, p.vw, 0, p.vw);
        }
        let (ja, jb) = (p.rows_seeing(b0, j0, j1).start, p.rows_seeing(b1 - 1, j0, j1).end);
        // One check for the block's rows, not one per row and group.
        assert!(rows8.iter().all(|&row| 2 * (row + 1) * p.kw <= kc.len()));
        if !bf16 {
            // Each group's first key of each row; the groups' heads follow it.
            let rows: [*const f16; 8] = rows8.map(|row| kc.as_ptr().add(2 * (row * p.kw + kvh0 * hk)).cast());
            for j in ja..jb {
                let (a, b) = p.seen(j, b0, b1);
                if a >= b {
                    continue;
                }
                let at = (j - j0) * hh;
                // SAFETY: the rows are inside the store and the groups inside a row (asserted above); query
                // row j's scores of lanes a - b0..b - b0 lie in its row of `scores` (b <= s1).
                let out = scores.as_mut_ptr().add(at * width + b0 - s0);
                L::scores8_f16_groups(&qw[at * hk..][..hh * hk], heads, hk, p.kv_groups, &rows, p.scale, out, width,
                                      a - b0, b - b0);
            }
            b0 = b1;
            continue;
        }
        for g in 0..p.kv_groups {
            let kvh = kvh0 + g;
            // SAFETY: each row is inside the store (above), the group's head inside the row (asserted per span).
            let key = |i: usize| kc.as_ptr().add(2 * (rows8[i] * p.kw + kvh * hk));
            let (mut seen, mut n) = ([(0usize, 0usize, 0usize); DIRECT_QUERIES], 0);
            for j in ja..jb {
                let (a, b) = p.seen(j, b0, b1);
                if a >= b {
                    continue;
                }
                for h in 0..heads {
                    seen[n] = ((j - j0) * hh + g * heads + h, a, b);
                    n += 1;
                }
            }
            if n == 0 {
                continue;
            }
            let query = |i: usize| &qw[seen[i].0 * hk..][..hk];
            let s8 = scores_in_place_bf16::<L>(n, query, &std::array::from_fn(|i| slice_at(key(i), hk)));
            for (&(qi, a, b), s8) in seen[..n].iter().zip(&s8) {
                store_scaled(&mut scores[qi * width + a - s0..][..b - a], &s8[a - b0..b - b0], p.scale);
            }
        }
        b0 = b1;
    }
    span_softmax::<L>(p, j0, j1, hh, s0, s1, scores, None, span_m, span_l);
    o.clear();
    o.resize(nq * hv, 0.0);
    if bf16 {
        return weigh_rows_bf16::<L>(p, j0, j1, h0, s0, s1, scores, w_pairs, vb, o);
    }
    let Rows::F16(vc) = p.values else { unreachable!("an item of whole rows reads f16 or bf16 values") };
    // The next span's first keys, which the walk above asks for only from
    // its fourth block on, are asked for while these values are weighed.
    let (next, last) = (s1, p.start + j1);
    let mut c0 = s0;
    while c0 <= hi {
        // Rows in order in the ring: a value row is a step from the last.
        let c1 = (c0 + ROWS_AT_ONCE).min(hi + 1).min(c0 + ring.consecutive_from(c0));
        let r0 = ring.row(c0);
        assert!((r0 + c1 - c0) * p.vw <= vc.len());
        ask_for_next_span_keys(p, next, last, c0 - s0);
        for g in 0..p.kv_groups {
            let kvh = kvh0 + g;
            for j in j0..j1 {
                let (a, b) = p.seen(j, c0, c1);
                if a >= b {
                    continue;
                }
                let qi = (j - j0) * hh + g * heads;
                let w = &scores[qi * width + a - s0..][..(heads - 1) * width + b - a];
                let base = vc.as_ptr().add(r0 * p.vw + kvh * hv);
                // SAFETY: rows r0..r0 + (c1 - c0) are inside the store (asserted above).
                let rows = (a..b).map(|pos| std::slice::from_raw_parts(base.add((pos - c0) * p.vw), hv));
                L::weigh_f16_heads(w, width, heads, rows, &mut o[qi * hv..][..heads * hv]);
            }
        }
        c0 = c1;
    }
}

/// [`head_row`] for a key: `dst` is [`key_stride`] floats, and a bf16 key
/// is laid out in the lanes' order ([`lanes::bf16_lane_order`]).
#[inline(always)]
unsafe fn key_row<L: Lanes>(keys: &Rows, row: usize, width: usize, head: usize, dim: usize, dst: &mut [f32]) {
    match keys.slice(row * width + head * dim, dim) {
        Rows::BF16(r) => L::widen_bf16_lanes(r, dst),
        _ => head_row::<L>(keys, row, width, head, dim, &mut dst[..dim]),
    }
}

/// A long cache comes from memory, a row of a head at a time: while the
/// keys of positions b0..b1 are scored, ask for the next as many keys (up to
/// `hi`) and for these positions' values, read after the softmax (whole
/// rows for an item that meets every head group).
#[inline(always)]
fn prefetch_block(p: &Plan, ring: &RingRows, kvh: usize, whole_rows: bool, b0: usize, b1: usize, hi: usize) {
    for pos in b1..(2 * b1 - b0).min(hi + 1) {
        match whole_rows {
            true => prefetch_head_row(&p.keys, ring.row(pos), p.kw, 0, p.kw),
            false => prefetch_head_row(&p.keys, ring.row(pos), p.kw, kvh, p.hk),
        }
    }
    for pos in b0..b1 {
        match whole_rows {
            true => prefetch_head_row(&p.values, ring.row(pos), p.vw, 0, p.vw),
            false => prefetch_head_row(&p.values, ring.row(pos), p.vw, kvh, p.hv),
        }
    }
}

/// The frame of span s0..s1 on even positions: its first position, and
/// its width (whole pairs).
#[inline(always)]
fn bf16_frame(s0: usize, s1: usize) -> (usize, usize) {
    let f0 = s0 & !1;
    (f0, ((s1 + 1) & !1) - f0)
}

/// The exponentials of rows j0..j1 (`per_row` queries each, their scores
/// rows of the span s0..s1) rounded to bf16 and laid out in the order they
/// are weighed ([`lanes::bf16_pair_order`]) in each query's row of the
/// span's frame ([`bf16_frame`]); a position a query does not see weighs 0.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn lay_out_span_weights<L: Lanes>(p: &Plan, j0: usize, j1: usize, per_row: usize, s0: usize, s1: usize,
                                         scores: &[f32], w_pairs: &mut Vec<f32>) {
    let (f0, fw) = bf16_frame(s0, s1);
    let width = s1 - s0;
    w_pairs.clear();
    w_pairs.resize((j1 - j0) * per_row * fw, 0.0);
    for j in j0..j1 {
        let (a, b) = p.seen(j, s0, s1);
        if a >= b {
            continue;
        }
        // Whole pairs from the first even position on; an odd first position
        // and an even last one have their pairs' other halves unseen.
        let (ae, be) = (a.next_multiple_of(2), b & !1);
        let weight = |row: &[f32], pos: usize| to_bf16(row[pos - s0]).to_f32();
        for qi in (j - j0) * per_row..(j - j0 + 1) * per_row {
            let (frame, row) = (&mut w_pairs[qi * fw..][..fw], &scores[qi * width..][..width]);
            if a % 2 == 1 {
                frame[bf16_pair_order(a) - f0] = weight(row, a);
            }
            if ae < be {
                L::round_bf16_pairs(&row[ae - s0..be - s0], &mut frame[ae - f0..be - f0]);
            }
            if b % 2 == 1 {
                frame[bf16_pair_order(b - 1) - f0] = weight(row, b - 1);
            }
        }
    }
}

/// The buffers [`weigh_bf16_span`] lays its operands out in.
struct Bf16Weighing<'s> {
    w_pairs: &'s mut Vec<f32>,
    wb: &'s mut Vec<bf16>,
    v32: &'s mut Vec<f32>,
    vb: &'s mut Vec<bf16>,
}

/// The outputs of one span (positions s0..s1) for bf16 values: each query's
/// value rows weighed by its exponentials (rounded to bf16) in pairs of
/// positions from an even one, the second first ([`lanes::bf16_pair_order`];
/// a position of a pair the query does not see weighs zero). The span is
/// framed on even positions, f0..f1; a block of value rows is laid out once
/// for all the queries: in pair order and widened for the f32 loops, or
/// interleaved in pairs for the paired products, whose weights the softmax
/// laid out in `wb` already ([`span_softmax`]); the f32 loops' are laid out
/// here from the exponentials in `scores`. A decoded token's few queries
/// read the rows in place instead. `o` (`nq` rows of `hv`) may hold
/// anything: each row is zeroed, or written whole by its first sums.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn weigh_bf16_span<L: Lanes>(
    p: &Plan,
    j0: usize,
    j1: usize,
    heads: usize,
    kvh: usize,
    s0: usize,
    s1: usize,
    vc: &[bf16],
    scores: &[f32],
    bufs: Bf16Weighing,
    o: &mut [f32],
) {
    let Bf16Weighing { w_pairs, wb, v32, vb } = bufs;
    let (hv, nq) = (p.hv, (j1 - j0) * heads);
    let (f0, fw) = bf16_frame(s0, s1);
    let f1 = f0 + fw;
    let seen = |j: usize| p.seen(j, s0, s1);
    // Weighed by the paired products, the weights are laid out already, as
    // bf16s in position order, by the softmax.
    let paired = weighs_paired::<L>(p, nq);
    if !paired {
        lay_out_span_weights::<L>(p, j0, j1, heads, s0, s1, scores, w_pairs);
    }
    let ring = p.cache.ring_rows(p.il, s0);
    let value = |pos: usize| (s0..s1).contains(&pos).then(|| &vc[ring.row(pos) * p.vw + kvh * hv..][..hv]);
    if !paired && L::BF16_IN_PLACE && nq < DIRECT_QUERIES {
        // A decoded token's few queries read the rows in place, a row of
        // zeros standing for a position of a pair the query does not see.
        o.fill(0.0);
        vb.clear();
        vb.resize(hv, bf16::ZERO);
        let zeros = &vb[..hv];
        for j in j0..j1 {
            let (a, b) = seen(j);
            if a >= b {
                continue;
            }
            let (ae, be) = (a & !1, (b + 1) & !1);
            let qi = (j - j0) * heads;
            let rows = (ae..be).map(|i| match bf16_pair_order(i) {
                pos if (a..b).contains(&pos) => value(pos).expect("a position of the span"),
                _ => zeros,
            });
            L::weigh_bf16_in_place(&w_pairs[qi * fw + ae - f0..], fw, heads, rows, &mut o[qi * hv..][..heads * hv]);
        }
        return;
    }
    let block = ((ITEM_FLOATS / hv.max(1)).max(2) & !1).min(fw);
    // In one block of value rows each row that sees the span is weighed
    // once, its sums starting from zero; otherwise every block adds to them.
    let once = paired && block == fw;
    match once {
        true => {
            for j in (j0..j1).filter(|&j| seen(j).0 >= seen(j).1) {
                o[(j - j0) * heads * hv..][..heads * hv].fill(0.0);
            }
        }
        false => o.fill(0.0),
    }
    let mut c0 = f0;
    while c0 < f1 {
        let c1 = (c0 + block).min(f1);
        if paired {
            vb.resize(block * hv, bf16::ZERO);
            for e in (c0..c1).step_by(2) {
                L::pair_bf16_values(value(e), value(e + 1), &mut vb[(e - c0) * hv..][..2 * hv]);
            }
        } else {
            v32.resize(block * hv, 0.0);
            for pos in c0..c1 {
                let dst = &mut v32[(bf16_pair_order(pos) - c0) * hv..][..hv];
                match value(pos) {
                    Some(row) => L::widen_bf16(row, dst),
                    None => dst.fill(0.0),
                }
            }
        }
        let clip = |j: usize| {
            let (a, b) = seen(j);
            (a.max(c0), b.min(c1))
        };
        let mut j = j0;
        while j < j1 {
            let (a, b) = clip(j);
            // Rows that see the same positions share each value row.
            let rows = (j + 1..j1).take_while(|&r| clip(r) == (a, b)).count() + 1;
            if a < b {
                // Whole pairs: the frame's pairs are the block's.
                let (ae, be) = (a & !1, (b + 1) & !1);
                let (qi, n) = ((j - j0) * heads, rows * heads);
                let out = &mut o[qi * hv..][..n * hv];
                let w_at = qi * fw + ae - f0;
                let v_at = (ae - c0) * hv;
                match paired {
                    true => L::weigh_bf16_heads(&wb[w_at..][..(n - 1) * fw + be - ae], fw, n,
                                                &vb[v_at..][..(be - ae) * hv], out, once),
                    false => L::weigh_heads(&w_pairs[w_at..][..(n - 1) * fw + be - ae], fw, n,
                                            &v32[v_at..][..(be - ae) * hv], out),
                }
            }
            j += rows;
        }
        c0 = c1;
    }
}

/// `n` elements from `at`, of the type the caller reads them as.
///
/// # Safety
/// `at` starts `n` elements of that type inside one allocation.
#[inline(always)]
unsafe fn slice_at<'a, T>(at: *const u8, n: usize) -> &'a [T] {
    std::slice::from_raw_parts(at.cast(), n)
}

/// [`span_rows`]'s weighing of bf16 values: each query's weights laid out in
/// their order over the span framed on even positions ([`weigh_bf16_span`]),
/// then a block of rows at a time, every group's queries meet its value rows
/// read in place (a row of zeros standing for a position of a pair the
/// query does not see), while the next span's first keys are asked for.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn weigh_rows_bf16<L: Lanes>(
    p: &Plan,
    j0: usize,
    j1: usize,
    h0: usize,
    s0: usize,
    s1: usize,
    scores: &[f32],
    w_pairs: &mut Vec<f32>,
    zeros: &mut Vec<bf16>,
    o: &mut [f32],
) {
    let Rows::BF16(vc) = p.values else { unreachable!("bf16 values") };
    let (hv, heads) = (p.hv, p.heads);
    let hh = heads * p.kv_groups;
    let kvh0 = h0 / p.group;
    let (f0, fw) = bf16_frame(s0, s1);
    let f1 = f0 + fw;
    let seen = |j: usize| p.seen(j, s0, s1);
    lay_out_span_weights::<L>(p, j0, j1, hh, s0, s1, scores, w_pairs);
    zeros.clear();
    zeros.resize(hv, bf16::ZERO);
    let ring = p.cache.ring_rows(p.il, s0);
    let (next, last) = (s1, p.start + j1);
    let mut c0 = f0;
    while c0 < f1 {
        let c1 = (c0 + ROWS_AT_ONCE).min(f1);
        ask_for_next_span_keys(p, next, last, c0 - f0);
        for g in 0..p.kv_groups {
            let kvh = kvh0 + g;
            for j in j0..j1 {
                let (a, b) = seen(j);
                let (a, b) = (a.max(c0), b.min(c1));
                if a >= b {
                    continue;
                }
                let (ae, be) = (a & !1, (b + 1) & !1);
                let qi = (j - j0) * hh + g * heads;
                let rows = (ae..be).map(|i| match bf16_pair_order(i) {
                    pos if (a..b).contains(&pos) => &vc[ring.row(pos) * p.vw + kvh * hv..][..hv],
                    _ => &zeros[..],
                });
                L::weigh_bf16_in_place(&w_pairs[qi * fw + ae - f0..], fw, heads, rows, &mut o[qi * hv..][..heads * hv]);
            }
        }
        c0 = c1;
    }
}

/// Asks the memory system for head `head`'s `dim` elements of cache row
/// `row` (rows `width` wide), into the core's second-level cache; reads
/// nothing. Not into the first: its few outstanding misses fill with the
/// requests, and the loads of the rows being scored wait behind them (on a
/// Zen 4 that held a decoded token at depth to well under memory's rate).
#[inline(always)]
fn prefetch_head_row(rows: &Rows, row: usize, width: usize, head: usize, dim: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
        let bytes = rows.slice(row * width + head * dim, dim).bytes();
        let p = bytes.as_ptr();
        let mut off = 0;
        while off < bytes.len() {
            // SAFETY: a prefetch reads nothing and cannot fault; the address
            // is inside the row sliced above.
            unsafe { _mm_prefetch::<_MM_HINT_T1>(p.add(off).cast()) };
            off += 64;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (rows, row, width, head, dim);
}

/// Head `head`'s `dim` elements of cache row `row` (rows `width` wide) as
/// f32 in `dst`: a key or value row made ready for the element loops.
#[inline(always)]
unsafe fn head_row<L: Lanes>(rows: &Rows, row: usize, width: usize, head: usize, dim: usize, dst: &mut [f32]) {
    match rows.slice(row * width + head * dim, dim) {
        Rows::F16(r) => L::widen(r, dst),
        Rows::BF16(r) => L::widen_bf16(r, dst),
        Rows::F32(r) => dst.copy_from_slice(r),
        Rows::Q8_0(r) => L::widen_q8_0(r, &mut dst[..dim]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ember_kv::{KvType, LayerShape};

    /// The straightforward algorithm: one (position, head) at a time, the
    /// softmax of each span of positions folded in order.
    fn reference(cache: &KvCache, il: usize, s: &AttnShape, q: &[f32], start: usize, t: usize, out: &mut [f32]) {
        let (hk, hv) = (s.head_dim_k, s.head_dim_v);
        let group = s.n_head / s.n_head_kv;
        let kw = cache.shape(il).k_width;
        let vw = cache.shape(il).v_width;
        let keys = cache.keys(il);
        let values = cache.values(il);
        for (i, o) in out[..t * s.n_head * hv].chunks_mut(hv).enumerate() {
            let (j, h) = (i / s.n_head, i % s.n_head);
            let pos = start + j;
            let kvh = h / group;
            let qh = &q[j * s.n_head * hk + h * hk..][..hk];
            let first = match s.window {
                Some(w) => (pos + 1).saturating_sub(w),
                None => 0,
            };
            let pad = |x: Vec<f32>| {
                let mut x = x;
                x.resize(hk.next_multiple_of(8), 0.0);
                x
            };
            // A bf16 row in the order the lanes meet it, padded to whole steps.
            let lane_order = |row: Vec<bf16>| {
                let mut x = vec![0.0; hk.next_multiple_of(BF16_STEP)];
                bf16_lane_order(&row, &mut x);
                x
            };
            let qp = match &keys {
                Rows::F16(_) => pad(qh.iter().map(|&x| f16::from_f32(x).to_f32()).collect()),
                Rows::BF16(_) => lane_order(qh.iter().map(|&x| to_bf16(x)).collect()),
                _ => pad(qh.to_vec()),
            };
            let (mut acc_m, mut acc_l, mut acc_o) = (f32::NEG_INFINITY, 0.0f64, vec![0.0f32; hv]);
            for k in first / SPAN..=pos / SPAN {
                let (s0, s1) = (first.max(k * SPAN), (pos + 1).min((k + 1) * SPAN));
                let mut scores = Vec::new();
                let mut max = f32::NEG_INFINITY;
                for p in s0..s1 {
                    let row = cache.row_of(il, p);
                    let score = match &keys {
                        Rows::Q8_0(_) => s.scale * q8_0_dot(qh, keys.slice(row * kw + kvh * hk, hk).bytes()),
                        Rows::BF16(k) => s.scale * dot8(&qp, &lane_order(k[row * kw + kvh * hk..][..hk].to_vec())),
                        _ => {
                            let mut key = vec![0.0; hk];
                            keys.widen(row * kw + kvh * hk, &mut key);
                            s.scale * dot8(&qp, &pad(key))
                        }
                    };
                    max = max.max(score);
                    scores.push(score);
                }
                let sum = crate::ops::exp_shifted_sum_scalar(&mut scores, max) as f64;
                let mut o_k = vec![0.0f32; hv];
                // bf16 values are met in pairs from an even position, the second first.
                let order: Vec<usize> = match &values {
                    Rows::BF16(_) => (s0 & !1..s1 + 1).step_by(2).flat_map(|e| [e + 1, e]).filter(|p| (s0..s1).contains(p)).collect(),
                    _ => (s0..s1).collect(),
                };
                for p in order {
                    let e = scores[p - s0];
                    let row = cache.row_of(il, p);
                    let mut v32 = vec![0.0; hv];
                    values.widen(row * vw + kvh * hv, &mut v32);
                    match &values {
                        Rows::F16(_) => fma_row(f16::from_f32(e).to_f32(), &v32, &mut o_k),
                        Rows::BF16(_) => fma_row(to_bf16(e).to_f32(), &v32, &mut o_k),
                        _ => fma_row(e, &v32, &mut o_k),
                    }
                }
                fold(&mut acc_m, &mut acc_l, &mut acc_o, max, sum, &o_k);
            }
            finish(acc_l, &acc_o, o);
        }
    }

    /// A query's score against a Q8_0 key as the module's doc defines it:
    /// the query quantized, then block by block.
    fn q8_0_dot(q: &[f32], key: &[u8]) -> f32 {
        let mut q8 = vec![0u8; key.len()];
        ember_quant::quantize_row_q8_0(q, &mut q8).unwrap();
        let scale = |b: &[u8]| f16::from_le_bytes([b[0], b[1]]).to_f32();
        let mut acc = 0.0f32;
        for (qb, kb) in q8.chunks_exact(Q8_0_BYTES).zip(key.chunks_exact(Q8_0_BYTES)) {
            let dot: i32 = qb[2..].iter().zip(&kb[2..]).map(|(&a, &b)| a as i8 as i32 * b as i8 as i32).sum();
            acc = (scale(qb) * scale(kb)).mul_add(dot as f32, acc);
        }
        acc
    }

    /// The 8-bit scores against the exact ones (the f32 query with the
    /// widened key): they part by the query's rounding to Q8_0 alone, at most
    /// half a quantization step of each block per element, times the key.
    /// And the vector form gives the scalar's bits, with key quants at the
    /// ends of their range (-128, which no quantizer writes but a restored
    /// state may hold, and 127).
    #[test]
    fn q8_0_scores_are_the_exact_ones_but_for_the_querys_rounding() {
        let mut rng = Rng(0x8b175);
        for hk in [32, 64, 256] {
            for trial in 0..20 {
                let q = rng.vec(hk, if trial % 2 == 0 { 3.0 } else { 0.01 });
                let mut keys = vec![0u8; 8 * hk / Q8_0_BLOCK * Q8_0_BYTES];
                let bytes = hk / Q8_0_BLOCK * Q8_0_BYTES;
                for key in keys.chunks_exact_mut(bytes) {
                    ember_quant::quantize_row_q8_0(&rng.vec(hk, 2.0), key).unwrap();
                }
                if trial == 3 {
                    for (i, b) in keys.iter_mut().enumerate() {
                        if i % Q8_0_BYTES >= 2 {
                            *b = if i % 3 == 0 { 0x80 } else { 0x7f };
                        }
                    }
                }
                let rows: [&[u8]; 8] = std::array::from_fn(|i| &keys[i * bytes..][..bytes]);
                let mut dk = vec![0.0f32; 8 * hk / Q8_0_BLOCK];
                for (i, key) in rows.iter().enumerate() {
                    for b in 0..hk / Q8_0_BLOCK {
                        dk[8 * b + i] = f16::from_le_bytes([key[b * Q8_0_BYTES], key[b * Q8_0_BYTES + 1]]).to_f32();
                    }
                }
                let mut q8 = vec![0u8; bytes];
                ember_quant::quantize_row_q8_0(&q, &mut q8).unwrap();
                let mut got = [0.0f32; 8];
                unsafe { Scalar::scores8_q8_0(&q8, &rows, &dk, &mut got) };
                #[cfg(target_arch = "x86_64")]
                if SimdLevel::Avx2.runs_here() {
                    let mut vector = [0.0f32; 8];
                    unsafe { avx2::Avx2::scores8_q8_0(&q8, &rows, &dk, &mut vector) };
                    assert_eq!(vector.map(f32::to_bits), got.map(f32::to_bits), "hk {hk} trial {trial}");
                }
                for (i, key) in rows.iter().enumerate() {
                    assert_eq!(got[i].to_bits(), q8_0_dot(&q, key).to_bits());
                    let mut wide = vec![0.0f32; hk];
                    Rows::Q8_0(key).widen(0, &mut wide);
                    let exact: f64 = q.iter().zip(&wide).map(|(&a, &b)| a as f64 * b as f64).sum();
                    // Half a step of the query's block per element, plus the f32 roundings of the sum.
                    let bound: f64 = q.chunks(Q8_0_BLOCK).zip(wide.chunks(Q8_0_BLOCK)).map(|(qb, kb)| {
                        let step = qb.iter().fold(0.0f32, |m, x| m.max(x.abs())) as f64 / 127.0;
                        kb.iter().map(|&k| (k as f64).abs()).sum::<f64>() * (0.5 * step * 1.001)
                    }).sum::<f64>() + 1e-5 * exact.abs() + 1e-6;
                    assert!((got[i] as f64 - exact).abs() <= bound, "hk {hk} trial {trial} key {i}: {} vs {exact} (bound {bound})", got[i]);
                }
            }
        }
    }

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> f32 {
            self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        }
        fn vec(&mut self, n: usize, amp: f32) -> Vec<f32> {
            (0..n).map(|_| amp * self.next()).collect()
        }
    }

    /// Passes of uneven lengths over a full-context layer and a sliding-window
    /// layer whose ring wraps mid-pass, for every split the planner can pick.
    fn check(ty: KvType, n_head: usize, n_head_kv: usize, hk: usize, hv: usize) {
        let splits = [(1, ITEM_FLOATS), (2, ITEM_FLOATS), (1, 1 << 20), (1, 8 * hk), (3, 1), (64, 1)];
        check_passes(ty, (n_head, n_head_kv, hk, hv), 5, 128, &[1, 24, 3, 1, 17, 24, 2], &splits);
    }

    /// Each pass of `passes` over a context of `ctx` positions (a window of
    /// `window` on the second layer) against the reference, bit for bit, for
    /// each (threads, item floats) of `splits`, with and without the vector
    /// loops, and through `attention_many` beside an empty sequence.
    fn check_passes(
        ty: KvType,
        (n_head, n_head_kv, hk, hv): (usize, usize, usize, usize),
        window: usize,
        ctx: usize,
        passes: &[usize],
        splits: &[(usize, usize)],
    ) {
        let max_batch = passes.iter().copied().max().unwrap_or(1);
        let shapes = [
            LayerShape { k_width: n_head_kv * hk, v_width: n_head_kv * hv, window: None },
            LayerShape { k_width: n_head_kv * hk, v_width: n_head_kv * hv, window: Some(window) },
        ];
        let mut cache = KvCache::new(ty, ctx, max_batch, &shapes);
        let mut rng = Rng(0x5eed ^ (hk * 31 + hv + ctx) as u64);
        let mut start = 0;
        let levels = SimdLevel::all_here();
        let pool = Pool::new(2).unwrap();
        for &t in passes {
            for il in 0..2 {
                for j in 0..t {
                    let k = rng.vec(shapes[il].k_width, 2.0);
                    let v = rng.vec(shapes[il].v_width, 1.0);
                    cache.write(il, start + j, &k, &v);
                }
            }
            for il in 0..2 {
                let s = AttnShape {
                    n_head,
                    n_head_kv,
                    head_dim_k: hk,
                    head_dim_v: hv,
                    scale: 1.0 / (hk as f32).sqrt(),
                    window: shapes[il].window,
                };
                let q = rng.vec(t * n_head * hk, 3.0);
                let mut want = vec![0.0; t * n_head * hv];
                reference(&cache, il, &s, &q, start, t, &mut want);
                for &(threads, floats) in splits {
                    for &level in &levels {
                        let mut got = vec![f32::NAN; t * n_head * hv];
                        attention_with(&pool, &cache, il, &s, &q, start, t, &mut got, threads, floats, level);
                        let bad = got.iter().zip(&want).position(|(g, w)| g.to_bits() != w.to_bits());
                        assert!(bad.is_none(), "{ty:?} layer {il} t {t} start {start} threads {threads} floats {floats} \
                             level {level:?}: element {bad:?}");
                    }
                }
                // The pass's entry point, the sequence beside an empty one.
                let mut got = vec![f32::NAN; t * n_head * hv];
                let mut none: [f32; 0] = [];
                let mut parts = [
                    AttnPart { cache: &cache, q: &q[..0], start, t: 0, out: &mut none },
                    AttnPart { cache: &cache, q: &q, start, t, out: &mut got },
                ];
                attention_many(&pool, il, &s, &mut parts);
                assert!(got.iter().zip(&want).all(|(g, w)| g.to_bits() == w.to_bits()), "{ty:?} layer {il} t {t}: attention_many");
            }
            cache.commit(t);
            start += t;
        }
    }

    #[test]
    fn matches_reference_q8_0() {
        check(KvType::Q8_0, 6, 2, 64, 32);
        check(KvType::Q8_0, 4, 1, 256, 256);
        check(KvType::Q8_0, 9, 3, 64, 64);
        check(KvType::Q8_0, 4, 2, 32, 64);
        check(KvType::Q8_0, 10, 2, 32, 32);
    }

    /// Shapes (heads, key heads, key and value widths) the two-byte caches
    /// are held to the reference at: heads not a whole number of lanes or
    /// steps; heads sharing value rows in twos (over rows not a whole number
    /// of 32-float chunks), and in fives; and heads as wide as Gemma 4's
    /// global layers', past the keys the AVX-512 scores pair on the stack.
    const TWO_BYTE_SHAPES: [(usize, usize, usize, usize); 7] = [
        (6, 2, 40, 36), (9, 3, 64, 64), (4, 1, 256, 256), (4, 4, 19, 7),
        (4, 2, 32, 48), (10, 2, 32, 72), (4, 2, 512, 512),
    ];

    #[test]
    fn matches_reference_f16() {
        for (n_head, n_head_kv, hk, hv) in TWO_BYTE_SHAPES {
            check(KvType::F16, n_head, n_head_kv, hk, hv);
        }
    }

    /// A bf16 cache: every split and level (the paired products where the
    /// core has them) against the reference, bit for bit; the windows of
    /// `check` start at odd positions too.
    #[test]
    fn matches_reference_bf16() {
        for (n_head, n_head_kv, hk, hv) in TWO_BYTE_SHAPES {
            check(KvType::BF16, n_head, n_head_kv, hk, hv);
        }
    }

    /// AVX-512 BF16's paired product, `vdpbf16ps`, adds per lane the odd
    /// element's product and then the even's, each rounded (products of two
    /// bf16s being exact): what the f32 loops over [`bf16_lane_order`] are
    /// written to give.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_paired_product_adds_the_odd_elements_product_first() {
        if !SimdLevel::Avx512Bf16.runs_here() {
            return;
        }
        let mut rng = Rng(0xbf16);
        let q: Vec<bf16> = rng.vec(32 * 64, 3.0).into_iter().map(to_bf16).collect();
        let k: Vec<bf16> = rng.vec(32 * 64, 2.0).into_iter().map(to_bf16).collect();
        let widen = |row: &[bf16]| {
            let mut x = vec![0.0; 64];
            bf16_lane_order(row, &mut x);
            x
        };
        let qw: Vec<f32> = q.chunks_exact(64).flat_map(widen).collect();
        let kw: Vec<f32> = k.chunks_exact(64).flat_map(widen).collect();
        let mut lanes = vec![0.0f32; 32 * 32];
        for b in 0..4 {
            unsafe { Scalar::scores8_scaled(&qw, 32, 64, &kw[b * 8 * 64..], 0.125, lanes.as_mut_ptr().add(8 * b), 32) };
        }
        // Whole and partial blocks, one and two to a call, and each count of
        // queries the kernels take at once; a key past `valid` is not written.
        for (keys, count) in [(32, 32), (20, 31), (16, 11), (9, 7), (8, 1), (25, 2)] {
            let rows: Vec<&[bf16]> = k.chunks_exact(64).take(keys).collect();
            let blocks = keys.div_ceil(16);
            let mut transposed = vec![bf16::ONE; 16 * blocks * 64];
            transpose_bf16_keys(&rows, blocks, 64, &mut transposed);
            let mut native = vec![f32::NAN; 32 * 32];
            unsafe {
                avx512::Avx512::<true>::scores16_bf16_scaled(&q, count, 64, &transposed, keys, 0.125,
                                                            native.as_mut_ptr(), 32)
            };
            for (i, (native, lanes)) in native.chunks_exact(32).zip(lanes.chunks_exact(32)).enumerate() {
                let written = if i < count { keys } else { 0 };
                assert_eq!(native[..written].iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                           lanes[..written].iter().map(|x| x.to_bits()).collect::<Vec<_>>(), "{keys} keys, query {i}");
                assert!(native[written..].iter().all(|x| x.is_nan()), "{keys} keys, query {i}: past the valid keys");
            }
        }
        // And the weighing: pairs of positions, the second's product first.
        let (heads, n, pairs) = (3, 40, 9);
        let w: Vec<bf16> = rng.vec(heads * 2 * pairs, 1.0).into_iter().map(|x| to_bf16(x.abs())).collect();
        let rows: Vec<Vec<bf16>> = (0..2 * pairs).map(|_| rng.vec(n, 1.0).into_iter().map(to_bf16).collect()).collect();
        let mut v = vec![bf16::ZERO; 2 * pairs * n];
        for (k, out) in v.chunks_exact_mut(2 * n).enumerate() {
            pair_bf16_values(Some(&rows[2 * k]), Some(&rows[2 * k + 1]), out);
        }
        let mut native = rng.vec(heads * n, 1.0);
        let mut chain = native.clone();
        unsafe { avx512::Avx512::<true>::weigh_bf16_heads(&w, 2 * pairs, heads, &v, &mut native, false) };
        for (g, o) in chain.chunks_exact_mut(n).enumerate() {
            for pos in (0..2 * pairs).map(bf16_pair_order) {
                fma_row(w[g * 2 * pairs + pos].to_f32(), &rows[pos].iter().map(|x| x.to_f32()).collect::<Vec<_>>(), o);
            }
        }
        assert_eq!(native.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), chain.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
    }

    /// Widened keys laid out sixteen to a register: the AVX-512 layout is
    /// the scalar one (keys shorter than the layout, fewer than its blocks
    /// hold), and each kernel run (one and two blocks, each count of
    /// queries taken at once) gives the eight-lane loops' scores, bit for
    /// bit, writing no score past the keys it was given.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn widened_keys_sixteen_to_a_register_score_as_eight() {
        if !SimdLevel::Avx512Vnni.runs_here() {
            return;
        }
        type V = avx512::Avx512<false>;
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let mut rng = Rng(0x16f3);
        let k = rng.vec(32 * 80, 2.0);
        for (n, hk, keys) in [(8, 8, 16), (64, 64, 32), (48, 40, 17), (80, 80, 1), (24, 21, 20), (32, 30, 31)] {
            let rows: Vec<&[f32]> = k.chunks_exact(80).take(keys).map(|r| &r[..hk]).collect();
            let blocks = keys.div_ceil(16);
            let (mut vector, mut scalar) = (vec![1.0; 16 * blocks * n], vec![0.0; 16 * blocks * n]);
            unsafe { V::transpose_f32_keys(&rows, blocks, n, &mut vector) };
            transpose_f32_keys(&rows, blocks, n, &mut scalar);
            assert_eq!(bits(&vector), bits(&scalar), "n {n} hk {hk} keys {keys}");
        }
        let q = rng.vec(32 * 64, 3.0);
        let mut lanes = vec![0.0f32; 32 * 32];
        for b in 0..4 {
            unsafe { Scalar::scores8_scaled(&q, 32, 64, &k[b * 8 * 64..], 0.125, lanes.as_mut_ptr().add(8 * b), 32) };
        }
        for (keys, count) in [(32, 32), (20, 31), (16, 11), (9, 7), (8, 1), (25, 2)] {
            let rows: Vec<&[f32]> = k.chunks_exact(64).take(keys).collect();
            let blocks = keys.div_ceil(16);
            let mut transposed = vec![1.0; 16 * blocks * 64];
            transpose_f32_keys(&rows, blocks, 64, &mut transposed);
            let mut native = vec![f32::NAN; 32 * 32];
            unsafe { V::scores16_scaled(&q, count, 64, &transposed, keys, 0.125, native.as_mut_ptr(), 32) };
            for (i, (native, lanes)) in native.chunks_exact(32).zip(lanes.chunks_exact(32)).enumerate() {
                let written = if i < count { keys } else { 0 };
                assert_eq!(bits(&native[..written]), bits(&lanes[..written]), "{keys} keys, query {i}");
                assert!(native[written..].iter().all(|x| x.is_nan()), "{keys} keys, query {i}: past the valid keys");
            }
        }
    }

    /// The AVX-512 forms of the bf16 layouts, which take no BF16 instruction
    /// and so run at any AVX-512 level, against the scalar ones: keys of
    /// every shape the blocks take, and value rows (with the smallest normal,
    /// zeros of both signs and the largest values among their elements) that
    /// are and are not whole registers.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_avx512_bf16_layouts_are_the_scalar_ones() {
        if !SimdLevel::Avx512Vnni.runs_here() {
            return;
        }
        let mut rng = Rng(0x7a05);
        let k: Vec<bf16> = rng.vec(32 * 80, 2.0).into_iter().map(to_bf16).collect();
        // Keys shorter than the laid-out width (zeros after), odd ones, and
        // fewer keys than the blocks hold.
        for (n, hk, keys) in [(16, 16, 16), (64, 64, 32), (48, 40, 17), (80, 80, 1), (48, 41, 20), (32, 30, 31)] {
            let rows: Vec<&[bf16]> = k.chunks_exact(80).take(keys).map(|r| &r[..hk]).collect();
            let blocks = keys.div_ceil(16);
            let (mut vector, mut scalar) = (vec![bf16::ONE; 16 * blocks * n], vec![bf16::ZERO; 16 * blocks * n]);
            unsafe { avx512::Avx512::<false>::transpose_bf16_keys(&rows, blocks, n, &mut vector) };
            transpose_bf16_keys(&rows, blocks, n, &mut scalar);
            assert_eq!(vector.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                       scalar.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), "n {n} hk {hk} keys {keys}");
        }
        let bits = |v: &[bf16]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let special = [f32::from_bits(0x3f80_8000), f32::from_bits(0x3f81_8000), f32::MIN_POSITIVE,
                       f32::from_bits(0x007f_ffff), -f32::MIN_POSITIVE, -1.0e-39, 0.0, -0.0, 1.0, 3.0e38];
        let mut rng = Rng(0x1a70);
        for n in [1, 15, 16, 31, 32, 33, 64, 100] {
            let mut x = rng.vec(n, 1.0);
            for (i, &v) in special.iter().enumerate().take(n) {
                x[(i * 7) % n] = v;
            }
            let a: Vec<bf16> = x.iter().map(|&v| to_bf16(v)).collect();
            let b: Vec<bf16> = x.iter().rev().map(|&v| to_bf16(v)).collect();
            for (first, second) in [(Some(&a[..]), Some(&b[..])), (None, Some(&b[..])), (Some(&a[..]), None)] {
                let (mut vector, mut scalar) = (vec![bf16::ZERO; 2 * n], vec![bf16::ONE; 2 * n]);
                unsafe { avx512::Avx512::<false>::pair_bf16_values(first, second, &mut vector) };
                pair_bf16_values(first, second, &mut scalar);
                assert_eq!(bits(&vector), bits(&scalar), "pairs {n}");
            }
        }
        // Exponentials rounded in pair order: ties both ways, subnormals,
        // zeros of both signs, a value that rounds to infinity.
        let special = [special.as_slice(), &[f32::from_bits(0x7f7f_ffff)]].concat();
        for n in [0, 2, 14, 16, 30, 32, 34, 64, 100] {
            let mut x = rng.vec(n, 1.0);
            for (i, &v) in special.iter().enumerate().take(n) {
                x[(i * 7) % n] = v;
            }
            let (mut vector, mut scalar) = (vec![f32::NAN; n + 1], vec![f32::NAN; n + 1]);
            unsafe { avx512::Avx512::<false>::round_bf16_pairs(&x, &mut vector) };
            round_bf16_pairs(&x, &mut scalar);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&vector), bits(&scalar), "rounded pairs {n}");
            assert!(vector[n].is_nan(), "nothing written past the run");
        }
    }

    /// A pass of several decoded tokens, one per conversation (the plan
    /// that keeps head groups whole when the sequences share the threads),
    /// and a prompt beside them: each output equals the reference alone.
    #[test]
    fn several_sequences_in_one_pass_match_the_reference() {
        let (n_head, n_head_kv, hk, hv) = (9, 3, 64, 64);
        let shapes = [LayerShape { k_width: n_head_kv * hk, v_width: n_head_kv * hv, window: Some(7) }];
        let s = AttnShape { n_head, n_head_kv, head_dim_k: hk, head_dim_v: hv, scale: 0.125, window: Some(7) };
        let mut rng = Rng(0xba7c4);
        let pool = Pool::new(2).unwrap();
        for ty in [KvType::F16, KvType::BF16, KvType::F32] {
            for ts in [&[1usize, 1, 1, 1][..], &[1, 1], &[1, 5, 1]] {
                // Conversations of different lengths, each with its next rows written.
                let mut caches: Vec<KvCache> = (0..ts.len()).map(|_| KvCache::new(ty, 64, 8, &shapes)).collect();
                let mut starts = vec![];
                for (i, (cache, &t)) in caches.iter_mut().zip(ts).enumerate() {
                    let held = 3 + 9 * i;
                    for pos in 0..held + t {
                        cache.write(0, pos, &rng.vec(n_head_kv * hk, 2.0), &rng.vec(n_head_kv * hv, 1.0));
                        if pos < held {
                            cache.commit(1);
                        }
                    }
                    starts.push(held);
                }
                let qs: Vec<Vec<f32>> = ts.iter().map(|&t| rng.vec(t * n_head * hk, 3.0)).collect();
                let mut outs: Vec<Vec<f32>> = ts.iter().map(|&t| vec![f32::NAN; t * n_head * hv]).collect();
                let mut parts: Vec<AttnPart> = caches
                    .iter()
                    .zip(&qs)
                    .zip(outs.iter_mut())
                    .zip(ts.iter().zip(&starts))
                    .map(|(((cache, q), out), (&t, &start))| AttnPart { cache, q, start, t, out })
                    .collect();
                attention_many(&pool, 0, &s, &mut parts);
                drop(parts);
                for (i, &t) in ts.iter().enumerate() {
                    let mut want = vec![0.0; t * n_head * hv];
                    reference(&caches[i], 0, &s, &qs[i], starts[i], t, &mut want);
                    assert!(outs[i].iter().zip(&want).all(|(g, w)| g.to_bits() == w.to_bits()), "{ty:?} passes {ts:?}: sequence {i}");
                }
            }
        }
    }

    /// Long contexts, where rows see many spans: a decoded token's spans
    /// shared out among the threads (every split of them) and folded in a
    /// second step, a prompt's tiles folding theirs, a window crossing span
    /// edges; each output equal to the reference, bit for bit.
    #[test]
    fn spans_shared_out_at_depth_match_the_reference() {
        let w = SPAN / 2;
        let passes = [w, w, w, w, w, 1, 3, 40, 1, 2, w, w, 1];
        assert!(passes.iter().sum::<usize>() > 3 * SPAN, "the passes reach depth");
        let splits = [(1, ITEM_FLOATS), (2, ITEM_FLOATS), (3, 1), (8, ITEM_FLOATS), (64, 1), (64, 1 << 20)];
        for (ty, shape) in [(KvType::F16, (9, 3, 64, 64)), (KvType::Q8_0, (4, 2, 64, 32)), (KvType::F32, (6, 2, 24, 20)),
                            (KvType::BF16, (4, 1, 256, 256)), (KvType::BF16, (9, 3, 64, 64))] {
            check_passes(ty, shape, 3 * SPAN / 2 + 5, 6 * SPAN, &passes, &splits);
        }
    }

    #[test]
    fn a_split_pass_shares_out_spans_and_a_short_one_does_not() {
        let (n_head, n_head_kv, hk, hv) = (9, 3, 64, 64);
        let shapes = [LayerShape { k_width: n_head_kv * hk, v_width: n_head_kv * hv, window: None }];
        let mut cache = KvCache::new(KvType::F16, 8 * SPAN, 8, &shapes);
        for pos in 0..5 * SPAN {
            cache.write(0, pos, &vec![0.0; n_head_kv * hk], &vec![0.0; n_head_kv * hv]);
            cache.commit(1);
        }
        let s = AttnShape { n_head, n_head_kv, head_dim_k: hk, head_dim_v: hv, scale: 0.125, window: None };
        let q = vec![0.0; n_head * hk];
        // A decoded token at depth: its spans shared out, every item reading whole rows for all groups.
        let deep = Plan::new(&cache, 0, &s, &q, 5 * SPAN, 1, 8, ITEM_FLOATS);
        assert_eq!((deep.heads, deep.kv_groups, deep.ranges, deep.n_spans), (3, 3, 4, 6));
        assert_eq!(deep.items(), 4);
        // Near the start there is one span: single heads instead.
        let short = Plan::new(&cache, 0, &s, &q, 10, 1, 8, ITEM_FLOATS);
        assert_eq!((short.heads, short.ranges), (1, 1));
    }

    #[test]
    fn matches_reference_f32() {
        check(KvType::F32, 6, 2, 40, 36);
        check(KvType::F32, 4, 1, 256, 256);
        check(KvType::F32, 4, 4, 19, 7);
        // Groups of two, five (four heads a sweep, then one) and eight.
        check(KvType::F32, 4, 2, 16, 16);
        check(KvType::F32, 10, 2, 24, 20);
        check(KvType::F32, 8, 1, 32, 48);
    }
}

