// The row-parallel form of the products (`matmul.wgsl`,
// `matmul_gated.wgsl`, `matmul_split.wgsl`), for a decoded token and a few
// inputs: a workgroup takes ROWS groups of R rows (four, each input read
// once for the four, or one: `Shareout` in `kernels.rs` chooses) and up to
// COLS columns (8 for several inputs, 1 for a decoded token), STRANDS threads
// a group, thread j of a group being strand j of `matmul_common.wgsl`'s order:
// it takes its rows' pieces j, j + STRANDS, ..., each dequantized once for all
// its columns, so neighbouring threads read neighbouring bytes (one thread
// walking a whole row, as this kernel did first, read a card's memory at 2%
// of its rate or less). The group's first thread then adds the strands' sums
// in order, from workgroup memory. The inputs come laid out block-major
// (`block_inputs.wgsl`): element e of every block of a column side by side,
// so that neighbouring threads, each at element e of its own block, read
// neighbouring floats.

const ROWS: u32 = WG / STRANDS;
const COL_GROUPS: u32 = 1u;

// Each thread's sums, for its group's first thread to add.
var<workgroup> partial: array<Rf, WG * COLS>;

// The group of rows and of columns a thread works on, within its
// workgroup, and whether it writes their sums.
fn row_group_of(lid: u32) -> u32 {
    return lid / STRANDS;
}

fn col_group_of(lid: u32) -> u32 {
    return 0u;
}

fn writes_sums(lid: u32) -> bool {
    return lid % STRANDS == 0u;
}

// Where this workgroup's first column starts, its last column (counted
// from the first), blocks a row holds, and where the block being read
// starts in the first column.
var<private> x_col0: u32;
var<private> last_col: u32;
var<private> n_blocks: u32;
var<private> x_block: u32;

// Element e of the block being read of input column c, in the block-major
// layout. Columns past the input's last read the last one again: their
// sums are not written.
fn x_at(e: u32, c: u32) -> f32 {
    return x[x_block + min(c, last_col) * p.x_stride + e * n_blocks];
}

// The sums of the rows at bytes `row_start` (none where `has_row` is false)
// with the columns of the thread's column group in workgroup `gz`, into
// `sums` of the group's first thread, a row a lane. Returns how many
// columns the group has. Every thread of the workgroup calls it (it waits
// at a barrier).
fn row_sums(gz: u32, lid: u32, row_start: Ru, has_row: bool, sums: ptr<function, array<Rf, COLS>>) -> u32 {
    let strand = lid % STRANDS;
    let col0 = gz * COLS;
    let n_cols = min(COLS, p.n - col0);
    last_col = n_cols - 1u;
    x_col0 = col0 * p.x_stride;
    n_blocks = p.cols / BLOCK;
    var acc: array<Rf, COLS>;
    if (has_row) {
        for (var q = strand; q < n_blocks * PIECES; q += STRANDS) {
            let b = q / PIECES;
            x_block = x_col0 + b;
            block_piece(&acc, block_bytes_at(row_start, b, n_blocks), block_scale_at(row_start, b), q % PIECES);
        }
    }
    for (var c = 0u; c < COLS; c++) {
        partial[c * WG + lid] = acc[c];
    }
    workgroupBarrier();
    if (strand == 0u) {
        var total: array<Rf, COLS>;
        for (var j = 0u; j < STRANDS; j++) {
            for (var c = 0u; c < COLS; c++) {
                total[c] += partial[c * WG + lid + j];
            }
        }
        *sums = total;
    }
    return n_cols;
}
