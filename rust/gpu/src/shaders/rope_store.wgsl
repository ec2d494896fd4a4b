// One sequence's rows of a pass made ready for attention in one kernel:
// its queries rotated in place, as `rope.wgsl` rotates them, and its keys
// (rotated) and values stored in the layer's cache, the row of position p
// at p % ring, as `kv_store.wgsl` stores them after `rope.wgsl`: the same
// roundings, three or four kernels fewer. Rows `first_row..first_row +
// rows` of the pass are positions `start..`; the angles are the pass's
// rows'. One thread a rotated pair of the queries first, then a unit of
// the cache's format (`kv_rows.wgsl`) of keys, then of values.

struct Params {
    rows: u32,
    first_row: u32,
    start: u32,
    ring: u32,
    n_head: u32,
    n_head_kv: u32,
    head_dim: u32,
    half: u32,
    // 0: adjacent pairs; 1: halves.
    halves: u32,
    width_v: u32,
    threads_x: u32,
    _pad0: u32,
}

@group(0) @binding(0) var<storage, read_write> q: array<f32>;
@group(0) @binding(1) var<storage, read> k: array<f32>;
@group(0) @binding(2) var<storage, read> v: array<f32>;
@group(0) @binding(3) var<storage, read> cos_t: array<f32>;
@group(0) @binding(4) var<storage, read> sin_t: array<f32>;
@group(0) @binding(5) var<storage, read_write> cache_k: array<u32>;
@group(0) @binding(6) var<storage, read_write> cache_v: array<u32>;
var<immediate> p: Params;

// The elements of rotation pair `pair` of the head at `base`.
fn pair_at(base: u32, pair: u32) -> vec2<u32> {
    if (p.halves == 1u) {
        return vec2<u32>(base + pair, base + pair + p.half);
    }
    return vec2<u32>(base + 2u * pair, base + 2u * pair + 1u);
}

// Element g of the keys of pass row `row` (g counted over the row's heads),
// rotated: what `kv_rows.wgsl` stores.
fn key_at(row: u32, g: u32) -> f32 {
    let e = g % p.head_dim;
    let base = row * p.n_head_kv * p.head_dim + g - e;
    if (e >= 2u * p.half) {
        return k[base + e];
    }
    var pair = e / 2u;
    var second = e % 2u;
    if (p.halves == 1u) {
        pair = e % p.half;
        second = e / p.half;
    }
    let at = pair_at(base, pair);
    let r = rotate(k[at.x], k[at.y], cos_t[row * p.half + pair], sin_t[row * p.half + pair]);
    return select(r.x, r.y, second == 1u);
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    var i = id.x + id.y * p.threads_x;
    let query_pairs = p.rows * p.n_head * p.half;
    let width_k = p.n_head_kv * p.head_dim;
    if (i < query_pairs) {
        let pair = i % p.half;
        let head = (i / p.half) % p.n_head;
        let row = p.first_row + i / (p.half * p.n_head);
        let at = pair_at((row * p.n_head + head) * p.head_dim, pair);
        let r = rotate(q[at.x], q[at.y], cos_t[row * p.half + pair], sin_t[row * p.half + pair]);
        q[at.x] = r.x;
        q[at.y] = r.y;
        return;
    }
    i -= query_pairs;
    let keys = p.rows * (width_k / KV_UNIT);
    if (i < keys) {
        store_row_unit(true, i, width_k);
    } else if (i - keys < p.rows * (p.width_v / KV_UNIT)) {
        store_row_unit(false, i - keys, p.width_v);
    }
}
