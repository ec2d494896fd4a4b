// d: f16, then 16 bytes of 4-bit level indices: element j in the low
// nibble of byte j, element j + 16 in its high nibble; an element is
// d times the level (`iq4_level`). On the device d lies apart
// (`scale_o`), the 16 bytes at `o`.
const BLOCK: u32 = 32u;
const PIECES: u32 = 1u;
const BLOCK_BYTES: u32 = 18u;

fn block_piece(acc: ptr<function, array<Rf, COLS>>, o: Ru, scale_o: Ru, piece: u32) {
    var s: array<Rf, COLS>;
    for (var j = 0u; j < 16u; j += 4u) {
        let q = bytes_at(o + j);
        for (var k = 0u; k < 4u; k++) {
            let b = (q >> Ru(8u * k)) & Ru(0xffu);
            fma_cols(&s, iq4_level(b & Ru(15u)), j + k);
            fma_cols(&s, iq4_level(b >> Ru(4u)), j + k + 16u);
        }
    }
    add_scaled(acc, f16_at(scale_o), s);
}
