// x[r] += b[r]; out[r, i] = x[r, i] / sqrt(mean_i(x[r, i]^2) + eps) *
// weight[i]: a residual add and the norm that reads its sum, one workgroup
// a row (rows past the dispatch limit along y). The same arithmetic as the
// add and then `rms_norm.wgsl`, one kernel fewer.

struct Params {
    width: u32,
    rows: u32,
    eps: f32,
    groups_x: u32,
}

@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read> weight: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
var<immediate> p: Params;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) g: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = g.x + g.y * p.groups_x;
    if (row >= p.rows) {
        return;
    }
    let start = row * p.width;
    var acc = 0.0;
    // Each thread reads back only the sums it wrote.
    for (var i = lid; i < p.width; i += WG) {
        let v = x[start + i] + b[start + i];
        x[start + i] = v;
        acc += v * v;
    }
    let sum = workgroup_sum(lid, acc);
    let scale = inverseSqrt(sum / f32(p.width) + p.eps);
    for (var i = lid; i < p.width; i += WG) {
        out[start + i] = x[start + i] * scale * weight[i];
    }
}
