// The spans of a split attention (`attention.wgsl`) folded into each
// query's output: out = Σ_s acc_s e^(m_s - M) / Σ_s l_s e^(m_s - M), M the
// largest of the spans' maxima. A span that saw no position has l = 0 and
// the least maximum, so it adds nothing. One workgroup a (query, head).

struct Params {
    n_head: u32,
    dv: u32,
    row0: u32,
    splits: u32,
    // As `attention.wgsl`'s.
    block: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<storage, read> parts: array<f32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
var<immediate> p: Params;

const WG: u32 = 64u;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) g: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let head = g.x;
    let row = g.y;
    let base = (row * p.n_head + head) * p.splits;
    let width = p.dv + 2u;
    var big = -3.4e38;
    for (var s = 0u; s < p.splits; s++) {
        big = max(big, parts[(base + s) * width]);
    }
    var sum = 0.0;
    for (var s = 0u; s < p.splits; s++) {
        let at = (base + s) * width;
        sum += parts[at + 1u] * exp(parts[at] - big);
    }
    for (var d = lid; d < p.dv; d += WG) {
        var v = 0.0;
        for (var s = 0u; s < p.splits; s++) {
            let at = (base + s) * width;
            v += parts[at + 2u + d] * exp(parts[at] - big);
        }
        out[(p.row0 + row) * p.n_head * p.dv + laid_out_at(head * p.dv + d, p.n_head * p.dv, p.block)] = v / sum;
    }
}
