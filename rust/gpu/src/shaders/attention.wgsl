// Causal attention of `t` queries at positions start.. over a cache of
// keys and values (rows at position % ring, f16 or Q8_0: `kv_read_*.wgsl`
// reads them), each query head reading its group's key-value head, with an
// optional sliding window: a query at p sees positions p + 1 - window ..= p.
// One workgroup a (query, head, share of its blocks): its threads score a
// block of 64 positions at a time, softmax them from the block's maximum,
// and weigh the value rows by them; the blocks fold into the query's output
// as `attention_blocks.wgsl` says. A query's blocks may be shared out over
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
// A block's scores, folded to their maximum (`block_max`), then its probabilities.
var<workgroup> maxes: array<f32, WG>;
var<workgroup> probs: array<f32, WG>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) g: vec3<u32>, invocation: Invocation) {
    let lid = index_of(invocation);
    let head = g.x;
    let row = g.y;
    let pos = p.start + row;
    let first = first_seen(pos, p.window);
    let first_block = first / WG;
    // This workgroup's share of the query's blocks (none where it sees fewer).
    let lo_block = g.z * p.blocks_per_group;
    let hi_block = min(lo_block + p.blocks_per_group, blocks_seen(pos, p.window));
    let kvh = head / (p.n_head / p.n_head_kv);
    let q0 = ((p.row0 + row) * p.n_head + head) * p.dk;
    let k_stride = p.n_head_kv * p.dk;
    let v_stride = p.n_head_kv * p.dv;

    var m = -3.4e38;
    var l = 0.0;
    var acc: array<f32, MAX_PER_THREAD>;
    for (var b = lo_block; b < hi_block; b++) {
        let c0 = (first_block + b) * WG;
        // The block's positions the query sees, c0 + lo..c0 + hi.
        let lo = max(c0, first) - c0;
        let hi = min(c0 + WG, pos + 1u) - c0;
        var s = -3.4e38;
        if (lid >= lo && lid < hi) {
            s = key_dot(q0, ((c0 + lid) % p.ring) * k_stride + kvh * p.dk, p.dk) * p.scale;
        }
        // The block's maximum (`block_max.wgsl` or its subgroups' form),
        // then each position's probability by its own thread, once for the
        // workgroup rather than once a thread.
        let block_m = block_max(invocation, s);
        probs[lid] = exp(s - block_m);
        workgroupBarrier();
        var block_l = 0.0;
        var block_acc: array<f32, MAX_PER_THREAD>;
        // Four positions a step, their rows read before they are summed, so
        // that a thread has four reads in flight rather than one.
        var i = lo;
        for (; i + 4u <= hi; i += 4u) {
            let p0 = probs[i];
            let p1 = probs[i + 1u];
            let p2 = probs[i + 2u];
            let p3 = probs[i + 3u];
            block_l += p0 + p1 + p2 + p3;
            let v0 = ((c0 + i) % p.ring) * v_stride + kvh * p.dv;
            let v1 = ((c0 + i + 1u) % p.ring) * v_stride + kvh * p.dv;
            let v2 = ((c0 + i + 2u) % p.ring) * v_stride + kvh * p.dv;
            let v3 = ((c0 + i + 3u) % p.ring) * v_stride + kvh * p.dv;
            for (var k = 0u; k < MAX_PER_THREAD; k++) {
                let d = lid + k * WG;
                if (d < p.dv) {
                    let a = value_at(v0 + d);
                    let b = value_at(v1 + d);
                    let c = value_at(v2 + d);
                    let e = value_at(v3 + d);
                    block_acc[k] += p0 * a + p1 * b + p2 * c + p3 * e;
                }
            }
        }
        for (; i < hi; i++) {
            let pj = probs[i];
            block_l += pj;
            let v0 = ((c0 + i) % p.ring) * v_stride + kvh * p.dv;
            for (var k = 0u; k < MAX_PER_THREAD; k++) {
                let d = lid + k * WG;
                if (d < p.dv) {
                    block_acc[k] += pj * value_at(v0 + d);
                }
            }
        }
        if (p.splits == 1u) {
            let f = fold(m, block_m);
            l = l * f.kept + block_l * f.added;
            for (var k = 0u; k < MAX_PER_THREAD; k++) {
                acc[k] = acc[k] * f.kept + block_acc[k] * f.added;
            }
            m = f.top;
        } else {
            let at = ((row * p.n_head + head) * p.most_blocks + b) * (p.dv + 2u);
            if (lid == 0u) {
                parts[at] = block_m;
                parts[at + 1u] = block_l;
            }
            for (var k = 0u; k < MAX_PER_THREAD; k++) {
                let d = lid + k * WG;
                if (d < p.dv) {
                    parts[at + 2u + d] = block_acc[k];
                }
            }
        }
        workgroupBarrier();
    }
    if (p.splits == 1u) {
        for (var k = 0u; k < MAX_PER_THREAD; k++) {
            let d = lid + k * WG;
            if (d < p.dv) {
                out[(p.row0 + row) * p.n_head * p.dv + laid_out_at(head * p.dv + d, p.n_head * p.dv, p.block)] = acc[k] / l;
            }
        }
    }
}
