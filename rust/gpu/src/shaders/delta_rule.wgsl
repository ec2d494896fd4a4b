// The gated delta rule for one sequence's `n` rows from `row0`, token after
// token, over each value head's state M (head_dim x head_dim; row j per
// value element, column i per key element):
//
//   M = exp(gate) M;  w = beta (v - M k);  M = M + w kᵀ;  o = M q / sqrt(head_dim)
//
// Value head h reads query and key head h % n_k_heads. Row j of M changes
// with v[j] alone, so one thread holds one row through every token (the
// CPU's `step_head`, row by row). The queries, keys and values are rows of
// the convolution's output (`qkv_stride` apart: every query head, every
// key head at `key_dim`, the values at twice it); the outputs rows of
// `n_v_heads * head_dim`.

struct Params {
    n: u32,
    row0: u32,
    head_dim: u32,
    n_v_heads: u32,
    n_k_heads: u32,
    qkv_stride: u32,
    key_dim: u32,
    // Where this layer's rule state starts in the sequence's states.
    state_at: u32,
}

@group(0) @binding(0) var<storage, read> qkv: array<f32>;
@group(0) @binding(1) var<storage, read> gate: array<f32>;
@group(0) @binding(2) var<storage, read> beta: array<f32>;
@group(0) @binding(3) var<storage, read_write> state: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
var<immediate> p: Params;

const MAX_HEAD_DIM: u32 = 256u;

// A dot in sixteen running sums, summed in order, then the tail's: as the
// CPU's `dot` takes it, so both round alike.
fn dot_into(row: ptr<function, array<f32, MAX_HEAD_DIM>>, at: u32) -> f32 {
    var lanes: array<f32, 16>;
    let d = p.head_dim;
    let whole = d / 16u * 16u;
    for (var i = 0u; i < whole; i += 16u) {
        for (var l = 0u; l < 16u; l++) {
            lanes[l] += (*row)[i + l] * qkv[at + i + l];
        }
    }
    var tail = 0.0;
    for (var i = whole; i < d; i++) {
        tail += (*row)[i] * qkv[at + i];
    }
    var sum = 0.0;
    for (var l = 0u; l < 16u; l++) {
        sum += lanes[l];
    }
    return sum + tail;
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>, @builtin(workgroup_id) g: vec3<u32>) {
    let h = g.y;
    let j = id.x;
    let d = p.head_dim;
    if (j >= d || h >= p.n_v_heads) {
        return;
    }
    let kh = h % p.n_k_heads;
    let m_at = p.state_at + (h * d + j) * d;
    var row: array<f32, MAX_HEAD_DIM>;
    for (var i = 0u; i < d; i++) {
        row[i] = state[m_at + i];
    }
    let scale = 1.0 / sqrt(f32(d));
    let width = p.n_v_heads * d;
    for (var r = 0u; r < p.n; r++) {
        let t = p.row0 + r;
        let base = t * p.qkv_stride;
        let q_at = base + kh * d;
        let k_at = base + p.key_dim + kh * d;
        let decay = exp(gate[t * p.n_v_heads + h]);
        for (var i = 0u; i < d; i++) {
            row[i] *= decay;
        }
        let w = (qkv[base + 2u * p.key_dim + h * d + j] - dot_into(&row, k_at)) * beta[t * p.n_v_heads + h];
        for (var i = 0u; i < d; i++) {
            row[i] += qkv[k_at + i] * w;
        }
        out[t * width + h * d + j] = dot_into(&row, q_at) * scale;
    }
    for (var i = 0u; i < d; i++) {
        state[m_at + i] = row[i];
    }
}
