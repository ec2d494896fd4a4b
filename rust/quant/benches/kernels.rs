//! Kernel throughput per weight format, one thread: a matrix-vector product
//! at decode sizes in GB/s of weights streamed, and a product over 64 columns
//! (a prompt chunk) in GOP/s (two per multiply-add). Both the file-format dot
//! kernels and, where the format has one, the repacked tile kernels, packed and
//! (as a prompt runs them) over tiles unpacked once for every column group,
//! at each SIMD level this CPU runs.
//!
//!     cargo bench -p ember-quant --bench kernels [-- ROWS COLS]

use std::hint::black_box;
use std::time::Instant;

use ember_gguf::GgmlType;
use ember_quant::packed::{act_row_bytes, quantize_act_row, PackedFormat};
use ember_quant::{
    activation_type, dot_fn, quantize_activation, tile_fn_at, unpacked_tile_at, SimdLevel, MAX_TILE_COLS,
};

/// Random bytes with every f16 scale field made small and finite.
fn random_matrix(ty: GgmlType, rows: usize, k: usize, seed: &mut u64) -> Vec<u8> {
    let rb = ty.row_bytes(k as u64).unwrap() as usize;
    let mut data: Vec<u8> = (0..rows * rb).map(|_| next(seed) as u8).collect();
    if ty.block_size() > 1 {
        for b in data.chunks_exact_mut(ty.type_size()) {
            for &o in ty.f16_scale_offsets() {
                b[o..o + 2].copy_from_slice(&half::f16::from_f32(0.01).to_bits().to_le_bytes());
            }
        }
    }
    data
}

fn next(s: &mut u64) -> u64 {
    *s = s.wrapping_add(0x9e3779b97f4a7c15);
    let mut z = *s;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
    z ^ (z >> 31)
}

/// Seconds per call of `f`, the best of several timed batches.
fn time(mut f: impl FnMut()) -> f64 {
    f();
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let t0 = Instant::now();
        let mut n = 0;
        while t0.elapsed().as_secs_f64() < 0.2 {
            f();
            n += 1;
        }
        best = best.min(t0.elapsed().as_secs_f64() / n as f64);
    }
    best
}

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let (rows, k) = (args.first().copied().unwrap_or(2048), args.get(1).copied().unwrap_or(2048));
    let cols = 64;
    let mut seed = 1u64;
    let x: Vec<f32> = (0..cols * k).map(|_| (next(&mut seed) % 2001) as f32 / 1000.0 - 1.0).collect();
    println!("{rows} x {k} weights, kernels: {}", ember_quant::simd_level());
    println!("| format | kernel | matvec GB/s | matvec ms | {cols} cols GOP/s |");
    println!("| --- | --- | ---: | ---: | ---: |");
    for ty in
        [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::F16]
    {
        if ty.row_bytes(k as u64).is_none() {
            println!("| {} | - | rows of {k} are not whole blocks | | |", ty.name());
            continue;
        }
        let w = random_matrix(ty, rows, k, &mut seed);
        let rb = w.len() / rows;
        let gop = |secs: f64| 2.0 * (rows * k * cols) as f64 / secs / 1e9;
        // File-format kernels: one dot per (row, column).
        let dot = dot_fn(ty).unwrap();
        let act = activation_type(ty);
        let mut xq = Vec::new();
        let mut one = Vec::new();
        for c in 0..cols {
            quantize_activation(act, &x[c * k..(c + 1) * k], &mut one).unwrap();
            xq.extend_from_slice(&one);
        }
        let arb = xq.len() / cols;
        let mut out = vec![0.0f32; rows * cols];
        let mv = time(|| {
            for r in 0..rows {
                out[r] = dot(k, &w[r * rb..(r + 1) * rb], &xq[..arb]);
            }
            black_box(&out);
        });
        let mm = time(|| {
            for r in 0..rows {
                for c in 0..cols {
                    out[c * rows + r] = dot(k, &w[r * rb..(r + 1) * rb], &xq[c * arb..(c + 1) * arb]);
                }
            }
            black_box(&out);
        });
        println!("| {} | dot | {:.1} | {:.3} | {:.1} |", ty.name(), w.len() as f64 / mv / 1e9, mv * 1e3, gop(mm));
        // Repacked tile kernels.
        let Some(fmt) = PackedFormat::of(ty) else { continue };
        let pw = fmt.pack_matrix(rows, k, &w).unwrap();
        let stride = act_row_bytes(k).unwrap();
        let mut acts = vec![0u8; cols * stride];
        for c in 0..cols {
            quantize_act_row(&x[c * k..(c + 1) * k], &mut acts[c * stride..(c + 1) * stride]).unwrap();
        }
        for level in SimdLevel::with_own_matrix_kernels_here() {
            let tile = tile_fn_at(level, fmt).unwrap();
            let gb = fmt.group_bytes(k).unwrap();
            let mv = time(|| {
                tile(k, &pw, rows, &acts, stride, 1, &mut out, rows);
                black_box(&out);
            });
            let mm = time(|| {
                for r0 in (0..rows).step_by(32) {
                    for c0 in (0..cols).step_by(MAX_TILE_COLS) {
                        let n_rows = 32.min(rows - r0);
                        tile(
                            k,
                            &pw[r0 / 8 * gb..],
                            n_rows,
                            &acts[c0 * stride..],
                            stride,
                            MAX_TILE_COLS,
                            &mut out[c0 * rows + r0..],
                            rows,
                        );
                    }
                }
                black_box(&out);
            });
            println!(
                "| {} | tile ({}) | {:.1} | {:.3} | {:.1} |",
                ty.name(),
                level.name(),
                pw.len() as f64 / mv / 1e9,
                mv * 1e3,
                gop(mm)
            );
            // A prompt's way: each tile of 32 rows unpacked once, then met by every column group.
            let Some(u) = unpacked_tile_at(level, fmt) else { continue };
            let xb = fmt.unpacked_group_bytes(k).unwrap();
            let mut buf = vec![0u8; 4 * xb];
            let mm = time(|| {
                for r0 in (0..rows).step_by(32) {
                    let n_rows = 32.min(rows - r0);
                    let groups = n_rows.div_ceil(8);
                    (u.unpack)(k, &pw[r0 / 8 * gb..], groups, &mut buf[..groups * xb]);
                    for c0 in (0..cols).step_by(MAX_TILE_COLS) {
                        (u.tile)(
                            k,
                            &buf[..groups * xb],
                            n_rows,
                            &acts[c0 * stride..],
                            stride,
                            MAX_TILE_COLS,
                            &mut out[c0 * rows + r0..],
                            rows,
                        );
                    }
                }
                black_box(&out);
            });
            println!("| {} | unpacked tile ({}) | - | - | {:.1} |", ty.name(), level.name(), gop(mm));
        }
    }
}
