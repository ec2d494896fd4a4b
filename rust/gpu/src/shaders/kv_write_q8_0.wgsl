// A cache of Q8_0 rows (`kv_rows.wgsl` writes it): a thread stores a unit
// of one block of 32 elements. The ring's quants come first, a byte an
// element (element e of ring row `slot` at byte slot * width + e), then its
// blocks' scales, each the f16 `d` held as an f32 word (block b of the ring
// at word ring * width / 4 + b), so that no thread writes part of another's
// word. A block is quantized as the CPU's cache quantizes it (llama.cpp's
// x86 quantizer): d = amax / 127, each quant x * (127 / amax) rounded to
// nearest, ties to even.

const KV_UNIT: u32 = 32u;

fn store_unit(is_key: bool, ring: u32, width: u32, slot: u32, u: u32, x: array<f32, KV_UNIT>) {
    var amax = 0.0;
    for (var j = 0u; j < KV_UNIT; j++) {
        amax = max(amax, abs(x[j]));
    }
    let id = select(0.0, 127.0 / amax, amax != 0.0);
    let at = (slot * width + u * KV_UNIT) / 4u;
    for (var w = 0u; w < KV_UNIT / 4u; w++) {
        var word = 0u;
        for (var k = 0u; k < 4u; k++) {
            let q = i32(round(x[4u * w + k] * id));
            word |= (bitcast<u32>(q) & 0xffu) << (8u * k);
        }
        put_word(is_key, at + w, word);
    }
    // The scale as the cache keeps it: rounded to f16.
    let d = unpack2x16float(pack2x16float(vec2<f32>(amax / 127.0, 0.0))).x;
    put_word(is_key, ring * width / 4u + slot * width / KV_UNIT + u, bitcast<u32>(d));
}
