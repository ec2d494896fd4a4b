//! Row dequantization for every supported type: one checked entry point that
//! turns a row of on-disk bytes into f32.

use ember_gguf::GgmlType;

use crate::blocks::{as_blocks, float, iq, k_quants, legacy};
use crate::QuantError;

/// Whether [`dequantize_row`] handles `ty`.
pub fn can_dequantize(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(
        ty,
        F32 | F16
            | BF16
            | Q4_0
            | Q4_1
            | Q5_0
            | Q5_1
            | Q8_0
            | Q2_K
            | Q3_K
            | Q4_K
            | Q5_K
            | Q6_K
            | Q8_K
            | IQ4_NL
            | IQ4_XS
    )
}

/// Decodes one row of `ty` from `src` into `dst`; the row's element count is
/// `dst.len()`, which must be a whole number of blocks, and `src` must hold
/// exactly that many elements' bytes.
pub fn dequantize_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    if !can_dequantize(ty) {
        return Err(QuantError::Unsupported {
            ty,
            op: "dequantizer",
        });
    }
    let n = dst.len();
    let bs = ty.block_size();
    if !n.is_multiple_of(bs) {
        return Err(QuantError::NotBlockMultiple {
            format: ty.name(),
            n,
            block: bs,
        });
    }
    let expected = n / bs * ty.type_size();
    if src.len() != expected {
        return Err(QuantError::Length {
            format: ty.name(),
            what: "source row",
            expected,
            got: src.len(),
        });
    }
    use GgmlType::*;
    match ty {
        F32 => float::dequantize_f32(src, dst),
        F16 => float::dequantize_f16(src, dst),
        BF16 => float::dequantize_bf16(src, dst),
        Q4_0 => legacy::dequantize_q4_0(as_blocks(src), dst),
        Q4_1 => legacy::dequantize_q4_1(as_blocks(src), dst),
        Q5_0 => legacy::dequantize_q5_0(as_blocks(src), dst),
        Q5_1 => legacy::dequantize_q5_1(as_blocks(src), dst),
        Q8_0 => legacy::dequantize_q8_0(as_blocks(src), dst),
        Q2_K => k_quants::dequantize_q2_k(as_blocks(src), dst),
        Q3_K => k_quants::dequantize_q3_k(as_blocks(src), dst),
        Q4_K => k_quants::dequantize_q4_k(as_blocks(src), dst),
        Q5_K => k_quants::dequantize_q5_k(as_blocks(src), dst),
        Q6_K => k_quants::dequantize_q6_k(as_blocks(src), dst),
        Q8_K => k_quants::dequantize_q8_k(as_blocks(src), dst),
        IQ4_NL => iq::dequantize_iq4_nl(as_blocks(src), dst),
        IQ4_XS => iq::dequantize_iq4_xs(as_blocks(src), dst),
        _ => unreachable!("can_dequantize admitted {ty}"),
    }
    Ok(())
}
