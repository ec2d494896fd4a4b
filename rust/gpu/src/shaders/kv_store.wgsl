// Writes rows `first_row..first_row + rows` of keys or values (f32, `width` wide) into a cache of
// f16 rows, the row of position p at p % ring (a sliding-window layer keeps
// a ring; a full one holds every position). One thread a pair of values.

struct Params {
    rows: u32,
    width: u32,
    start: u32,
    ring: u32,
    threads_x: u32,
    first_row: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<storage, read> src: array<f32>;
@group(0) @binding(1) var<storage, read_write> cache: array<u32>;
var<immediate> p: Params;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    let i = id.x + id.y * p.threads_x;
    let pairs = p.width / 2u;
    if (i >= p.rows * pairs) {
        return;
    }
    let row = i / pairs;
    let pair = i % pairs;
    let at = (p.first_row + row) * p.width + 2u * pair;
    let dst = ((p.start + row) % p.ring) * pairs + pair;
    cache[dst] = pack2x16float(vec2<f32>(src[at], src[at + 1u]));
}
