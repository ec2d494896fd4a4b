// Writes rows `first_row..first_row + rows` of keys and values (f32,
// `width_k` and `width_v` wide) into a layer's cache, the row of position p
// at p % ring (a sliding-window layer keeps a ring; a full one holds every
// position), in the cache's format (`kv_write_*.wgsl`: a thread a unit of
// it), keys first.

struct Params {
    rows: u32,
    width_k: u32,
    width_v: u32,
    start: u32,
    ring: u32,
    threads_x: u32,
    first_row: u32,
    _pad0: u32,
}

@group(0) @binding(0) var<storage, read> k: array<f32>;
@group(0) @binding(1) var<storage, read> v: array<f32>;
@group(0) @binding(2) var<storage, read_write> cache_k: array<u32>;
@group(0) @binding(3) var<storage, read_write> cache_v: array<u32>;
var<immediate> p: Params;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    var i = id.x + id.y * p.threads_x;
    let key_units = p.width_k / KV_UNIT;
    let value_units = p.width_v / KV_UNIT;
    var x: array<f32, KV_UNIT>;
    if (i < p.rows * key_units) {
        let row = i / key_units;
        let u = i % key_units;
        let at = (p.first_row + row) * p.width_k + u * KV_UNIT;
        for (var e = 0u; e < KV_UNIT; e++) {
            x[e] = k[at + e];
        }
        store_key_unit(p.ring, p.width_k, (p.start + row) % p.ring, u, x);
        return;
    }
    i -= p.rows * key_units;
    if (i < p.rows * value_units) {
        let row = i / value_units;
        let u = i % value_units;
        let at = (p.first_row + row) * p.width_v + u * KV_UNIT;
        for (var e = 0u; e < KV_UNIT; e++) {
            x[e] = v[at + e];
        }
        store_value_unit(p.ring, p.width_v, (p.start + row) % p.ring, u, x);
    }
}
