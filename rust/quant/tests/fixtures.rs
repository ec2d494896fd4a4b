//! ember's dequantizers and activation quantizers against values computed
//! independently by the `gguf` Python package (see `make_fixtures.py`).

use std::path::PathBuf;

use ember_gguf::GgmlType;
use ember_quant::{
    dequantize_row, quantize_activation, quantize_row_q8_0, quantize_row_q8_K, ActType,
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
    quantize_row_q8_0(&x, &mut got).unwrap();
    assert_eq!(got, expected);
    let mut via_act = Vec::new();
    quantize_activation(ActType::Q8_0, &x, &mut via_act).unwrap();
    assert_eq!(via_act, expected);
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
