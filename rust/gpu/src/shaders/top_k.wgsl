// The k largest values of each row of `n` (ties to the lower index), most
// likely first, as (index, value bits) pairs: what a draw that is decided
// by its top k logits reads back in place of the whole row.
//
// One workgroup a row, k rounds: in each, every thread finds the largest
// value of its strided share that comes after the last one chosen (in the
// order value down, index up), and the workgroup keeps the best of them.
// A row's vocabulary is read k times, from a cache that holds it.

struct Params {
    n: u32,
    k: u32,
    rows: u32,
    _pad: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
var<immediate> p: Params;

const WG: u32 = 64u;
const NONE: u32 = 0xffffffffu;
var<workgroup> best_v: array<f32, WG>;
var<workgroup> best_i: array<u32, WG>;

// Whether (v, i) comes before (w, j): larger first, then the lower index.
fn before(v: f32, i: u32, w: f32, j: u32) -> bool {
    return v > w || (v == w && i < j);
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) g: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = g.x;
    if (row >= p.rows) {
        return;
    }
    let base = row * p.n;
    let lowest = bitcast<f32>(0xff800000u);
    var last_v = bitcast<f32>(0x7f800000u);
    var last_i = NONE;
    for (var r = 0u; r < p.k; r++) {
        var bv = lowest;
        var bi = NONE;
        for (var i = lid; i < p.n; i += WG) {
            let v = x[base + i];
            let after = r == 0u || before(last_v, last_i, v, i);
            if (after && before(v, i, bv, bi)) {
                bv = v;
                bi = i;
            }
        }
        best_v[lid] = bv;
        best_i[lid] = bi;
        workgroupBarrier();
        for (var half = WG / 2u; half > 0u; half >>= 1u) {
            if (lid < half && before(best_v[lid + half], best_i[lid + half], best_v[lid], best_i[lid])) {
                best_v[lid] = best_v[lid + half];
                best_i[lid] = best_i[lid + half];
            }
            workgroupBarrier();
        }
        last_v = best_v[0];
        last_i = best_i[0];
        if (lid == 0u) {
            out[(row * p.k + r) * 2u] = last_i;
            out[(row * p.k + r) * 2u + 1u] = bitcast<u32>(last_v);
        }
        workgroupBarrier();
    }
}
