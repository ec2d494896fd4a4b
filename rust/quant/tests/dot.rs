//! Dot products: exactness against the dequantized operands, error budget
//! against the unquantized activations, and SIMD kernels against their
//! scalar twins.

mod common;

use common::{random_row, Rng, SUPPORTED};
use ember_gguf::GgmlType;
use ember_quant::{
    act_row_bytes, activation_type, dequantize_row, dot_fn, quantize_activation, scalar_dot_fn,
    simd_level, vec_dot, ActType,
};
use half::f16;

const K: usize = 4096;
const ROWS: u64 = 24;

fn dequant(ty: GgmlType, bytes: &[u8], k: usize) -> Vec<f32> {
    let mut out = vec![0.0; k];
    dequantize_row(ty, bytes, &mut out).unwrap();
    out
}

fn act_dequant(act: ActType, bytes: &[u8], k: usize) -> Vec<f32> {
    let ty = match act {
        // No ggml dequantizer; the layout is Q8_0's with `s` after `d`.
        ActType::Q8_1 => {
            return bytes[..k / 32 * 36]
                .chunks_exact(36)
                .flat_map(|b| {
                    let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
                    b[4..].iter().map(move |&q| d * q as i8 as f32)
                })
                .collect()
        }
        ActType::Q8_0 => GgmlType::Q8_0,
        ActType::Q8_K => GgmlType::Q8_K,
        ActType::F32 => GgmlType::F32,
        ActType::F16 => GgmlType::F16,
        ActType::BF16 => GgmlType::BF16,
    };
    dequant(ty, bytes, k)
}

/// (Σ a b, Σ |a b|) in f64.
fn dot64(a: &[f32], b: &[f32]) -> (f64, f64) {
    a.iter().zip(b).fold((0.0, 0.0), |(s, m), (&a, &b)| {
        let p = a as f64 * b as f64;
        (s + p, m + p.abs())
    })
}

/// Activations partly aligned with the weights, so the true sum is far from
/// zero and its relative error is meaningful.
fn activations(w: &[f32], rng: &mut Rng) -> Vec<f32> {
    let rms = (w.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / w.len() as f64).sqrt();
    w.iter()
        .map(|&v| (0.25 * v as f64 / rms + rng.normal()) as f32)
        .collect()
}

fn quantized(act: ActType, x: &[f32]) -> Vec<u8> {
    let mut out = Vec::new();
    quantize_activation(act, x, &mut out).unwrap();
    out
}

/// The kernels compute the exact product of the dequantized weights and the
/// dequantized activations (integer sums are exact); only f32 rounding of the
/// per-block scaling and the cross-block sum may differ, bounded by 1e-5 of
/// Σ |w x|. Against Q8_1 the min term uses the block's stored `s` (f16) for
/// `d Σ q`, so the reference does too (see [`q8_1_s_rounding`]). This is the test that pins down scale unpacking and bit layout
/// in the kernels.
#[test]
fn scalar_kernels_equal_product_of_dequantized_operands() {
    for ty in SUPPORTED {
        let act = activation_type(ty);
        let dot = scalar_dot_fn(ty).unwrap();
        let mut rng = Rng::new(1000 + ty.id() as u64);
        for _ in 0..ROWS {
            let w_row = random_row(ty, K, &mut rng);
            let w = dequant(ty, &w_row, K);
            let xq = quantized(act, &activations(&w, &mut rng));
            let (exact, mag) = dot64(&w, &act_dequant(act, &xq, K));
            let exact = exact + q8_1_s_rounding(ty, act, &w_row, &xq);
            let got = dot(K, &w_row, &xq) as f64;
            assert!(
                (got - exact).abs() <= 1e-5 * mag,
                "{ty}: kernel {got} vs dequantized product {exact} (Σ|wx| {mag})"
            );
        }
    }
}

/// `Σ m (s - d Σ q)` over blocks: what a min-carrying weight (Q4_1, Q5_1,
/// whose f16 `m` follows `d`) picks up from `s`'s f16 rounding against Q8_1
/// activations; 0 for every other pairing.
fn q8_1_s_rounding(ty: GgmlType, act: ActType, w_row: &[u8], xq: &[u8]) -> f64 {
    if act != ActType::Q8_1 {
        return 0.0;
    }
    let h = |b: &[u8], at: usize| f16::from_le_bytes([b[at], b[at + 1]]).to_f32() as f64;
    w_row
        .chunks_exact(ty.type_size())
        .zip(xq.chunks_exact(36))
        .map(|(w, y)| {
            let sum: i32 = y[4..].iter().map(|&q| q as i8 as i32).sum();
            h(w, 2) * (h(y, 2) - h(y, 0) * sum as f64)
        })
        .sum()
}

/// Budget for the error of a kernel's result against the f64 product of the
/// dequantized weights with the original (unquantized) f32 activations,
/// relative to that sum. The weights enter exactly, so the error is the
/// activation quantization (plus f32 rounding) and depends mainly on the
/// activation type.
///
/// Measured worst case over 24 rows of 4096 (activations 0.25 w / rms(w) +
/// N(0, 1), so the sum is well away from zero), budget about 3x that:
///
/// | weight                      | act  | measured      | budget |
/// |-----------------------------|------|---------------|--------|
/// | F32                         | F32  | 2.3e-7        | 2e-6   |
/// | F16                         | F16  | 2.8e-5        | 1e-4   |
/// | BF16                        | BF16 | 3.2e-4        | 1e-3   |
/// | Q4_0 Q5_0 Q8_0              | Q8_0 | 5.0e-4..7.9e-4| 2.5e-3 |
/// | Q4_1 Q5_1                   | Q8_1 | 5.1e-4..7.8e-4| 2.5e-3 |
/// | IQ4_NL                      | Q8_0 | 7.8e-4        | 2.5e-3 |
/// | Q2_K Q3_K Q4_K Q5_K Q6_K    | Q8_K | 8.3e-4..9.8e-4| 3e-3   |
/// | IQ4_XS                      | Q8_K | 1.1e-3        | 3.5e-3 |
/// | Q8_K                        | Q8_K | 1.3e-3        | 4e-3   |
fn budget(w: GgmlType) -> f64 {
    use GgmlType::*;
    match w {
        F32 => 2e-6,
        F16 => 1e-4,
        BF16 => 1e-3,
        Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | IQ4_NL => 2.5e-3,
        Q2_K | Q3_K | Q4_K | Q5_K | Q6_K => 3e-3,
        IQ4_XS => 3.5e-3,
        Q8_K => 4e-3,
        _ => unreachable!(),
    }
}

#[test]
fn dot_products_within_budget_of_f32_product() {
    for ty in SUPPORTED {
        let act = activation_type(ty);
        let dot = dot_fn(ty).unwrap();
        let mut rng = Rng::new(2000 + ty.id() as u64);
        let mut worst = 0.0f64;
        for _ in 0..ROWS {
            let w_row = random_row(ty, K, &mut rng);
            let w = dequant(ty, &w_row, K);
            let x = activations(&w, &mut rng);
            let (reference, _) = dot64(&w, &x);
            let got = dot(K, &w_row, &quantized(act, &x)) as f64;
            worst = worst.max((got - reference).abs() / reference.abs());
        }
        eprintln!(
            "{ty:>6} x {:<4}: worst relative error {worst:.2e}",
            act.name()
        );
        assert!(
            worst <= budget(ty),
            "{ty}: relative error {worst:e} over budget {:e}",
            budget(ty)
        );
    }
}

/// Every kernel `dot_fn` picks (SIMD where available) equals its scalar twin
/// up to f32 summation order: within 1e-5 of Σ |w x|.
#[test]
fn best_kernels_match_scalar() {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
    {
        assert!(["avx2", "avx512vnni", "avx512bf16"].contains(&simd_level()), "{}", simd_level());
    }
    eprintln!("kernels: {}", simd_level());
    for ty in SUPPORTED {
        let act = activation_type(ty);
        let (best, scalar) = (dot_fn(ty).unwrap(), scalar_dot_fn(ty).unwrap());
        let mut rng = Rng::new(3000 + ty.id() as u64);
        let bs = ty.block_size().max(act.block_size()).max(32);
        // Several lengths, including odd block counts.
        for k in [bs, 3 * bs, 7 * bs, K] {
            for _ in 0..8 {
                let w_row = random_row(ty, k, &mut rng);
                let w = dequant(ty, &w_row, k);
                let xq = quantized(act, &rng.normals(k, 1.0));
                let (_, mag) = dot64(&w, &act_dequant(act, &xq, k));
                let (b, s) = (best(k, &w_row, &xq), scalar(k, &w_row, &xq));
                assert!(
                    ((b - s) as f64).abs() <= 1e-5 * mag,
                    "{ty} k={k}: best {b} vs scalar {s} (Σ|wx| {mag})"
                );
            }
        }
    }
}

#[test]
fn vec_dot_dispatches_like_dot_fn() {
    let mut rng = Rng::new(4);
    for ty in SUPPORTED {
        let act = activation_type(ty);
        let w_row = random_row(ty, 512, &mut rng);
        let xq = quantized(act, &rng.normals(512, 1.0));
        assert_eq!(act_row_bytes(act, 512), Some(xq.len()));
        let a = vec_dot(ty, &w_row, &xq, 512);
        let b = dot_fn(ty).unwrap()(512, &w_row, &xq);
        assert_eq!(a.to_bits(), b.to_bits(), "{ty}");
    }
}

#[test]
fn zero_activations_give_zero() {
    let mut rng = Rng::new(5);
    for ty in SUPPORTED {
        let act = activation_type(ty);
        let w_row = random_row(ty, 512, &mut rng);
        let xq = quantized(act, &[0.0; 512]);
        assert_eq!(dot_fn(ty).unwrap()(512, &w_row, &xq), 0.0, "{ty}");
        assert_eq!(scalar_dot_fn(ty).unwrap()(512, &w_row, &xq), 0.0, "{ty}");
    }
}

#[test]
fn types_without_kernels_report_none() {
    for ty in [
        GgmlType::Q8_1,
        GgmlType::IQ2_XXS,
        GgmlType::I32,
        GgmlType::MXFP4,
    ] {
        assert!(dot_fn(ty).is_none(), "{ty}");
        assert_eq!(activation_type(ty), ActType::F32);
    }
}

/// Multi-column kernels give each column exactly the single-column kernel's
/// result (bit for bit), whatever the number of columns and their stride.
#[test]
fn column_kernels_equal_single_column_kernels() {
    use ember_quant::{dot_cols_fn, MAX_DOT_COLS};
    let mut rng = Rng::new(77);
    for &ty in SUPPORTED.iter() {
        let Some(cols) = dot_cols_fn(ty) else { continue };
        let dot = dot_fn(ty).unwrap();
        let act = activation_type(ty);
        for k in [256, 512, 2048] {
            let w = random_row(ty, k, &mut rng);
            let arb = act_row_bytes(act, k).unwrap();
            let stride = arb + 7;
            let mut acts = vec![0u8; stride * MAX_DOT_COLS];
            for j in 0..MAX_DOT_COLS {
                let x = rng.normals(k, 1.0);
                acts[j * stride..j * stride + arb].copy_from_slice(&quantized(act, &x));
            }
            for n in 1..=MAX_DOT_COLS {
                let mut out = [f32::NAN; MAX_DOT_COLS];
                cols(k, &w, &acts, stride, n, &mut out);
                for j in 0..n {
                    let want = dot(k, &w, &acts[j * stride..j * stride + arb]);
                    assert_eq!(out[j].to_bits(), want.to_bits(), "{ty} k={k} n={n} col {j}");
                }
                assert!(out[n..].iter().all(|v| v.is_nan()));
            }
        }
    }
}
