// Causal attention of `t` queries at positions start.. over a cache of
// keys and values (rows at position % ring, f16 or Q8_0: `kv_read_*.wgsl`
// reads them), each query head reading its group's key-value head, with an
// optional sliding window: a query at p sees positions p + 1 - window ..= p.
// One workgroup a (query, GROUP heads of one key-value head, share of the
// query's blocks): its threads score a block of 64 positions at a time for
// each of its heads, softmax each head's from its maximum, and weigh the
// value rows by them, each key and value element read once for the GROUP
// heads (GROUP and PER_THREAD, the value elements a thread holds, come from
// `kernels.rs`); each head's arithmetic is one head's alone, so the bits do
// not depend on GROUP. The blocks fold into each head's output as
// `attention_blocks.wgsl` says. A query's blocks may be shared out over
// `splits` workgroups, `blocks_per_group` each (flash-decoding: a decoded
// token's few heads alone would leave most of a card idle); then each
// block's maximum, sum and unnormalised output go to `parts`, and
// `attention_merge.wgsl` folds them, in the order one workgroup would.

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
// A block's scores of each head, folded to their maximum (`block_max`),
// then its probabilities: head h's from h * WG.
var<workgroup> maxes: array<f32, WG * GROUP>;
var<workgroup> probs: array<f32, WG * GROUP>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) g: vec3<u32>, invocation: Invocation) {
    let lid = index_of(invocation);
    let head0 = g.x * GROUP;
    let row = g.y;
    let pos = p.start + row;
    let first = first_seen(pos, p.window);
    let first_block = first / WG;
    // This workgroup's share of the query's blocks (none where it sees fewer).
    let lo_block = g.z * p.blocks_per_group;
    let hi_block = min(lo_block + p.blocks_per_group, blocks_seen(pos, p.window));
    let kvh = head0 / (p.n_head / p.n_head_kv);
    let q0 = ((p.row0 + row) * p.n_head + head0) * p.dk;
    let k_stride = p.n_head_kv * p.dk;
    let v_stride = p.n_head_kv * p.dv;

    var m: array<f32, GROUP>;
    var l: array<f32, GROUP>;
    var acc: array<array<f32, PER_THREAD>, GROUP>;
    for (var h = 0u; h < GROUP; h++) {
        m[h] = -3.4e38;
    }
    for (var b = lo_block; b < hi_block; b++) {
        let c0 = (first_block + b) * WG;
        // The block's positions the query sees, c0 + lo..c0 + hi.
        let lo = max(c0, first) - c0;
        let hi = min(c0 + WG, pos + 1u) - c0;
        var s: array<f32, GROUP>;
        for (var h = 0u; h < GROUP; h++) {
            s[h] = -3.4e38;
        }
        if (lid >= lo && lid < hi) {
            let dots = key_dots(q0, ((c0 + lid) % p.ring) * k_stride + kvh * p.dk, p.dk);
            for (var h = 0u; h < GROUP; h++) {
                s[h] = dots[h] * p.scale;
            }
        }
        // Each head's block maximum (`block_max.wgsl` or its subgroups'
        // form), then each position's probability by its own thread, once
        // for the workgroup rather than once a thread.
        var block_m: array<f32, GROUP>;
        for (var h = 0u; h < GROUP; h++) {
            block_m[h] = block_max(invocation, s[h], h);
            probs[h * WG + lid] = exp(s[h] - block_m[h]);
        }
        workgroupBarrier();
        var block_l: array<f32, GROUP>;
        var block_acc: array<array<f32, PER_THREAD>, GROUP>;
        // Four positions a step, their rows read before they are summed, so
        // that a thread has four reads in flight rather than one.
        var i = lo;
        for (; i + 4u <= hi; i += 4u) {
            var ps: array<vec4<f32>, GROUP>;
            for (var h = 0u; h < GROUP; h++) {
                let at = h * WG + i;
                ps[h] = vec4<f32>(probs[at], probs[at + 1u], probs[at + 2u], probs[at + 3u]);
                block_l[h] += ps[h].x + ps[h].y + ps[h].z + ps[h].w;
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
                    for (var h = 0u; h < GROUP; h++) {
                        block_acc[h][k] += ps[h].x * a + ps[h].y * b + ps[h].z * c + ps[h].w * e;
                    }
                }
            }
        }
        for (; i < hi; i++) {
            let v0 = ((c0 + i) % p.ring) * v_stride + kvh * p.dv;
            for (var h = 0u; h < GROUP; h++) {
                block_l[h] += probs[h * WG + i];
            }
            for (var k = 0u; k < PER_THREAD; k++) {
                let d = lid + k * WG;
                if (d < p.dv) {
                    let a = value_at(v0 + d);
                    for (var h = 0u; h < GROUP; h++) {
                        block_acc[h][k] += probs[h * WG + i] * a;
                    }
                }
            }
        }
        for (var h = 0u; h < GROUP; h++) {
            if (p.splits == 1u) {
                let f = fold(m[h], block_m[h]);
                l[h] = l[h] * f.kept + block_l[h] * f.added;
                for (var k = 0u; k < PER_THREAD; k++) {
                    acc[h][k] = acc[h][k] * f.kept + block_acc[h][k] * f.added;
                }
                m[h] = f.top;
            } else {
                let at = ((row * p.n_head + head0 + h) * p.most_blocks + b) * (p.dv + 2u);
                if (lid == 0u) {
                    parts[at] = block_m[h];
                    parts[at + 1u] = block_l[h];
                }
                for (var k = 0u; k < PER_THREAD; k++) {
                    let d = lid + k * WG;
                    if (d < p.dv) {
                        parts[at + 2u + d] = block_acc[h][k];
                    }
                }
            }
        }
        workgroupBarrier();
    }
    if (p.splits == 1u) {
        let width = p.n_head * p.dv;
        for (var h = 0u; h < GROUP; h++) {
            for (var k = 0u; k < PER_THREAD; k++) {
                let d = lid + k * WG;
                if (d < p.dv) {
                    out[(p.row0 + row) * width + laid_out_at((head0 + h) * p.dv + d, width, p.block)] = acc[h][k] / l[h];
                }
            }
        }
    }
}
