// y0, y1, y2 = w0 · x, w1 · x, w2 · x: three products over the same inputs
// (an attention layer's queries, keys and values) in one kernel, the three
// matrices' rows held as one (w0's first). Each row's sums are taken as
// the form appended takes them, so the outputs are those of three products
// apart, bit for bit; each goes to its own output, rows of its own width.
// The format's block and the shared readers are appended.

struct Params {
    // Rows of the three together.
    rows: u32,
    cols: u32,
    n: u32,
    row_bytes: u32,
    // Workgroups along x: rows past the dispatch limit go to y.
    groups_x: u32,
    x_stride: u32,
    // Rows of w0 and of w1 (w2 has the rest).
    rows0: u32,
    rows1: u32,
}

@group(0) @binding(0) var<storage, read> w: array<u32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y0: array<f32>;
@group(0) @binding(3) var<storage, read_write> y1: array<f32>;
@group(0) @binding(4) var<storage, read_write> y2: array<f32>;
var<immediate> p: Params;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) g: vec3<u32>, invocation: Invocation) {
    let lid = index_of(invocation);
    let first = ((g.x + g.y * p.groups_x) * ROWS + row_group_of(lid)) * R;
    var totals: array<Rf, COLS>;
    let n_cols = row_sums(g.z, lid, row_starts(first, p.rows, p.row_bytes), first < p.rows, &totals);
    if (writes_sums(lid) && first < p.rows) {
        let r1 = p.rows0;
        let r2 = p.rows0 + p.rows1;
        for (var c = 0u; c < n_cols; c++) {
            let col = (g.z * COL_GROUPS + col_group_of(lid)) * COLS + c;
            let sums = totals[c];
            for (var k = 0u; k < min(R, p.rows - first); k++) {
                let row = first + k;
                let sum = row_value(sums, k);
                if (row < r1) {
                    y0[col * p.rows0 + row] = sum;
                } else if (row < r2) {
                    y1[col * p.rows1 + row - r1] = sum;
                } else {
                    y2[col * (p.rows - r2) + row - r2] = sum;
                }
            }
        }
    }
}
