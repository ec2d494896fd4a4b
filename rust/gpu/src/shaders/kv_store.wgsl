// Writes rows `first_row..first_row + rows` of keys and values (f32,
// `width_k` and `width_v` wide) into a layer's cache, the row of position p
// at p % ring (a sliding-window layer keeps a ring; a full one holds every
// position), in the cache's format (`kv_rows.wgsl`: a thread a unit of it),
// keys first.

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

fn key_at(row: u32, e: u32) -> f32 {
    return k[row * p.width_k + e];
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    let i = id.x + id.y * p.threads_x;
    let keys = p.rows * (p.width_k / KV_UNIT);
    if (i < keys) {
        store_row_unit(true, i, p.width_k);
    } else if (i - keys < p.rows * (p.width_v / KV_UNIT)) {
        store_row_unit(false, i - keys, p.width_v);
    }
}
