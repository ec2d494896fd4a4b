// Where element k of output row `row` goes: rows of `p.n_head * p.dv`,
// laid out for a product over blocks of `p.block` as `block_inputs.wgsl`
// lays them (element e of block b at e * (width / block) + b; a block of 1
// leaves the row as it is). Shared by the attention kernels.
fn out_at(row: u32, k: u32) -> u32 {
    let width = p.n_head * p.dv;
    return row * width + (k % p.block) * (width / p.block) + k / p.block;
}
