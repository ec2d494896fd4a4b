// Causal attention of `t` queries at positions start.. over a cache of
// keys and values (rows at position % ring, f16 or Q8_0: `kv_read_*.wgsl`
// reads them), each query head reading its group's key-value head, with an
// optional sliding window: a query at p sees
// positions p + 1 - window ..= p. One workgroup a (query, head, span): its
// threads score 64 positions at a time, and the running maximum and sum
// fold each block of scores into the output (flash attention's online
// softmax). A query's positions may be cut into `splits` spans of `span`
// positions, one workgroup each (flash-decoding: a decoded token's few
// heads alone would leave most of a card idle); then each span writes its
// maximum, sum and unnormalised output to `parts`, and
// `attention_merge.wgsl` folds them.

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
    // Positions a span holds, and spans a query's positions are cut into
    // (1: the workgroup writes `out` itself).
    span: u32,
    splits: u32,
    // The block of the layout `out` is written in for the product that
    // reads it (`block_inputs.wgsl`'s; 1: rows as they are).
    block: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<storage, read> q: array<f32>;
// The layer's cache, in its format (`kv_read_*.wgsl` reads it).
@group(0) @binding(1) var<storage, read> cache_k: array<u32>;
@group(0) @binding(2) var<storage, read> cache_v: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
// Per (row, head, span): its maximum, its sum, then dv unnormalised outputs.
@group(0) @binding(4) var<storage, read_write> parts: array<f32>;
var<immediate> p: Params;

const WG: u32 = 64u;
// Value widths up to WG * MAX_PER_THREAD (512: Gemma's global heads).
const MAX_PER_THREAD: u32 = 8u;
// A block's scores, folded to their maximum (`block_max`), then its probabilities.
var<workgroup> maxes: array<f32, WG>;
var<workgroup> probs: array<f32, WG>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) g: vec3<u32>, invocation: Invocation) {
    let lid = index_of(invocation);
    let head = g.x;
    let row = g.y;
    let split = g.z;
    let pos = p.start + row;
    var first = 0u;
    if (p.window > 0u && pos + 1u > p.window) {
        first = pos + 1u - p.window;
    }
    // This span's positions, lo..hi (none where the query sees fewer).
    let lo = first + split * p.span;
    let hi = min(lo + p.span, pos + 1u);
    let kvh = head / (p.n_head / p.n_head_kv);
    let q0 = ((p.row0 + row) * p.n_head + head) * p.dk;
    let k_stride = p.n_head_kv * p.dk;
    let v_stride = p.n_head_kv * p.dv;

    var m = -3.4e38;
    var l = 0.0;
    var acc: array<f32, MAX_PER_THREAD>;
    for (var c0 = lo; c0 < hi; c0 += WG) {
        let j = c0 + lid;
        var s = -3.4e38;
        if (j < hi) {
            s = key_dot(q0, (j % p.ring) * k_stride + kvh * p.dk, p.dk) * p.scale;
        }
        // The block's maximum (`block_max.wgsl` or its subgroups' form),
        // then each position's probability by its own thread, once for the
        // workgroup rather than once a thread.
        let n = min(WG, hi - c0);
        let cm = max(m, block_max(invocation, s));
        probs[lid] = exp(s - cm);
        workgroupBarrier();
        let corr = exp(m - cm);
        l *= corr;
        for (var k = 0u; k < MAX_PER_THREAD; k++) {
            acc[k] *= corr;
        }
        // Four positions a step, their rows read before they are summed, so
        // that a thread has four reads in flight rather than one.
        var i = 0u;
        for (; i + 4u <= n; i += 4u) {
            let p0 = probs[i];
            let p1 = probs[i + 1u];
            let p2 = probs[i + 2u];
            let p3 = probs[i + 3u];
            l += p0 + p1 + p2 + p3;
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
                    acc[k] += p0 * a + p1 * b + p2 * c + p3 * e;
                }
            }
        }
        for (; i < n; i++) {
            let pj = probs[i];
            l += pj;
            let v0 = ((c0 + i) % p.ring) * v_stride + kvh * p.dv;
            for (var k = 0u; k < MAX_PER_THREAD; k++) {
                let d = lid + k * WG;
                if (d < p.dv) {
                    acc[k] += pj * value_at(v0 + d);
                }
            }
        }
        m = cm;
        workgroupBarrier();
    }
    if (p.splits == 1u) {
        for (var k = 0u; k < MAX_PER_THREAD; k++) {
            let d = lid + k * WG;
            if (d < p.dv) {
                out[(p.row0 + row) * p.n_head * p.dv + laid_out_at(head * p.dv + d, p.n_head * p.dv, p.block)] = acc[k] / l;
            }
        }
        return;
    }
    let at = ((row * p.n_head + head) * p.splits + split) * (p.dv + 2u);
    if (lid == 0u) {
        parts[at] = m;
        parts[at + 1u] = l;
    }
    for (var k = 0u; k < MAX_PER_THREAD; k++) {
        let d = lid + k * WG;
        if (d < p.dv) {
            parts[at + 2u + d] = acc[k];
        }
    }
}
