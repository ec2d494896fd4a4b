// Causal attention of `t` queries at positions start.. over a cache of
// keys and values (rows at position % ring, f16 or Q8_0: `kv_read_*.wgsl`
// reads them), each query head reading its group's key-value head, with an
// optional sliding window: a query at p sees positions p + 1 - window ..= p.
// One workgroup a (QUERIES neighbouring queries, GROUP heads of one
// key-value head, share of the queries' blocks): its threads score a block
// of 64 positions at a time for each (query, head) pair, softmax each
// pair's from its maximum, and weigh the value rows by them, each key and
// value element read once for all the pairs (GROUP, QUERIES and
// PER_THREAD, the value elements a thread holds, come from `kernels.rs`).
// The pairs' queries and, a chunk at a time, the block's keys are staged
// in workgroup memory (`kv_read_*.wgsl`), read from the buffers in runs.
// Each pair's arithmetic is one pair's alone, so the bits depend on neither
// GROUP nor QUERIES. The blocks fold into each pair's output as
// `attention_blocks.wgsl` says. A query's blocks may be shared out over
// `splits` workgroups, `blocks_per_group` each, QUERIES being 1
// (flash-decoding: a decoded token's few heads alone would leave most of a
// card idle); then each block's maximum, sum and unnormalised output go to
// `parts`, and `attention_merge.wgsl` folds them, in the order one
// workgroup would.

struct Params {
    t: u32,
    start: u32,
    n_head: u32,
    n_head_kv: u32,
    dk: u32,
    dv: u32,
    ring: u32,
    // 0: no window.
    window: u32,
    scale: f32,
    // The first row of q and out this call's queries are in.
    row0: u32,
    // Blocks a workgroup takes, and workgroups a query's blocks are shared
    // out over (1: one takes them all and writes `out` itself).
    blocks_per_group: u32,
    splits: u32,
    // The block of the layout `out` is written in for the product that
    // reads it (`block_inputs.wgsl`'s; 1: rows as they are).
    block: u32,
    // The most blocks a query of the call sees: the parts a (query, head)
    // holds.
    most_blocks: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<storage, read> q: array<f32>;
// The layer's cache, in its format (`kv_read_*.wgsl` reads it).
@group(0) @binding(1) var<storage, read> cache_k: array<u32>;
@group(0) @binding(2) var<storage, read> cache_v: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
// Per (row, head, block): its maximum, its sum, then dv unnormalised outputs.
@group(0) @binding(4) var<storage, read_write> parts: array<f32>;
var<immediate> p: Params;

// A workgroup's threads: one a position of a block.
const WG: u32 = BLOCK_POSITIONS;
// The (query, head) pairs a workgroup takes: pair n is query n / GROUP of
// its QUERIES and head n % GROUP of its GROUP.
const PAIRS: u32 = GROUP * QUERIES;
// A block's scores of each pair, folded to their maximum (`block_maxes`),
// then its probabilities: pair n's from n * WG.
var<workgroup> maxes: array<f32, WG * PAIRS>;
var<workgroup> probs: array<f32, WG * PAIRS>;
// The pairs' queries, staged once: pair n's dk elements from n * Q_WIDTH
// (zeros past them), read four at a time by every thread where each read
// them one at a time from the buffer. Heads are at most Q_WIDTH wide
// (`kernels.rs` sizes PER_THREAD for the wider of the keys and values).
const Q_WIDTH: u32 = WG * PER_THREAD;
var<workgroup> staged_queries: array<vec4<f32>, PAIRS * Q_WIDTH / 4u>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) g: vec3<u32>, invocation: Invocation) {
    let lid = index_of(invocation);
    let head0 = g.x * GROUP;
    let row0 = g.y * QUERIES;
    let kvh = head0 / (p.n_head / p.n_head_kv);
    let v_stride = p.n_head_kv * p.dv;
    // Each query's position and first block (counted from position 0); in
    // a short last workgroup, the queries past the call's last repeat it
    // and are not written.
    var pos: array<u32, QUERIES>;
    var first: array<u32, QUERIES>;
    var first_block: array<u32, QUERIES>;
    // Where each pair's query lies in q.
    var q_at: array<u32, PAIRS>;
    for (var qi = 0u; qi < QUERIES; qi++) {
        let row = min(row0 + qi, p.t - 1u);
        pos[qi] = p.start + row;
        first[qi] = first_seen(pos[qi], p.window);
        first_block[qi] = first[qi] / WG;
        for (var h = 0u; h < GROUP; h++) {
            q_at[qi * GROUP + h] = ((p.row0 + row) * p.n_head + head0 + h) * p.dk;
        }
    }
    for (var n = 0u; n < PAIRS; n++) {
        for (var v = lid; v < (p.dk + 3u) / 4u; v += WG) {
            var x = vec4<f32>(0.0);
            for (var k = 0u; k < 4u; k++) {
                if (4u * v + k < p.dk) {
                    x[k] = q[q_at[n] + 4u * v + k];
                }
            }
            staged_queries[n * (Q_WIDTH / 4u) + v] = x;
        }
    }
    workgroupBarrier();
    // This workgroup's blocks: from the first query's first (its blocks
    // start no later than the others') to the last query's last, or a share
    // of the one query's where they are shared out (in a window, the
    // queries' blocks together may be more than any one query's).
    let lo_block = first_block[0] + g.z * p.blocks_per_group;
    var hi_block = pos[QUERIES - 1u] / WG + 1u;
    if (p.splits > 1u) {
        hi_block = min(lo_block + p.blocks_per_group, hi_block);
    }

    var m: array<f32, PAIRS>;
    var l: array<f32, PAIRS>;
    var acc: array<array<f32, PER_THREAD>, PAIRS>;
    for (var n = 0u; n < PAIRS; n++) {
        m[n] = -3.4e38;
    }
    for (var b = lo_block; b < hi_block; b++) {
        let c0 = b * WG;
        // Each query's positions of the block, c0 + lo..c0 + hi, and
        // whether it sees the block at all; whether every query that sees
        // it sees all of it.
        var lo: array<u32, QUERIES>;
        var hi: array<u32, QUERIES>;
        var sees: array<bool, QUERIES>;
        var whole = true;
        var any_sees_lid = false;
        for (var qi = 0u; qi < QUERIES; qi++) {
            sees[qi] = b >= first_block[qi] && b <= pos[qi] / WG;
            lo[qi] = select(0u, max(c0, first[qi]) - c0, sees[qi]);
            hi[qi] = select(0u, min(c0 + WG, pos[qi] + 1u) - c0, sees[qi]);
            whole = whole && (!sees[qi] || (lo[qi] == 0u && hi[qi] == WG));
            any_sees_lid = any_sees_lid || (lid >= lo[qi] && lid < hi[qi]);
        }
        var s: array<f32, PAIRS>;
        for (var n = 0u; n < PAIRS; n++) {
            s[n] = -3.4e38;
        }
        // Every thread stages each chunk of the block's keys; those whose
        // position some query sees score it.
        var dots: array<f32, PAIRS>;
        let rows = staged_rows(lid, c0, kvh);
        for (var ch = 0u; ch < p.dk; ch += KEY_CHUNK) {
            if (ch > 0u) {
                workgroupBarrier();
            }
            stage_keys(lid, rows, ch);
            workgroupBarrier();
            if (any_sees_lid) {
                chunk_dots(lid, ch, &dots);
            }
        }
        if (any_sees_lid) {
            for (var n = 0u; n < PAIRS; n++) {
                let qi = n / GROUP;
                if (lid >= lo[qi] && lid < hi[qi]) {
                    s[n] = dots[n] * p.scale;
                }
            }
        }
        // Each pair's block maximum (`block_max.wgsl` or its subgroups'
        // form), then each position's probability by its own thread, once
        // for the workgroup rather than once a thread.
        let block_m = block_maxes(invocation, s);
        for (var n = 0u; n < PAIRS; n++) {
            probs[n * WG + lid] = exp(s[n] - block_m[n]);
        }
        workgroupBarrier();
        var block_l: array<f32, PAIRS>;
        var block_acc: array<array<f32, PER_THREAD>, PAIRS>;
        if (whole) {
            // Every query that sees the block sees all of it: the value rows
            // read once for them all.
            weigh(lid, c0, kvh, v_stride, 0u, WG, 0u, PAIRS, &block_l, &block_acc);
        } else {
            for (var qi = 0u; qi < QUERIES; qi++) {
                if (sees[qi]) {
                    weigh(lid, c0, kvh, v_stride, lo[qi], hi[qi], qi * GROUP, qi * GROUP + GROUP, &block_l, &block_acc);
                }
            }
        }
        for (var n = 0u; n < PAIRS; n++) {
            let qi = n / GROUP;
            if (!sees[qi]) {
                continue;
            }
            if (p.splits == 1u) {
                let f = fold(m[n], block_m[n]);
                l[n] = l[n] * f.kept + block_l[n] * f.added;
                for (var k = 0u; k < PER_THREAD; k++) {
                    acc[n][k] = acc[n][k] * f.kept + block_acc[n][k] * f.added;
                }
                m[n] = f.top;
            } else {
                let head = head0 + n % GROUP;
                let at = (((row0 + qi) * p.n_head + head) * p.most_blocks + b - first_block[qi]) * (p.dv + 2u);
                if (lid == 0u) {
                    parts[at] = block_m[n];
                    parts[at + 1u] = block_l[n];
                }
                for (var k = 0u; k < PER_THREAD; k++) {
                    let d = lid + k * WG;
                    if (d < p.dv) {
                        parts[at + 2u + d] = block_acc[n][k];
                    }
                }
            }
        }
        workgroupBarrier();
    }
    if (p.splits == 1u) {
        let width = p.n_head * p.dv;
        for (var n = 0u; n < PAIRS; n++) {
            let row = row0 + n / GROUP;
            if (row >= p.t) {
                continue;
            }
            for (var k = 0u; k < PER_THREAD; k++) {
                let d = lid + k * WG;
                if (d < p.dv) {
                    out[(p.row0 + row) * width + laid_out_at((head0 + n % GROUP) * p.dv + d, width, p.block)] = acc[n][k] / l[n];
                }
            }
        }
    }
}

// Pairs pair_lo..pair_hi's probabilities of the block's positions
// c0 + lo..c0 + hi weighing their value rows, into their block sums:
// four positions a step, their rows read before they are summed, so that
// a thread has four reads in flight rather than one; each value element
// read once for the pairs.
fn weigh(
    lid: u32,
    c0: u32,
    kvh: u32,
    v_stride: u32,
    lo: u32,
    hi: u32,
    pair_lo: u32,
    pair_hi: u32,
    block_l: ptr<function, array<f32, PAIRS>>,
    block_acc: ptr<function, array<array<f32, PER_THREAD>, PAIRS>>,
) {
    var i = lo;
    for (; i + 4u <= hi; i += 4u) {
        var ps: array<vec4<f32>, PAIRS>;
        for (var n = pair_lo; n < pair_hi; n++) {
            let at = n * WG + i;
            ps[n] = vec4<f32>(probs[at], probs[at + 1u], probs[at + 2u], probs[at + 3u]);
            (*block_l)[n] += ps[n].x + ps[n].y + ps[n].z + ps[n].w;
        }
        let v0 = ((c0 + i) % p.ring) * v_stride + kvh * p.dv;
        let v1 = ((c0 + i + 1u) % p.ring) * v_stride + kvh * p.dv;
        let v2 = ((c0 + i + 2u) % p.ring) * v_stride + kvh * p.dv;
        let v3 = ((c0 + i + 3u) % p.ring) * v_stride + kvh * p.dv;
        for (var k = 0u; k < PER_THREAD; k++) {
            let d = lid + k * WG;
            if (d < p.dv) {
                let a = value_at(v0 + d);
                let b = value_at(v1 + d);
                let c = value_at(v2 + d);
                let e = value_at(v3 + d);
                for (var n = pair_lo; n < pair_hi; n++) {
                    (*block_acc)[n][k] += ps[n].x * a + ps[n].y * b + ps[n].z * c + ps[n].w * e;
                }
            }
        }
    }
    for (; i < hi; i++) {
        let v0 = ((c0 + i) % p.ring) * v_stride + kvh * p.dv;
        for (var n = pair_lo; n < pair_hi; n++) {
            (*block_l)[n] += probs[n * WG + i];
        }
        for (var k = 0u; k < PER_THREAD; k++) {
            let d = lid + k * WG;
            if (d < p.dv) {
                let a = value_at(v0 + d);
                for (var n = pair_lo; n < pair_hi; n++) {
                    (*block_acc)[n][k] += probs[n * WG + i] * a;
                }
            }
        }
    }
}
