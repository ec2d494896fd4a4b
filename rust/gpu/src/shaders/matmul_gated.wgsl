// out[c, r] = activation(gate[r] · x[c], up[r] · x[c]): a gated
// feed-forward's two products and its activation in one kernel, the gate's
// and the up projection's rows held as one matrix (the gate's first). A
// workgroup's first PAIRS groups of rows are gate rows, its last PAIRS the
// same rows of up; each row's sums are taken as the form appended takes
// them and the activation is `activations.wgsl`'s, so the outputs are
// those of the two products and `elementwise.wgsl` one after the other,
// bit for bit. The format's block, the shared readers, the activations and
// `activation` (which of them) are appended.

const PAIRS: u32 = ROWS / 2u;

// The up rows' sums, handed to the threads of their gate rows (a pair of
// row groups and a column group each).
var<workgroup> up_totals: array<array<Rf, COLS>, PAIRS * COL_GROUPS>;

struct Params {
    // Output rows: the gate's (and up's).
    rows: u32,
    cols: u32,
    n: u32,
    row_bytes: u32,
    // Workgroups along x: rows past the dispatch limit go to y.
    groups_x: u32,
    x_stride: u32,
    // The block of the layout `out` is written in for the product that
    // reads it (`block_inputs.wgsl`'s; 1: rows as they are).
    block: u32,
    _pad0: u32,
}

@group(0) @binding(0) var<storage, read> w: array<u32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
var<immediate> p: Params;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) g: vec3<u32>, invocation: Invocation) {
    let lid = index_of(invocation);
    let slot = row_group_of(lid);
    let up = slot / PAIRS;
    let first = ((g.x + g.y * p.groups_x) * PAIRS + slot % PAIRS) * R;
    let starts = row_starts(first, p.rows, p.row_bytes) + up * p.rows * p.row_bytes;
    var totals: array<Rf, COLS>;
    let n_cols = row_sums(g.z, lid, starts, first < p.rows, &totals);
    let pair = (slot % PAIRS) * COL_GROUPS + col_group_of(lid);
    if (writes_sums(lid) && up == 1u) {
        up_totals[pair] = totals;
    }
    workgroupBarrier();
    if (writes_sums(lid) && up == 0u && first < p.rows) {
        for (var c = 0u; c < n_cols; c++) {
            let gates = totals[c];
            let values = up_totals[pair][c];
            for (var k = 0u; k < min(R, p.rows - first); k++) {
                let row = first + k;
                let at = ((g.z * COL_GROUPS + col_group_of(lid)) * COLS + c) * p.rows + laid_out_at(row, p.rows, p.block);
                out[at] = activation(row_value(gates, k), row_value(values, k));
            }
        }
    }
}
