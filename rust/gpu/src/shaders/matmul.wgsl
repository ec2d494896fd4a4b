// y[c, r] = Σ_k dequant(w)[r, k] · x[c, k] for every row r of a weight
// matrix kept in its file format, and every column c of the input: each
// row's sums as the form appended takes them (`matmul_rows.wgsl` or
// `matmul_tiles.wgsl`), with the format's block and the shared readers.

struct Params {
    rows: u32,
    cols: u32,
    n: u32,
    row_bytes: u32,
    // Workgroups along x: rows past the dispatch limit go to y.
    groups_x: u32,
    x_stride: u32,
    y_stride: u32,
    // The first row of this run of the matrix, in y's rows.
    y_first: u32,
}

@group(0) @binding(0) var<storage, read> w: array<u32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
var<immediate> p: Params;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) g: vec3<u32>, invocation: Invocation) {
    let lid = index_of(invocation);
    let first = ((g.x + g.y * p.groups_x) * ROWS + row_group_of(lid)) * R;
    var totals: array<Rf, COLS>;
    let n_cols = row_sums(g.z, lid, row_starts(first, p.rows, p.row_bytes), first < p.rows, &totals);
    let col0 = (g.z * COL_GROUPS + col_group_of(lid)) * COLS;
    if (writes_sums(lid) && first < p.rows) {
        for (var c = 0u; c < n_cols; c++) {
            for (var k = 0u; k < min(R, p.rows - first); k++) {
                y[(col0 + c) * p.y_stride + p.y_first + first + k] = row_value(totals[c], k);
            }
        }
    }
}
