//! Tile kernels over repacked rows: the scalar twins against the file-format
//! kernels on the original bytes, and the SIMD kernels against the scalar twins
//! (bit for bit),
//! for every tile width, for odd block counts, and for row counts that leave
//! a group padded.

mod common;

use common::{random_row, Rng};
use ember_gguf::GgmlType;
use ember_quant::packed::{act_row_bytes, quantize_act_row, PackedFormat, GROUP};
use ember_quant::{
    quantize_row_q8_0, quantize_row_q8_1, scalar_dot_fn, scalar_tile_fn, tile_fn, tile_fn_at, unpacked_tile_at,
    SimdLevel, MAX_TILE_COLS,
};

/// The SIMD levels this CPU runs with kernels of their own: each is held to the scalar twins.
fn simd_levels() -> Vec<SimdLevel> {
    SimdLevel::with_own_matrix_kernels_here()
}

/// Every SIMD level's packed tile kernel for `fmt`, with its name.
fn simd_tiles(fmt: PackedFormat) -> Vec<(&'static str, ember_quant::TileFn)> {
    simd_levels().into_iter().map(|l| (l.name(), tile_fn_at(l, fmt).unwrap())).collect()
}

const FORMATS: [PackedFormat; 6] = [
    PackedFormat::Q4_0,
    PackedFormat::Q4_1,
    PackedFormat::Q5_0,
    PackedFormat::Q8_0,
    PackedFormat::Q4_K,
    PackedFormat::Q6_K,
];

/// Row widths to test a format at: for the 32-element formats 1, 3 and 9
/// blocks (odd), 18 and 20 (the test models' widths 576 and 640), 48; for the
/// K-quants 1, 3 and 8 super-blocks.
fn widths(fmt: PackedFormat) -> &'static [usize] {
    match fmt.block_elems() {
        32 => &[32, 96, 288, 576, 640, 1536],
        _ => &[256, 768, 2048],
    }
}

fn is_k_quant(fmt: PackedFormat) -> bool {
    fmt.block_elems() == 256
}

/// `rows` random rows of `fmt`'s file type, and the same rows repacked.
fn random_matrix(fmt: PackedFormat, rows: usize, k: usize, rng: &mut Rng) -> (Vec<Vec<u8>>, Vec<u8>) {
    let file: Vec<Vec<u8>> = (0..rows).map(|_| random_row(fmt.ggml_type(), k, rng)).collect();
    let packed = fmt.pack_matrix(rows, k, &file.concat()).unwrap();
    assert_eq!(packed.len(), fmt.matrix_bytes(rows, k).unwrap());
    (file, packed)
}

/// `n` activation rows, each `stride` bytes apart (a stride wider than a row
/// checks that kernels honour it), filled with garbage between rows.
fn packed_acts(xs: &[Vec<f32>], k: usize, stride: usize) -> Vec<u8> {
    let rb = act_row_bytes(k).unwrap();
    let mut out = vec![0x5A; stride * xs.len()];
    for (j, x) in xs.iter().enumerate() {
        quantize_act_row(x, &mut out[j * stride..j * stride + rb]).unwrap();
    }
    out
}

fn file_act(fmt: PackedFormat, x: &[f32]) -> Vec<u8> {
    let k = x.len();
    match fmt {
        PackedFormat::Q4_1 => {
            let mut out = vec![0; k / 32 * 36];
            quantize_row_q8_1(x, &mut out).unwrap();
            out
        }
        _ => {
            let mut out = vec![0; k / 32 * 34];
            quantize_row_q8_0(x, &mut out).unwrap();
            out
        }
    }
}

/// The exact dot of a file row with an activation row as the tile kernels
/// quantize it (in f64): for the K-quants, whose file kernels quantize
/// activations in 256-element blocks instead.
fn exact_dot(ty: GgmlType, w: &[u8], x: &[f32]) -> f32 {
    let k = x.len();
    let mut deq = vec![0.0; k];
    ember_quant::dequantize_row(ty, w, &mut deq).unwrap();
    let mut act = vec![0u8; act_row_bytes(k).unwrap()];
    quantize_act_row(x, &mut act).unwrap();
    let nb = k / 32;
    let d = |b: usize| f32::from_le_bytes(act[4 * b..4 * b + 4].try_into().unwrap()) as f64;
    (0..k).map(|e| deq[e] as f64 * d(e / 32) * act[16 * nb + e] as i8 as f64).sum::<f64>() as f32
}

/// Σ |w x| over the dequantized weights and raw activations: the scale of
/// the f32 rounding a dot may carry.
fn magnitude(ty: GgmlType, w: &[u8], x: &[f32]) -> f32 {
    let mut deq = vec![0.0; x.len()];
    ember_quant::dequantize_row(ty, w, &mut deq).unwrap();
    deq.iter().zip(x).map(|(a, b)| (a * b).abs()).sum()
}

/// The tile over unpacked groups at `level`, where it has one for `fmt`:
/// the packed groups unpacked into a fresh buffer, then met by the columns.
#[allow(clippy::too_many_arguments)]
fn unpacked(
    level: SimdLevel,
    fmt: PackedFormat,
    k: usize,
    packed: &[u8],
    rows: usize,
    acts: &[u8],
    stride: usize,
    n: usize,
    out: &mut [f32],
    out_stride: usize,
) -> Option<()> {
    let u = unpacked_tile_at(level, fmt)?;
    let groups = rows.div_ceil(GROUP);
    let mut buf = vec![0xA5u8; groups * fmt.unpacked_group_bytes(k).unwrap()];
    (u.unpack)(k, packed, groups, &mut buf);
    (u.tile)(k, &buf, rows, acts, stride, n, out, out_stride);
    Some(())
}

/// 1, 8 (one whole group), 13 (a padded second group), 21 (a pair of
/// groups and an odd one, as the VNNI level's unpacked layout pairs them)
/// and 29 rows (two pairs, the second padded).
const ROWS: [usize; 5] = [1, 8, 13, 21, 29];

#[test]
fn scalar_tiles_equal_file_format_kernels() {
    let mut rng = Rng::new(41);
    for fmt in FORMATS {
        let ty = fmt.ggml_type();
        let dot = scalar_dot_fn(ty).unwrap();
        let tile = scalar_tile_fn(fmt);
        for &k in widths(fmt) {
            for rows in ROWS {
                let (file, packed) = random_matrix(fmt, rows, k, &mut rng);
                let xs: Vec<Vec<f32>> = (0..MAX_TILE_COLS).map(|_| rng.normals(k, 1.0)).collect();
                let stride = act_row_bytes(k).unwrap() + 16;
                let acts = packed_acts(&xs, k, stride);
                let mut out = vec![f32::NAN; MAX_TILE_COLS * rows];
                tile(k, &packed, rows, &acts, stride, MAX_TILE_COLS, &mut out, rows);
                for (j, x) in xs.iter().enumerate() {
                    for (r, w) in file.iter().enumerate() {
                        let want = if is_k_quant(fmt) { exact_dot(ty, w, x) } else { dot(k, w, &file_act(fmt, x)) };
                        let tol = 1e-5 * magnitude(ty, w, x).max(1.0);
                        let got = out[j * rows + r];
                        assert!(
                            (got - want).abs() <= tol,
                            "{fmt:?} k={k} row {r} col {j}: tile {got} vs file kernel {want}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn simd_tiles_match_scalar_twins() {
    let mut rng = Rng::new(42);
    #[cfg(target_arch = "x86_64")]
    assert!(!is_x86_feature_detected!("avx2") || !simd_levels().is_empty(), "an AVX2 CPU runs a SIMD level");
    for level in simd_levels() {
        for fmt in FORMATS {
            let (best, scalar) = (tile_fn_at(level, fmt).unwrap(), scalar_tile_fn(fmt));
            for &k in widths(fmt) {
                for rows in ROWS {
                    let (file, packed) = random_matrix(fmt, rows, k, &mut rng);
                    for n in 1..=MAX_TILE_COLS {
                        let xs: Vec<Vec<f32>> = (0..n).map(|_| rng.normals(k, 1.0)).collect();
                        let stride = act_row_bytes(k).unwrap();
                        let acts = packed_acts(&xs, k, stride);
                        let out_stride = rows + 3;
                        let (mut a, mut b) = (vec![f32::NAN; n * out_stride], vec![f32::NAN; n * out_stride]);
                        best(k, &packed, rows, &acts, stride, n, &mut a, out_stride);
                        scalar(k, &packed, rows, &acts, stride, n, &mut b, out_stride);
                        // The unpacked layout's kernel too, where there is one.
                        let mut c = vec![f32::NAN; n * out_stride];
                        let runs: Vec<(&str, &[f32])> =
                            match unpacked(level, fmt, k, &packed, rows, &acts, stride, n, &mut c, out_stride) {
                                Some(()) => vec![("packed", &a), ("unpacked", &c)],
                                None => vec![("packed", &a)],
                            };
                        for (what, got) in runs {
                            for j in 0..n {
                                for r in 0..file.len() {
                                    let (x, y) = (got[j * out_stride + r], b[j * out_stride + r]);
                                    assert_eq!(
                                        x.to_bits(),
                                        y.to_bits(),
                                        "{fmt:?} {what} ({}) k={k} rows={rows} n={n} row {r} col {j}: {x} vs {y}",
                                        level.name()
                                    );
                                }
                                assert!(
                                    got[j * out_stride + rows..(j + 1) * out_stride].iter().all(|v| v.is_nan()),
                                    "{what} ({}) wrote past the rows",
                                    level.name()
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Extreme quants and activations: every 4-bit quant 15, every 5-bit quant
/// 31 (stored), every 8-bit quant +-127, against activations of +-127 (the
/// bounds the kernels' 16-bit partial sums are sized for).
#[test]
fn extreme_quants_do_not_overflow() {
    for fmt in [PackedFormat::Q4_1, PackedFormat::Q5_0, PackedFormat::Q8_0] {
        let ty = fmt.ggml_type();
        let k = 256;
        let row: Vec<u8> = match fmt {
            // d = 1.0, m = 0, quants all 15
            PackedFormat::Q4_1 => [0x00, 0x3C, 0, 0].into_iter().chain([0xFF; 16]).cycle().take(k / 32 * 20).collect(),
            // d = 1.0, fifth bits all set, nibbles all 15
            PackedFormat::Q5_0 => {
                [0x00, 0x3C, 0xFF, 0xFF, 0xFF, 0xFF].into_iter().chain([0xFF; 16]).cycle().take(k / 32 * 22).collect()
            }
            // d = 1.0, quants alternating 127 and -127
            PackedFormat::Q8_0 => [0x00u8, 0x3C]
                .into_iter()
                .chain((0..32).map(|i| if i % 2 == 0 { 127u8 } else { 129u8 }))
                .cycle()
                .take(k / 32 * 34)
                .collect(),
            _ => unreachable!(),
        };
        let rows = 8;
        let file = row.repeat(rows);
        let packed = fmt.pack_matrix(rows, k, &file).unwrap();
        let dot = scalar_dot_fn(ty).unwrap();
        for sign in [1.0f32, -1.0] {
            let x: Vec<f32> =
                (0..k).map(|i| if fmt == PackedFormat::Q8_0 && i % 2 == 1 { -sign } else { sign }).collect();
            let acts = packed_acts(std::slice::from_ref(&x), k, act_row_bytes(k).unwrap());
            let want = dot(k, &row, &file_act(fmt, &x));
            for (level, tile) in simd_tiles(fmt).into_iter().chain([("scalar", scalar_tile_fn(fmt))]) {
                let mut out = vec![0.0; rows];
                tile(k, &packed, rows, &acts, act_row_bytes(k).unwrap(), 1, &mut out, rows);
                for v in out {
                    assert!(
                        (v - want).abs() <= 1e-3 * want.abs().max(1.0),
                        "{fmt:?} ({level}) sign {sign}: {v} vs {want}"
                    );
                }
            }
            for level in simd_levels() {
                let mut out = vec![0.0; rows];
                let stride = act_row_bytes(k).unwrap();
                if unpacked(level, fmt, k, &packed, rows, &acts, stride, 1, &mut out, rows).is_some() {
                    assert!(
                        out.iter().all(|v| (v - want).abs() <= 1e-3 * want.abs().max(1.0)),
                        "{fmt:?} unpacked ({}), sign {sign}: {out:?} vs {want}",
                        level.name()
                    );
                }
            }
        }
    }
}

#[test]
fn packing_refuses_wrong_lengths() {
    let fmt = PackedFormat::Q4_1;
    assert_eq!(fmt.group_bytes(33), None);
    let src = vec![0u8; 20 * 2];
    let mut dst = vec![0u8; fmt.group_bytes(64).unwrap()];
    assert!(fmt.pack_group(64, &src[..39], &mut dst).is_err());
    assert!(fmt.pack_group(64, &src, &mut dst[1..]).is_err());
    assert!(fmt.pack_group(64, &[0u8; 9 * 40], &mut dst).is_err(), "nine rows are not a group");
    assert!(fmt.pack_group(64, &src, &mut dst).is_ok());
    assert!(fmt.pack_matrix(3, 64, &src).is_err());
    assert!(quantize_act_row(&[0.0; 64], &mut vec![0; act_row_bytes(64).unwrap() - 1]).is_err());
    assert_eq!(PackedFormat::Q4_K.group_bytes(640), None, "K-quant rows are whole super-blocks");
}

/// The K-quants' extremes: Q4_K with every quant 15 and the largest 6-bit
/// scales and mins, Q6_K with every quant at -32 or +31 and scales of -128
/// and 127, against activations of +-127.
#[test]
fn extreme_k_quants_do_not_overflow() {
    let k = 512;
    for fmt in [PackedFormat::Q4_K, PackedFormat::Q6_K] {
        let ty = fmt.ggml_type();
        for variant in 0..2u8 {
            let block: Vec<u8> = match fmt {
                // d = dmin = 1.0; all scales and mins 63; quants 15 (or 0)
                PackedFormat::Q4_K => [0x00, 0x3C, 0x00, 0x3C]
                    .into_iter()
                    .chain([0xFF; 12])
                    .chain([if variant == 0 { 0xFF } else { 0x00 }; 128])
                    .collect(),
                // quants 63 (+31) or 0 (-32); scales 127 or -128; d = 1.0
                _ => [if variant == 0 { 0xFF } else { 0x00 }; 128 + 64]
                    .into_iter()
                    .chain([if variant == 0 { 127u8 } else { 128u8 }; 16])
                    .chain([0x00, 0x3C])
                    .collect(),
            };
            assert_eq!(block.len(), ty.type_size());
            let row = block.repeat(k / 256);
            let rows = 8;
            let packed = fmt.pack_matrix(rows, k, &row.repeat(rows)).unwrap();
            for sign in [1.0f32, -1.0] {
                let x = vec![sign; k];
                let acts = packed_acts(std::slice::from_ref(&x), k, act_row_bytes(k).unwrap());
                let want = exact_dot(ty, &row, &x);
                for (level, tile) in simd_tiles(fmt).into_iter().chain([("scalar", scalar_tile_fn(fmt))]) {
                    let mut out = vec![0.0; rows];
                    tile(k, &packed, rows, &acts, act_row_bytes(k).unwrap(), 1, &mut out, rows);
                    for v in out {
                        assert!(
                            (v - want).abs() <= 1e-4 * want.abs().max(1.0),
                            "{fmt:?} ({level}) variant {variant} sign {sign}: {v} vs {want}"
                        );
                    }
                }
                for level in simd_levels() {
                    let mut out = vec![0.0; rows];
                    let stride = act_row_bytes(k).unwrap();
                    if unpacked(level, fmt, k, &packed, rows, &acts, stride, 1, &mut out, rows).is_some() {
                        assert!(
                            out.iter().all(|v| (v - want).abs() <= 1e-4 * want.abs().max(1.0)),
                            "{fmt:?} unpacked ({}), variant {variant} sign {sign}",
                            level.name()
                        );
                    }
                }
            }
        }
    }
}

#[test]
#[should_panic(expected = "activation rows too short")]
fn tiles_refuse_short_activations() {
    let (fmt, k) = (PackedFormat::Q8_0, 64);
    let w = vec![0u8; fmt.group_bytes(k).unwrap()];
    let acts = vec![0u8; act_row_bytes(k).unwrap()];
    let mut out = [0.0; 2];
    tile_fn(fmt)(k, &w, 1, &acts, act_row_bytes(k).unwrap(), 2, &mut out, 1);
}

/// Runs of groups in one call equal one call per group, for every tile
/// width, with the output strided as a pass's [column][row] matrix.
#[test]
fn group_runs_equal_single_groups() {
    let mut rng = Rng::new(43);
    for fmt in FORMATS {
        let (k, rows) = (widths(fmt)[1], 21);
        let (_, packed) = random_matrix(fmt, rows, k, &mut rng);
        let gb = fmt.group_bytes(k).unwrap();
        let xs: Vec<Vec<f32>> = (0..MAX_TILE_COLS).map(|_| rng.normals(k, 1.0)).collect();
        let stride = act_row_bytes(k).unwrap();
        let acts = packed_acts(&xs, k, stride);
        for (level, tile) in simd_tiles(fmt).into_iter().chain([("scalar", scalar_tile_fn(fmt))]) {
            for n in 1..=MAX_TILE_COLS {
                let out_stride = rows + 3;
                let mut run = vec![f32::NAN; n * out_stride];
                tile(k, &packed, rows, &acts, stride, n, &mut run, out_stride);
                for g in 0..rows.div_ceil(GROUP) {
                    let lanes = (rows - g * GROUP).min(GROUP);
                    let mut one = vec![f32::NAN; n * GROUP];
                    tile(k, &packed[g * gb..(g + 1) * gb], lanes, &acts, stride, n, &mut one, GROUP);
                    for j in 0..n {
                        for i in 0..lanes {
                            let r = g * GROUP + i;
                            assert_eq!(
                                run[j * out_stride + r].to_bits(),
                                one[j * GROUP + i].to_bits(),
                                "{fmt:?} ({level}) row {r} col {j}"
                            );
                        }
                    }
                }
                for j in 0..n {
                    assert!(
                        run[j * out_stride + rows..(j + 1) * out_stride].iter().all(|v| v.is_nan()),
                        "wrote outside the rows"
                    );
                }
            }
        }
    }
}

/// A column's result does not depend on the width of the tile it is computed
/// in (bit for bit): a token gets the same logits decoded alone or in a batch.
#[test]
fn columns_are_independent_of_tile_width() {
    let mut rng = Rng::new(44);
    for fmt in FORMATS {
        for &k in widths(fmt) {
            let rows = 8;
            let (_, packed) = random_matrix(fmt, rows, k, &mut rng);
            let xs: Vec<Vec<f32>> = (0..MAX_TILE_COLS).map(|_| rng.normals(k, 1.0)).collect();
            let stride = act_row_bytes(k).unwrap();
            let acts = packed_acts(&xs, k, stride);
            for (level, tile) in simd_tiles(fmt).into_iter().chain([("scalar", scalar_tile_fn(fmt))]) {
                let mut wide = [0.0f32; MAX_TILE_COLS * 8];
                tile(k, &packed, rows, &acts, stride, MAX_TILE_COLS, &mut wide, rows);
                for j in 0..MAX_TILE_COLS {
                    let mut one = [0.0f32; 8];
                    tile(k, &packed, rows, &acts[j * stride..], stride, 1, &mut one, rows);
                    for r in 0..rows {
                        let (a, b) = (one[r], wide[j * rows + r]);
                        assert_eq!(a.to_bits(), b.to_bits(), "{fmt:?} ({level}) k={k} row {r} col {j}");
                    }
                }
            }
        }
    }
}

/// The activation quantizer's vector form writes the scalar loop's bytes:
/// random rows, rows with exact halves (ties round to even), a zero block,
/// and a block whose largest magnitude is negative.
#[test]
fn activation_rows_equal_the_scalar_quantizer() {
    use ember_quant::packed::quantize_act_row_scalar;
    let mut rng = Rng::new(45);
    // Whole groups of eight blocks and partial ones (the vector form does
    // eight blocks' scales at a time).
    for k in [32, 224, 256, 640, 2048] {
        let mut rows: Vec<Vec<f32>> = (0..20).map(|i| rng.normals(k, 0.1 + i as f64)).collect();
        // amax 127 makes the multiplier 1: x.5 values are exact ties.
        rows.push((0..k).map(|i| if i % 32 == 0 { 127.0 } else { (i % 32) as f32 - 15.5 }).collect());
        rows.push(
            (0..k)
                .map(|i| {
                    if i < 32 {
                        0.0
                    } else if i % 32 == 5 {
                        -3.0
                    } else {
                        1.0
                    }
                })
                .collect(),
        );
        // Scales that round to f16 subnormals, to zero, and past f16's range.
        rows.push((0..k).map(|i| [1e-5, 3e-8, 1e-9, 9e6][(i / 32) % 4] * ((i % 7) as f32 - 3.0)).collect());
        for x in &rows {
            let (mut a, mut b) = (vec![0u8; act_row_bytes(k).unwrap()], vec![1u8; act_row_bytes(k).unwrap()]);
            quantize_act_row(x, &mut a).unwrap();
            quantize_act_row_scalar(x, &mut b).unwrap();
            assert_eq!(a, b, "k = {k}");
        }
    }
}

/// Q4_0 has a layout of its own, as many bytes as the file's (no min
/// stored: the kernels make it), and takes Q4_0's rows only.
#[test]
fn q4_0_has_a_layout_of_its_own() {
    assert_eq!(PackedFormat::of(GgmlType::Q4_0), Some(PackedFormat::Q4_0));
    assert_eq!(PackedFormat::Q4_0.block_bytes(), GROUP * 18);
    let g = |f: PackedFormat| vec![0u8; f.group_bytes(32).unwrap()];
    assert!(PackedFormat::Q4_0.pack_group_from(GgmlType::Q4_1, 32, &[0; 20], &mut g(PackedFormat::Q4_0)).is_err());
    assert!(PackedFormat::Q5_0.pack_group_from(GgmlType::Q4_0, 32, &[0; 18], &mut g(PackedFormat::Q5_0)).is_err());
}
