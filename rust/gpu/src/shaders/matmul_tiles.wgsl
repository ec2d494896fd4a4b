// The tiled form of the products (`matmul.wgsl`, `matmul_gated.wgsl`,
// `matmul_split.wgsl`), for a prompt: a workgroup takes a tile of ROWS
// groups of four rows by COL_GROUPS groups of COLS columns (COL_GROUPS from
// `kernels.rs`, as many as the staged blocks leave room for in workgroup
// memory), one thread each group of rows and of columns. A thread walks
// `matmul_common.wgsl`'s strands in turn, each strand's pieces from zero,
// and adds a strand's sums to its outputs' totals as the strand ends: the
// row-parallel form's order, so the outputs are that form's bit for bit,
// while no thread waits on another's sums. Each step, the block the strand
// reads next is staged in workgroup memory for every column of the tile at
// once, where every group of rows reads it: an input is read from memory
// once for the tile's rows (the row-parallel form reads it once for four).
// The inputs come as they are, rows of `cols`, so a block is staged from
// runs of neighbouring floats.

const ROWS: u32 = WG / COL_GROUPS;

// A column's staged block, padded by one so that the column groups' first
// elements fall in different banks.
const STAGED_STRIDE: u32 = BLOCK + 1u;
var<workgroup> staged: array<f32, COL_GROUPS * COLS * STAGED_STRIDE>;

// Where the thread's first column lies in `staged`.
var<private> x_tile: u32;

// Element e of the staged block of the thread's input column c. Columns
// past the input's last hold the last one again: their sums are not
// written.
fn x_at(e: u32, c: u32) -> f32 {
    return staged[x_tile + c * STAGED_STRIDE + e];
}

fn row_group_of(lid: u32) -> u32 {
    return lid % ROWS;
}

fn col_group_of(lid: u32) -> u32 {
    return lid / ROWS;
}

fn writes_sums(lid: u32) -> bool {
    return true;
}

// Block b of every column of the tile, from input column `first_col`, into
// `staged`.
fn stage(lid: u32, first_col: u32, b: u32) {
    for (var i = lid; i < COL_GROUPS * COLS * BLOCK; i += WG) {
        let t = i / BLOCK;
        let col = min(first_col + t, p.n - 1u);
        staged[t * STAGED_STRIDE + i % BLOCK] = x[col * p.x_stride + b * BLOCK + i % BLOCK];
    }
}

// The sums of the rows at bytes `row_start` (none where `has_row` is false)
// with the columns of the thread's column group in workgroup `gz`, into
// `sums`, a row a lane. Returns how many columns the group has (none past
// the input's last). Every thread of the workgroup calls it (it stages
// blocks together, between barriers).
fn row_sums(gz: u32, lid: u32, row_start: Ru, has_row: bool, sums: ptr<function, array<Rf, COLS>>) -> u32 {
    let first_col = gz * COL_GROUPS * COLS;
    let col0 = first_col + col_group_of(lid) * COLS;
    let n_cols = select(0u, min(COLS, p.n - col0), col0 < p.n);
    x_tile = col_group_of(lid) * COLS * STAGED_STRIDE;
    let n_blocks = p.cols / BLOCK;
    var total: array<Rf, COLS>;
    for (var strand = 0u; strand < STRANDS; strand++) {
        var acc: array<Rf, COLS>;
        for (var q = strand; q < n_blocks * PIECES; q += STRANDS) {
            let b = q / PIECES;
            // No thread may stage the next block before every thread has
            // read the last.
            workgroupBarrier();
            stage(lid, first_col, b);
            workgroupBarrier();
            if (has_row) {
                block_piece(&acc, block_bytes_at(row_start, b, n_blocks), block_scale_at(row_start, b), q % PIECES);
            }
        }
        for (var c = 0u; c < COLS; c++) {
            total[c] += acc[c];
        }
    }
    *sums = total;
    return n_cols;
}
