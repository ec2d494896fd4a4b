// hmask: 32 bytes, qs: 64 bytes, scales: 12 bytes, d: f16. Two halves of
// 128 elements, each from 32 bytes of qs: for shift 0, 2, 4, 6 (the
// element's 32-run within the half), byte l of the half's qs gives 2 low
// bits of element 32 * (shift / 2) + l, and bit (4 h + shift / 2) of
// hmask[l] clear takes 4 off it; each 16 of elements has its own 6-bit
// scale (less 32): the low nibbles in bytes 0..8 (scales 0..8 low halves,
// 8..16 high halves), the top two bits four to a byte in bytes 8..12.
// On the device d lies apart (`scale_o`), the rest at `o` as in the file.
const BLOCK: u32 = 256u;
const BLOCK_BYTES: u32 = 110u;
// A piece is a 32-run of a half (h, run = piece / 4, piece % 4).
const PIECES: u32 = 8u;

// Scale `is` (0..16) of the block at `o`, unbiased.
fn q3k_scale(o: Ru, is: u32) -> Rf {
    let low = (byte_at(o + 96u + (is % 8u)) >> Ru(4u * (is / 8u))) & Ru(15u);
    let high = (byte_at(o + 104u + (is % 4u)) >> Ru(2u * (is / 4u))) & Ru(3u);
    return Rf(low | (high << Ru(4u))) - 32.0;
}

fn block_piece(acc: ptr<function, array<Rf, COLS>>, o: Ru, scale_o: Ru, piece: u32) {
    let d = f16_at(scale_o);
    let h = piece / 4u;
    let run = piece % 4u;
    let shift = 2u * run;
    let m = 4u * h + run;
    for (var half = 0u; half < 2u; half++) {
        var s: array<Rf, COLS>;
        let first = 16u * half;
        for (var l = first; l < first + 16u; l += 4u) {
            let q = bytes_at(o + 32u + 32u * h + l);
            let hm = bytes_at(o + l);
            for (var k = 0u; k < 4u; k++) {
                let lo = (q >> Ru(8u * k + shift)) & Ru(3u);
                let hi = select(Rf(4.0), Rf(0.0), ((hm >> Ru(8u * k + m)) & Ru(1u)) != Ru(0u));
                fma_cols(&s, Rf(lo) - hi, 128u * h + 32u * run + l + k);
            }
        }
        add_scaled(acc, d * q3k_scale(o, 8u * h + 2u * run + half), s);
    }
}
