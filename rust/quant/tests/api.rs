//! Quantizer round trips, the activation-type table, layout sizes, and the
//! error paths: bad lengths and unsupported types are errors, not panics.

mod common;

use common::{Rng, SUPPORTED};
use ember_gguf::GgmlType;
use ember_quant::blocks::{self, k_quants};
use ember_quant::{
    act_row_bytes, activation_type, can_dequantize, dequantize_row, dot_fn, quantize_activation,
    quantize_row_q8_0, quantize_row_q8_0_ref, quantize_row_q8_1, quantize_row_q8_1_ref,
    quantize_row_q8_K, scalar_dot_fn, ActType, QuantError,
};
use half::f16;

#[test]
fn q8_0_round_trip() {
    let mut rng = Rng::new(7);
    let mut x = rng.normals(32 * 64, 1.0);
    x[..32].fill(0.0);
    x[32..64].iter_mut().for_each(|v| *v *= 1e4);
    let mut q = vec![0u8; act_row_bytes(ActType::Q8_0, x.len()).unwrap()];
    quantize_row_q8_0(&x, &mut q).unwrap();
    let mut y = vec![0.0; x.len()];
    dequantize_row(GgmlType::Q8_0, &q, &mut y).unwrap();
    for (b, (xb, yb)) in x.chunks(32).zip(y.chunks(32)).enumerate() {
        let block = &q[34 * b..34 * b + 34];
        let d = f16::from_le_bytes([block[0], block[1]]).to_f32();
        let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let qs: Vec<i8> = block[2..].iter().map(|&v| v as i8).collect();
        assert!(
            qs.iter().all(|&v| v > -128),
            "block {b}: -128 is never produced"
        );
        if amax == 0.0 {
            assert_eq!(d, 0.0);
            assert!(yb.iter().all(|&v| v == 0.0));
            continue;
        }
        // Rounding to the step, plus the f16 rounding of the step itself
        // (relative 2^-11) carried by up to 127 steps.
        let bound = 0.5 * d + 127.0 * d * 2f32.powi(-11) * 1.01;
        for (i, (&a, &r)) in xb.iter().zip(yb).enumerate() {
            assert!(
                (a - r).abs() <= bound,
                "block {b} elem {i}: {a} -> {r}, step {d}"
            );
        }
        assert!(
            qs.iter().any(|&v| v.abs() == 127),
            "block {b}: the largest maps to ±127"
        );
    }
}

#[test]
fn q8_k_round_trip() {
    let mut rng = Rng::new(8);
    let mut x = rng.normals(256 * 16, 1.0);
    x[..256].fill(0.0);
    x[300] = 50.0; // positive extreme: d comes out negative
    x[700] = -50.0; // negative extreme: d positive
    let mut q = vec![0u8; act_row_bytes(ActType::Q8_K, x.len()).unwrap()];
    quantize_row_q8_K(&x, &mut q).unwrap();
    let mut y = vec![0.0; x.len()];
    dequantize_row(GgmlType::Q8_K, &q, &mut y).unwrap();
    for (b, (xb, yb)) in x.chunks(256).zip(y.chunks(256)).enumerate() {
        let block = &q[292 * b..292 * b + 292];
        let d = f32::from_le_bytes(block[..4].try_into().unwrap());
        let qs: Vec<i8> = block[4..260].iter().map(|&v| v as i8).collect();
        let bsums: Vec<i16> = block[260..]
            .chunks(2)
            .map(|s| i16::from_le_bytes([s[0], s[1]]))
            .collect();
        for (j, s) in bsums.iter().enumerate() {
            assert_eq!(
                *s,
                qs[16 * j..16 * j + 16]
                    .iter()
                    .map(|&v| v as i16)
                    .sum::<i16>()
            );
        }
        assert!(qs.iter().all(|&v| v > -128));
        let (imax, &max) = xb
            .iter()
            .enumerate()
            .fold((0, &0.0f32), |(bi, bv), (i, v)| {
                if v.abs() > bv.abs() {
                    (i, v)
                } else {
                    (bi, bv)
                }
            });
        if max == 0.0 {
            assert_eq!(d, 0.0);
            assert!(qs.iter().all(|&v| v == 0));
            continue;
        }
        // ggml's sign trick: the extreme element maps to exactly -127.
        assert_eq!(qs[imax], -127, "block {b}");
        assert_eq!(d.is_sign_negative(), max > 0.0, "block {b}");
        let step = d.abs();
        for (i, (&a, &r)) in xb.iter().zip(yb).enumerate() {
            assert!(
                (a - r).abs() <= 0.5 * step * 1.0001,
                "block {b} elem {i}: {a} -> {r}"
            );
        }
    }
}

#[test]
fn float_activations_round_like_ggml() {
    let tie_down = f32::from_bits(0x3f80_8000); // halfway between bf16 0x3f80 and 0x3f81
    let tie_up = f32::from_bits(0x3f81_8000); // halfway between 0x3f81 and 0x3f82
    let x = [1.0f32, -2.5, tie_down, 65504.0, tie_up, f32::NAN];
    let mut out = Vec::new();
    quantize_activation(ActType::BF16, &x, &mut out).unwrap();
    let bits: Vec<u16> = out
        .chunks(2)
        .map(|b| u16::from_le_bytes([b[0], b[1]]))
        .collect();
    assert_eq!(bits[0], 0x3f80);
    assert_eq!(bits[1], 0xc020);
    assert_eq!(bits[2], 0x3f80, "ties round to even");
    assert_eq!(bits[4], 0x3f82, "ties round to even");
    assert!(
        bits[5] & 0x7f80 == 0x7f80 && bits[5] & 0x7f != 0,
        "NaN stays NaN"
    );
    quantize_activation(ActType::F16, &x, &mut out).unwrap();
    assert_eq!(u16::from_le_bytes([out[6], out[7]]), f16::MAX.to_bits());
    quantize_activation(ActType::F32, &x[..2], &mut out).unwrap();
    assert_eq!(
        out,
        [1.0f32.to_le_bytes(), (-2.5f32).to_le_bytes()].concat()
    );
}

#[test]
fn activation_types_follow_ggml() {
    use GgmlType::*;
    for w in [Q4_0, Q5_0, Q8_0, IQ4_NL] {
        assert_eq!(activation_type(w), ActType::Q8_0, "{w}");
    }
    for w in [Q4_1, Q5_1] {
        assert_eq!(activation_type(w), ActType::Q8_1, "{w}");
    }
    for w in [Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K, IQ4_XS] {
        assert_eq!(activation_type(w), ActType::Q8_K, "{w}");
    }
    assert_eq!(activation_type(F32), ActType::F32);
    assert_eq!(activation_type(F16), ActType::F16);
    assert_eq!(activation_type(BF16), ActType::BF16);
    assert_eq!(act_row_bytes(ActType::Q8_0, 64), Some(68));
    assert_eq!(act_row_bytes(ActType::Q8_1, 64), Some(72));
    assert_eq!(act_row_bytes(ActType::Q8_1, 33), None);
    assert_eq!(ActType::Q8_1.name(), "Q8_1");
    assert_eq!(ActType::Q8_1.block_size(), 32);
    assert_eq!(ActType::Q8_1.type_size(), size_of::<blocks::BlockQ8_1>());
    assert_eq!(size_of::<blocks::BlockQ8_1>(), 36);
    assert_eq!(act_row_bytes(ActType::Q8_K, 512), Some(584));
    assert_eq!(act_row_bytes(ActType::F16, 3), Some(6));
    assert_eq!(act_row_bytes(ActType::F32, 3), Some(12));
    assert_eq!(act_row_bytes(ActType::Q8_0, 33), None);
    assert_eq!(act_row_bytes(ActType::Q8_K, 32), None);
    for ty in SUPPORTED {
        assert!(
            can_dequantize(ty) && dot_fn(ty).is_some() && scalar_dot_fn(ty).is_some(),
            "{ty}"
        );
    }
}

#[test]
fn block_structs_have_ggml_sizes() {
    use std::mem::size_of;
    let sizes = [
        (GgmlType::Q4_0, size_of::<blocks::BlockQ4_0>()),
        (GgmlType::Q4_1, size_of::<blocks::BlockQ4_1>()),
        (GgmlType::Q5_0, size_of::<blocks::BlockQ5_0>()),
        (GgmlType::Q5_1, size_of::<blocks::BlockQ5_1>()),
        (GgmlType::Q8_0, size_of::<blocks::BlockQ8_0>()),
        (GgmlType::Q2_K, size_of::<blocks::BlockQ2K>()),
        (GgmlType::Q3_K, size_of::<blocks::BlockQ3K>()),
        (GgmlType::Q4_K, size_of::<blocks::BlockQ4K>()),
        (GgmlType::Q5_K, size_of::<blocks::BlockQ5K>()),
        (GgmlType::Q6_K, size_of::<blocks::BlockQ6K>()),
        (GgmlType::Q8_K, size_of::<blocks::BlockQ8K>()),
        (GgmlType::IQ4_NL, size_of::<blocks::BlockIq4Nl>()),
        (GgmlType::IQ4_XS, size_of::<blocks::BlockIq4Xs>()),
    ];
    for (ty, size) in sizes {
        assert_eq!(size, ty.type_size(), "{ty}");
    }
}

#[test]
fn k4_scale_unpackings_agree() {
    let mut rng = Rng::new(9);
    for _ in 0..1000 {
        let q: [u8; 12] = rng.bytes(12).try_into().unwrap();
        let (sc, mn) = k_quants::k4_scales_mins(&q);
        for j in 0..8 {
            assert_eq!(
                k_quants::get_scale_min_k4(j, &q),
                (sc[j], mn[j]),
                "{q:?} j={j}"
            );
        }
        // Q3_K: scale i's low nibble is byte i % 8 (low half for i < 8), its
        // top two bits are bits 2 (i / 4 % 2)..: checked against the spec.
        let s3 = k_quants::q3k_scales(&q);
        for (i, &s) in s3.iter().enumerate() {
            let lo = if i < 8 { q[i] & 0xF } else { q[i - 8] >> 4 };
            let hi = (q[8 + i % 4] >> (2 * (i / 4))) & 3;
            assert_eq!(s, lo | (hi << 4), "{q:?} i={i}");
        }
    }
}

#[test]
fn dequantize_length_errors() {
    let mut dst = vec![0.0f32; 64];
    assert_eq!(
        dequantize_row(GgmlType::Q4_0, &[0u8; 35], &mut dst),
        Err(QuantError::Length {
            format: "Q4_0",
            what: "source row",
            expected: 36,
            got: 35
        })
    );
    assert_eq!(
        dequantize_row(GgmlType::Q4_K, &[0u8; 144], &mut dst),
        Err(QuantError::NotBlockMultiple {
            format: "Q4_K",
            n: 64,
            block: 256
        })
    );
    let mut odd = vec![0.0f32; 40];
    assert_eq!(
        dequantize_row(GgmlType::Q8_0, &[0u8; 34], &mut odd),
        Err(QuantError::NotBlockMultiple {
            format: "Q8_0",
            n: 40,
            block: 32
        })
    );
    assert!(dequantize_row(GgmlType::F16, &[0u8; 127], &mut dst).is_err());
    assert!(dequantize_row(GgmlType::F32, &[0u8; 256], &mut dst).is_ok());
}

#[test]
fn unsupported_types_are_named() {
    for ty in [
        GgmlType::IQ2_XXS,
        GgmlType::Q8_1,
        GgmlType::MXFP4,
        GgmlType::I8,
    ] {
        let err = dequantize_row(ty, &[], &mut []).unwrap_err();
        assert_eq!(
            err,
            QuantError::Unsupported {
                ty,
                op: "dequantizer"
            }
        );
        assert!(err.to_string().contains(ty.name()), "{err}");
    }
}

/// ggml's `quantize_row_q8_1_ref`, written out in f32 (the `gguf` Python
/// package has no Q8_1 quantizer to compare with).
fn q8_1_reference(x: &[f32]) -> Vec<u8> {
    let mut out = Vec::new();
    for xb in x.chunks_exact(32) {
        let mut amax = 0.0f32;
        for &v in xb {
            amax = if amax > v.abs() { amax } else { v.abs() };
        }
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut sum = 0i32;
        let qs: Vec<u8> = xb
            .iter()
            .map(|&v| {
                // C's roundf: halves away from zero (`r - t` is exact).
                let r = v * id;
                let t = r.trunc();
                let q = if (r - t).abs() >= 0.5 {
                    t + r.signum()
                } else {
                    t
                };
                sum += q as i32;
                q as i8 as u8
            })
            .collect();
        out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
        out.extend_from_slice(&f16::from_f32(sum as f32 * d).to_le_bytes());
        out.extend_from_slice(&qs);
    }
    out
}

#[test]
fn q8_1_quantizer_matches_ggml_reference() {
    let mut rng = Rng::new(9);
    let mut x = rng.normals(32 * 64, 1.0);
    x[..32].fill(0.0);
    x[32..64].iter_mut().for_each(|v| *v *= 1e4);
    // Exact ties: amax 127 makes id 1, so these land on .5 and must round away.
    for (j, v) in x[64..96].iter_mut().enumerate() {
        *v = if j == 0 {
            127.0
        } else {
            (j as f32 - 16.0) + 0.5
        };
    }
    let expected = q8_1_reference(&x);
    let mut got = vec![0u8; act_row_bytes(ActType::Q8_1, x.len()).unwrap()];
    quantize_row_q8_1_ref(&x, &mut got).unwrap();
    assert_eq!(got, expected);
    // The engine's variant (llama.cpp's x86 rounding) is what quantize_activation uses.
    let mut engine = vec![0u8; got.len()];
    quantize_row_q8_1(&x, &mut engine).unwrap();
    let mut via_act = Vec::new();
    quantize_activation(ActType::Q8_1, &x, &mut via_act).unwrap();
    assert_eq!(via_act, engine);
    // Same quants and scale as Q8_0; `s` is the scale times their sum.
    let mut q8_0 = vec![0u8; act_row_bytes(ActType::Q8_0, x.len()).unwrap()];
    quantize_row_q8_0_ref(&x, &mut q8_0).unwrap();
    for (b, (b1, b0)) in got.chunks(36).zip(q8_0.chunks(34)).enumerate() {
        assert_eq!(b1[..2], b0[..2], "block {b}: d");
        assert_eq!(b1[4..], b0[2..], "block {b}: qs");
        let d = f16::from_le_bytes([b1[0], b1[1]]).to_f32();
        let sum: i32 = b1[4..].iter().map(|&q| q as i8 as i32).sum();
        let s = f16::from_le_bytes([b1[2], b1[3]]).to_f32();
        // `s` is taken from the f32 scale, `d` as stored is its f16: each
        // rounding is relative 2^-11.
        let want = sum as f32 * d;
        if want.abs() > f16::MAX.to_f32() {
            // ggml's `s` overflows to ±inf here too (the 1e4 block).
            assert!(
                s.is_infinite() && s.signum() == want.signum(),
                "block {b}: s {s}"
            );
            continue;
        }
        assert!(
            (s - want).abs() <= want.abs() * 2f32.powi(-10),
            "block {b}: s {s} vs {want}"
        );
    }
    let tie = &got[2 * 36 + 4..3 * 36];
    assert_eq!(tie[1] as i8, -15, "-14.5 rounds away from zero");
    assert_eq!(tie[31] as i8, 16, "15.5 rounds away from zero");
}

#[test]
fn quantize_length_errors() {
    let x = [0.5f32; 64];
    let mut out = vec![0u8; 68];
    assert!(quantize_row_q8_0(&x, &mut out).is_ok());
    assert!(matches!(
        quantize_row_q8_0(&x, &mut out[..67]),
        Err(QuantError::Length {
            expected: 68,
            got: 67,
            ..
        })
    ));
    assert!(matches!(
        quantize_row_q8_0(&x[..40], &mut out),
        Err(QuantError::NotBlockMultiple {
            n: 40,
            block: 32,
            ..
        })
    ));
    assert!(matches!(
        quantize_row_q8_K(&x, &mut out),
        Err(QuantError::NotBlockMultiple {
            n: 64,
            block: 256,
            ..
        })
    ));
    let x = [0.5f32; 256];
    let mut out = vec![0u8; 293];
    assert!(matches!(
        quantize_row_q8_K(&x, &mut out),
        Err(QuantError::Length {
            expected: 292,
            got: 293,
            ..
        })
    ));
    let mut v = Vec::new();
    assert!(matches!(
        quantize_row_q8_1(&x[..64], &mut out[..71]),
        Err(QuantError::Length {
            expected: 72,
            got: 71,
            ..
        })
    ));
    assert!(matches!(
        quantize_row_q8_1(&x[..40], &mut out[..72]),
        Err(QuantError::NotBlockMultiple {
            n: 40,
            block: 32,
            ..
        })
    ));
    for act in [ActType::Q8_0, ActType::Q8_1, ActType::Q8_K] {
        assert!(
            quantize_activation(act, &x[..100], &mut v).is_err(),
            "{act:?}"
        );
    }
    assert!(quantize_activation(ActType::F16, &x[..100], &mut v).is_ok());
    assert_eq!(v.len(), 200);
}

/// `GgmlType::f16_scale_offsets` names every f16 scale a format holds: a
/// block of 0xff bytes (each f16 there NaN) dequantizes to finite values once
/// those offsets hold 1.0, and not before. Writers of random blocks rely on it.
#[test]
fn the_f16_scale_offsets_are_every_scale_of_the_block() {
    for id in 0..64 {
        let Some(ty) = GgmlType::from_id(id) else { continue };
        let offsets = ty.f16_scale_offsets();
        if offsets.is_empty() || !can_dequantize(ty) {
            continue;
        }
        let mut block = vec![0xffu8; ty.type_size()];
        let mut out = vec![0f32; ty.block_size()];
        dequantize_row(ty, &block, &mut out).unwrap();
        assert!(out.iter().any(|v| !v.is_finite()), "{ty}: NaN scales gave finite values");
        for &at in offsets {
            block[at..at + 2].copy_from_slice(&f16::from_f32(1.0).to_le_bytes());
        }
        dequantize_row(ty, &block, &mut out).unwrap();
        assert!(out.iter().all(|v| v.is_finite()), "{ty}: a scale outside {offsets:?} is still NaN");
    }
}
