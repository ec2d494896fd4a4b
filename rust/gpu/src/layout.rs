//! How a weight matrix's rows lie on the device. WGSL reads storage a word
//! at a time, so a read of four bytes that straddles two words costs two
//! loads and a join, and a decoded token's products are mostly such reads.
//! Formats whose blocks are whole words lie as the file has them. The six
//! whose blocks are two bytes past whole words (one f16 scale beside words
//! of quants: Q4_0, Q5_0, Q8_0 and IQ4_NL lead with it, Q3_K and Q6_K end
//! with it) keep each row's scales together at the row's head, padded to a
//! word, and then its blocks without them: every block starts on a word,
//! and no read the kernels make straddles two (`block_bytes_at` in
//! `matmul_common.wgsl`). The bytes are the file's, moved, not converted.

use std::borrow::Cow;

use ember_gguf::GgmlType;

/// Where the f16 scale of `ty`'s block lies in the file, for the formats
/// whose scales the device keeps apart.
fn scale_apart(ty: GgmlType) -> Option<usize> {
    match ty.f16_scale_offsets() {
        &[at] if ty.type_size() % 4 == 2 => Some(at),
        _ => None,
    }
}

/// Bytes of a block's scale that lie apart on the device (the kernels'
/// SCALE_APART): 2 or 0.
pub(crate) fn scale_bytes_apart(ty: GgmlType) -> usize {
    if scale_apart(ty).is_some() {
        2
    } else {
        0
    }
}

/// Bytes of padding after a row's scales set apart, up to a word.
fn padding_after_scales(ty: GgmlType, cols: usize) -> usize {
    let scales = cols / ty.block_size() * scale_bytes_apart(ty);
    scales.next_multiple_of(4) - scales
}

/// Bytes a row of `cols` (whole blocks) takes on the device.
pub(crate) fn row_bytes(ty: GgmlType, cols: usize) -> usize {
    let padding = padding_after_scales(ty, cols);
    ty.row_bytes(cols as u64).expect("whole blocks") as usize + padding
}

/// Rows of `cols` in the file's bytes, laid out as the device reads them.
pub(crate) fn device_rows(ty: GgmlType, cols: usize, file: &[u8]) -> Cow<'_, [u8]> {
    let Some(at) = scale_apart(ty) else {
        return Cow::Borrowed(file);
    };
    let file_row = ty.row_bytes(cols as u64).expect("whole blocks") as usize;
    let padding = padding_after_scales(ty, cols);
    let mut out = Vec::with_capacity(file.len() / file_row * row_bytes(ty, cols));
    for row in file.chunks_exact(file_row) {
        let blocks = || row.chunks_exact(ty.type_size());
        blocks().for_each(|b| out.extend_from_slice(&b[at..at + 2]));
        out.resize(out.len() + padding, 0);
        for b in blocks() {
            out.extend_from_slice(&b[..at]);
            out.extend_from_slice(&b[at + 2..]);
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_formats_two_bytes_past_words_keep_their_scales_apart() {
        use GgmlType::*;
        let apart: Vec<GgmlType> =
            [F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS].into_iter().filter(|&t| scale_apart(t).is_some()).collect();
        assert_eq!(apart, [Q4_0, Q5_0, Q8_0, IQ4_NL, Q3_K, Q6_K]);
        // Three Q4_0 blocks a row: 6 bytes of scales padded to 8, then 3 x 16.
        assert_eq!(row_bytes(Q4_0, 96), 8 + 48);
        assert_eq!(row_bytes(Q6_K, 512), 4 + 2 * 208);
        assert_eq!(row_bytes(Q4_K, 512), 2 * 144);
        let file: Vec<u8> = (0..2 * 3 * 18).map(|i| i as u8).collect();
        let rows = device_rows(Q4_0, 96, &file);
        assert_eq!(rows.len(), 2 * 56);
        let (first, second) = rows.split_at(56);
        assert_eq!(first[..8], [0, 1, 18, 19, 36, 37, 0, 0]);
        assert_eq!(first[8..24], file[2..18]);
        assert_eq!(first[40..56], file[38..54]);
        assert_eq!(second[..6], [54, 55, 72, 73, 90, 91]);
        // Q6_K's scale is its last two bytes.
        let file: Vec<u8> = (0..210).map(|i| i as u8).collect();
        let rows = device_rows(Q6_K, 256, &file);
        assert_eq!(rows[..2], [208, 209]);
        assert_eq!(rows[4..], file[..208]);
        assert!(matches!(device_rows(Q4_K, 256, &[0; 144]), Cow::Borrowed(_)));
    }
}
