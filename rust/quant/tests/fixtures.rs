//! ember's dequantizers and activation quantizers against values computed
//! independently by the `gguf` Python package (see `make_fixtures.py`).

use std::path::PathBuf;

use ember_gguf::GgmlType;
use ember_quant::{
    dequantize_row, quantize_activation, quantize_row_q8_0, quantize_row_q8_0_ref,
    quantize_row_q8_K, ActType,
};

fn fixture(name: &str, ext: &str) -> Vec<u8> {
    let path: PathBuf = [
        env!("CARGO_MANIFEST_DIR"),
        "tests",
        "fixtures",
        &format!("{name}.{ext}"),
    ]
    .iter()
    .collect();
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn floats(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

#[test]
fn dequantizers_match_gguf_python() {
    use GgmlType::*;
    for ty in [
        F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K, IQ4_NL,
        IQ4_XS,
    ] {
        let name = ty.name().to_lowercase();
        let src = fixture(&name, "bin");
        let expected = floats(&fixture(&name, "f32"));
        assert_eq!(
            Some(src.len() as u64),
            ty.row_bytes(expected.len() as u64),
            "{ty} fixture size"
        );
        let mut got = vec![f32::NAN; expected.len()];
        dequantize_row(ty, &src, &mut got).unwrap();
        let mut inexact = 0;
        for (i, (&g, &e)) in got.iter().zip(&expected).enumerate() {
            if g.to_bits() != e.to_bits() {
                inexact += 1;
                assert!(
                    (g - e).abs() <= 1e-6 * e.abs(),
                    "{ty} element {i}: got {g:e}, expected {e:e}"
                );
            }
        }
        // Same formula, same f32 operation order: expect bit equality.
        assert_eq!(inexact, 0, "{ty}: {inexact} values equal only within 1e-6");
    }
}

#[test]
fn q8_0_quantizer_is_bit_exact_with_ggml_reference() {
    let x = floats(&fixture("q8_0_act", "f32"));
    let expected = fixture("q8_0_act", "bin");
    let mut got = vec![0u8; expected.len()];
    quantize_row_q8_0_ref(&x, &mut got).unwrap();
    assert_eq!(got, expected);
}

/// The engine's quantizer follows llama.cpp's x86 path (`127/amax`, halves to
/// even): it may differ from the reference by one step in a near-tie element,
/// never more, and `quantize_activation` is that quantizer.
#[test]
fn q8_0_engine_quantizer_is_within_one_step_of_the_reference() {
    let x = floats(&fixture("q8_0_act", "f32"));
    let expected = fixture("q8_0_act", "bin");
    let mut got = vec![0u8; expected.len()];
    quantize_row_q8_0(&x, &mut got).unwrap();
    let mut differing = 0;
    for (g, e) in got.chunks_exact(34).zip(expected.chunks_exact(34)) {
        assert_eq!(g[..2], e[..2], "the scale is the same");
        for (&a, &b) in g[2..].iter().zip(&e[2..]) {
            let step = (a as i8 as i32 - b as i8 as i32).abs();
            assert!(step <= 1);
            differing += step as usize;
        }
    }
    // The fixture holds deliberate exact ties, so a few percent differ here; on real activations far fewer do.
    assert!(
        differing * 20 <= x.len(),
        "{differing} of {} quants differ",
        x.len()
    );
    let mut via_act = Vec::new();
    quantize_activation(ActType::Q8_0, &x, &mut via_act).unwrap();
    assert_eq!(via_act, got);
    // Exact ties: the reference rounds 2.5 away from zero, the x86 path to even.
    let mut tie = vec![0.0f32; 32];
    tie[0] = 127.0;
    tie[1] = 2.5;
    tie[2] = -3.5;
    let (mut r, mut e) = (vec![0u8; 34], vec![0u8; 34]);
    quantize_row_q8_0_ref(&tie, &mut r).unwrap();
    quantize_row_q8_0(&tie, &mut e).unwrap();
    assert_eq!((r[3] as i8, r[4] as i8), (3, -4));
    assert_eq!((e[3] as i8, e[4] as i8), (2, -4));
}

#[test]
fn q8_k_quantizer_is_bit_exact_with_ggml_reference() {
    let x = floats(&fixture("q8_k_act", "f32"));
    let expected = fixture("q8_k_act", "bin");
    let mut got = vec![0u8; expected.len()];
    quantize_row_q8_K(&x, &mut got).unwrap();
    for (b, (g, e)) in got
        .chunks_exact(292)
        .zip(expected.chunks_exact(292))
        .enumerate()
    {
        assert_eq!(g, e, "Q8_K block {b}");
    }
    let mut via_act = Vec::new();
    quantize_activation(ActType::Q8_K, &x, &mut via_act).unwrap();
    assert_eq!(via_act, expected);
}
