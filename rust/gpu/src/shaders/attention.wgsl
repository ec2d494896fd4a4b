// Causal attention of `t` queries at positions start.. over a cache of f16
// keys and values (rows at position % ring), each query head reading its
// group's key-value head, with an optional sliding window: a query at p sees
// positions p + 1 - window ..= p. One workgroup a (query, head); its threads
// score 64 positions at a time, and the running maximum and sum fold each
// block of scores into the output (flash attention's online softmax).

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
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<storage, read> q: array<f32>;
@group(0) @binding(1) var<storage, read> kc: array<u32>;
@group(0) @binding(2) var<storage, read> vc: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
var<immediate> p: Params;

const WG: u32 = 64u;
// Value widths up to WG * MAX_PER_THREAD (512: Gemma's global heads).
const MAX_PER_THREAD: u32 = 8u;
var<workgroup> scores: array<f32, WG>;

// The f16 at index `i` of a cache, widened.
fn half_at(i: u32, from_keys: bool) -> f32 {
    var word: u32;
    if (from_keys) {
        word = kc[i >> 1u];
    } else {
        word = vc[i >> 1u];
    }
    let pair = unpack2x16float(word);
    return select(pair.x, pair.y, (i & 1u) == 1u);
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) g: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let head = g.x;
    let row = g.y;
    let pos = p.start + row;
    var first = 0u;
    if (p.window > 0u && pos + 1u > p.window) {
        first = pos + 1u - p.window;
    }
    let kvh = head / (p.n_head / p.n_head_kv);
    let q0 = ((p.row0 + row) * p.n_head + head) * p.dk;
    let k_stride = p.n_head_kv * p.dk;
    let v_stride = p.n_head_kv * p.dv;

    var m = -3.4e38;
    var l = 0.0;
    var acc: array<f32, MAX_PER_THREAD>;
    for (var c0 = first; c0 <= pos; c0 += WG) {
        let j = c0 + lid;
        var s = -3.4e38;
        if (j <= pos) {
            let k0 = (j % p.ring) * k_stride + kvh * p.dk;
            var dot = 0.0;
            for (var d = 0u; d < p.dk; d++) {
                dot += q[q0 + d] * half_at(k0 + d, true);
            }
            s = dot * p.scale;
        }
        scores[lid] = s;
        workgroupBarrier();
        let n = min(WG, pos + 1u - c0);
        var cm = m;
        for (var i = 0u; i < n; i++) {
            cm = max(cm, scores[i]);
        }
        let corr = exp(m - cm);
        l *= corr;
        for (var k = 0u; k < MAX_PER_THREAD; k++) {
            acc[k] *= corr;
        }
        for (var i = 0u; i < n; i++) {
            let pj = exp(scores[i] - cm);
            l += pj;
            let v0 = ((c0 + i) % p.ring) * v_stride + kvh * p.dv;
            for (var k = 0u; k < MAX_PER_THREAD; k++) {
                let d = lid + k * WG;
                if (d < p.dv) {
                    acc[k] += pj * half_at(v0 + d, false);
                }
            }
        }
        m = cm;
        workgroupBarrier();
    }
    let o0 = ((p.row0 + row) * p.n_head + head) * p.dv;
    for (var k = 0u; k < MAX_PER_THREAD; k++) {
        let d = lid + k * WG;
        if (d < p.dv) {
            out[o0 + d] = acc[k] / l;
        }
    }
}
