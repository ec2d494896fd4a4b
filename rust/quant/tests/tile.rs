//! Tile kernels over repacked rows: the scalar twins against the file-format
//! kernels on the original bytes, and the SIMD kernels against the scalar twins,
//! for every tile width and for rows whose block count is odd or not a
//! multiple of eight (the padded cases).

mod common;

use common::{random_row, Rng};
use ember_gguf::GgmlType;
use ember_quant::packed::{act_row_bytes, quantize_act_row, PackedFormat};
use ember_quant::{quantize_row_q8_0, quantize_row_q8_1, scalar_dot_fn, scalar_tile_fn, tile_fn, MAX_TILE_COLS};

const FORMATS: [PackedFormat; 3] = [PackedFormat::Q4_1, PackedFormat::Q5_0, PackedFormat::Q8_0];
/// 1, 3 and 9 blocks (odd), 18 and 20 (the test models' widths 576 and 640), 48.
const WIDTHS: [usize; 6] = [32, 96, 288, 576, 640, 1536];

fn packed_row(fmt: PackedFormat, k: usize, src: &[u8]) -> Vec<u8> {
    let mut dst = vec![0xAA; fmt.row_bytes(k).unwrap()];
    fmt.pack_row(k, src, &mut dst).unwrap();
    dst
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

/// Σ |w x| over the dequantized weights and raw activations: the scale of
/// the f32 rounding a dot may carry.
fn magnitude(ty: GgmlType, w: &[u8], x: &[f32]) -> f32 {
    let mut deq = vec![0.0; x.len()];
    ember_quant::dequantize_row(ty, w, &mut deq).unwrap();
    deq.iter().zip(x).map(|(a, b)| (a * b).abs()).sum()
}

#[test]
fn scalar_tiles_equal_file_format_kernels() {
    let mut rng = Rng::new(41);
    for fmt in FORMATS {
        let ty = fmt.ggml_type();
        let dot = scalar_dot_fn(ty).unwrap();
        let tile = scalar_tile_fn(fmt);
        for k in WIDTHS {
            let w = random_row(ty, k, &mut rng);
            let pw = packed_row(fmt, k, &w);
            let xs: Vec<Vec<f32>> = (0..MAX_TILE_COLS).map(|_| rng.normals(k, 1.0)).collect();
            let stride = act_row_bytes(k).unwrap() + 16;
            let acts = packed_acts(&xs, k, stride);
            let mut out = [0.0f32; MAX_TILE_COLS];
            tile(k, &pw, 1, &acts, stride, MAX_TILE_COLS, &mut out, 1);
            for (j, x) in xs.iter().enumerate() {
                let want = dot(k, &w, &file_act(fmt, x));
                let tol = 1e-5 * magnitude(ty, &w, x).max(1.0);
                assert!((out[j] - want).abs() <= tol, "{fmt:?} k={k} col {j}: tile {} vs file kernel {want}", out[j]);
            }
        }
    }
}

#[test]
fn simd_tiles_match_scalar_twins() {
    let mut rng = Rng::new(42);
    for fmt in FORMATS {
        let ty = fmt.ggml_type();
        let (best, scalar) = (tile_fn(fmt), scalar_tile_fn(fmt));
        for k in WIDTHS {
            let w = random_row(ty, k, &mut rng);
            let pw = packed_row(fmt, k, &w);
            for n in 1..=MAX_TILE_COLS {
                let xs: Vec<Vec<f32>> = (0..n).map(|_| rng.normals(k, 1.0)).collect();
                let stride = act_row_bytes(k).unwrap();
                let acts = packed_acts(&xs, k, stride);
                let (mut a, mut b) = ([f32::NAN; MAX_TILE_COLS], [f32::NAN; MAX_TILE_COLS]);
                best(k, &pw, 1, &acts, stride, n, &mut a, 1);
                scalar(k, &pw, 1, &acts, stride, n, &mut b, 1);
                for j in 0..n {
                    let tol = 1e-5 * magnitude(ty, &w, &xs[j]).max(1.0);
                    assert!((a[j] - b[j]).abs() <= tol, "{fmt:?} ({}) k={k} n={n} col {j}: {} vs {}", ember_quant::simd_level(), a[j], b[j]);
                }
                assert!(a[n..].iter().all(|v| v.is_nan()), "wrote past the tile");
            }
        }
    }
}

#[test]
fn packing_refuses_wrong_lengths() {
    let fmt = PackedFormat::Q4_1;
    assert_eq!(fmt.row_bytes(33), None);
    let src = vec![0u8; 20 * 2];
    let mut dst = vec![0u8; fmt.row_bytes(64).unwrap()];
    assert!(fmt.pack_row(64, &src[..39], &mut dst).is_err());
    assert!(fmt.pack_row(64, &src, &mut dst[1..]).is_err());
    assert!(fmt.pack_row(64, &src, &mut dst).is_ok());
    assert!(quantize_act_row(&[0.0; 64], &mut vec![0; act_row_bytes(64).unwrap() - 1]).is_err());
}

#[test]
#[should_panic(expected = "activation rows too short")]
fn tiles_refuse_short_activations() {
    let (fmt, k) = (PackedFormat::Q8_0, 64);
    let w = vec![0u8; fmt.row_bytes(k).unwrap()];
    let acts = vec![0u8; act_row_bytes(k).unwrap()];
    let mut out = [0.0; 2];
    tile_fn(fmt)(k, &w, 1, &acts, act_row_bytes(k).unwrap(), 2, &mut out, 1);
}

/// Runs of rows in one call equal one call per row, for every tile width,
/// with the output strided as a pass's [column][row] matrix.
#[test]
fn row_runs_equal_single_rows() {
    let mut rng = Rng::new(43);
    for fmt in FORMATS {
        let (k, rows) = (96, 5);
        let w: Vec<u8> = (0..rows).flat_map(|_| packed_row(fmt, k, &random_row(fmt.ggml_type(), k, &mut rng))).collect();
        let rb = fmt.row_bytes(k).unwrap();
        let xs: Vec<Vec<f32>> = (0..MAX_TILE_COLS).map(|_| rng.normals(k, 1.0)).collect();
        let stride = act_row_bytes(k).unwrap();
        let acts = packed_acts(&xs, k, stride);
        for tile in [tile_fn(fmt), scalar_tile_fn(fmt)] {
            for n in 1..=MAX_TILE_COLS {
                let out_stride = rows + 3;
                let mut run = vec![f32::NAN; n * out_stride];
                tile(k, &w, rows, &acts, stride, n, &mut run, out_stride);
                for r in 0..rows {
                    let mut one = vec![f32::NAN; n];
                    tile(k, &w[r * rb..(r + 1) * rb], 1, &acts, stride, n, &mut one, 1);
                    for j in 0..n {
                        assert_eq!(run[j * out_stride + r].to_bits(), one[j].to_bits(), "{fmt:?} row {r} col {j}");
                    }
                }
                for j in 0..n {
                    assert!(run[j * out_stride + rows..(j + 1) * out_stride].iter().all(|v| v.is_nan()), "wrote outside the rows");
                }
            }
        }
    }
}

/// A column's result does not depend on the width of the tile it is computed
/// in (bit for bit): a token's logits are the same decoded alone or in a batch.
#[test]
fn columns_are_independent_of_tile_width() {
    let mut rng = Rng::new(44);
    for fmt in FORMATS {
        for k in WIDTHS {
            let w = packed_row(fmt, k, &random_row(fmt.ggml_type(), k, &mut rng));
            let xs: Vec<Vec<f32>> = (0..MAX_TILE_COLS).map(|_| rng.normals(k, 1.0)).collect();
            let stride = act_row_bytes(k).unwrap();
            let acts = packed_acts(&xs, k, stride);
            let tile = tile_fn(fmt);
            let mut wide = [0.0f32; MAX_TILE_COLS];
            tile(k, &w, 1, &acts, stride, MAX_TILE_COLS, &mut wide, 1);
            for j in 0..MAX_TILE_COLS {
                let mut one = [0.0f32; 1];
                tile(k, &w, 1, &acts[j * stride..], stride, 1, &mut one, 1);
                assert_eq!(one[0].to_bits(), wide[j].to_bits(), "{fmt:?} k={k} col {j}");
            }
        }
    }
}
