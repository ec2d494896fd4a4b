// The blocks of a shared-out attention (`attention.wgsl`) folded into each
// query's output, one after another in order, as one workgroup walking
// them all folds them (`attention_blocks.wgsl`), so the output is the same
// bits. One workgroup a (query, head).

struct Params {
    n_head: u32,
    dv: u32,
    row0: u32,
    // As `attention.wgsl`'s.
    start: u32,
    window: u32,
    most_blocks: u32,
    block: u32,
    _pad0: u32,
}

@group(0) @binding(0) var<storage, read> parts: array<f32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
var<immediate> p: Params;

const WG: u32 = 64u;
// Value widths up to WG * MAX_PER_THREAD (512: Gemma's global heads).
const MAX_PER_THREAD: u32 = 8u;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) g: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let head = g.x;
    let row = g.y;
    let base = (row * p.n_head + head) * p.most_blocks;
    let width = p.dv + 2u;
    var m = -3.4e38;
    var l = 0.0;
    var acc: array<f32, MAX_PER_THREAD>;
    for (var b = 0u; b < blocks_seen(p.start + row, p.window); b++) {
        let at = (base + b) * width;
        let f = fold(m, parts[at]);
        l = l * f.kept + parts[at + 1u] * f.added;
        for (var k = 0u; k < MAX_PER_THREAD; k++) {
            let d = lid + k * WG;
            if (d < p.dv) {
                acc[k] = acc[k] * f.kept + parts[at + 2u + d] * f.added;
            }
        }
        m = f.top;
    }
    for (var k = 0u; k < MAX_PER_THREAD; k++) {
        let d = lid + k * WG;
        if (d < p.dv) {
            out[(p.row0 + row) * p.n_head * p.dv + laid_out_at(head * p.dv + d, p.n_head * p.dv, p.block)] = acc[k] / l;
        }
    }
}
