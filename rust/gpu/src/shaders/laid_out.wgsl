// Where element k of a row `width` wide goes when the row is laid out for a
// product over blocks of `block` (element e of block b at
// e * (width / block) + b, where `matmul_rows.wgsl`'s `x_at` reads it; a
// block of 1 leaves the row as it is). Shared by every kernel that writes a
// product's inputs laid out: `block_inputs.wgsl`, the norm, the gated
// product and the attention.
fn laid_out_at(k: u32, width: u32, block: u32) -> u32 {
    return (k % block) * (width / block) + k / block;
}
