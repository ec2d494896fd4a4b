//! Dot-product kernels and their dispatch: the scalar reference set, the
//! SIMD variants, and the one-time choice between them for this CPU.

pub mod scalar;
pub mod tile;
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86;

use std::sync::OnceLock;

use ember_gguf::GgmlType;

use crate::packed::PackedFormat;
use crate::quantize::{act_row_bytes, activation_type};
use tile::TileFn;

/// A dot-product kernel: `k` elements of a weight row (in the weight type's
/// on-disk format) against an activation row in the format
/// [`activation_type`] names for that weight type.
pub type DotFn = fn(k: usize, w_row: &[u8], act_row: &[u8]) -> f32;

/// A dot-product kernel over several activation columns: `out[j]` is
/// exactly what the [`DotFn`] of the same type gives for column `j` (at
/// `acts[j * act_stride..]`), for `j < n <= MAX_DOT_COLS`, with the weight
/// block's decoding shared by the columns.
pub type DotColsFn = fn(k: usize, w_row: &[u8], acts: &[u8], act_stride: usize, n: usize, out: &mut [f32]);

/// The most columns one [`DotColsFn`] call takes.
pub const MAX_DOT_COLS: usize = 4;

/// The multi-column kernel for `w` on this CPU, where there is one.
pub fn dot_cols_fn(w: GgmlType) -> Option<DotColsFn> {
    match level() {
        SimdLevel::Scalar => None,
        #[cfg(target_arch = "x86_64")]
        _ => x86::avx2::dot_cols_fn(w),
        #[cfg(not(target_arch = "x86_64"))]
        _ => None,
    }
}

/// The scalar reference kernel for `w`, or `None` when `w` has none.
pub fn scalar_dot_fn(w: GgmlType) -> Option<DotFn> {
    use GgmlType::*;
    Some(match w {
        F32 => scalar::vec_dot_f32_f32,
        F16 => scalar::vec_dot_f16_f16,
        BF16 => scalar::vec_dot_bf16_bf16,
        Q4_0 => scalar::vec_dot_q4_0_q8_0,
        Q4_1 => scalar::vec_dot_q4_1_q8_1,
        Q5_0 => scalar::vec_dot_q5_0_q8_0,
        Q5_1 => scalar::vec_dot_q5_1_q8_1,
        Q8_0 => scalar::vec_dot_q8_0_q8_0,
        IQ4_NL => scalar::vec_dot_iq4_nl_q8_0,
        Q2_K => scalar::vec_dot_q2_K_q8_K,
        Q3_K => scalar::vec_dot_q3_K_q8_K,
        Q4_K => scalar::vec_dot_q4_K_q8_K,
        Q5_K => scalar::vec_dot_q5_K_q8_K,
        Q6_K => scalar::vec_dot_q6_K_q8_K,
        Q8_K => scalar::vec_dot_q8_K_q8_K,
        IQ4_XS => scalar::vec_dot_iq4_xs_q8_K,
        _ => return None,
    })
}

/// An instruction set the kernels come in. Each level's kernels give the
/// scalar twins' results (the tile kernels bit for bit); a higher level
/// replaces only the kernels it has a faster form of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum SimdLevel {
    Scalar,
    /// AVX2 with FMA and F16C.
    Avx2,
    /// AVX2's kernels, with the tile kernels' byte products in AVX-512 VNNI
    /// (with AVX-512 F, BW and VL).
    Avx512Vnni,
    /// AVX-512 VNNI's kernels, with a bf16 cache's attention in AVX-512
    /// BF16's paired products.
    Avx512Bf16,
}

impl SimdLevel {
    pub fn name(self) -> &'static str {
        match self {
            SimdLevel::Scalar => "scalar",
            SimdLevel::Avx2 => "avx2",
            SimdLevel::Avx512Vnni => "avx512vnni",
            SimdLevel::Avx512Bf16 => "avx512bf16",
        }
    }

    /// Whether this CPU runs the level's kernels.
    pub fn runs_here(self) -> bool {
        match self {
            SimdLevel::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx2 => x86::avx2::available(),
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx512Vnni => x86::tile::vnni_available(),
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx512Bf16 => x86::tile::vnni_available() && is_x86_feature_detected!("avx512bf16"),
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// The levels this CPU runs, plainest first: what a test holds against
    /// the scalar twins.
    pub fn all_here() -> Vec<SimdLevel> {
        Self::ALL.into_iter().filter(|l| l.runs_here()).collect()
    }

    /// The SIMD levels this CPU runs whose matrix kernels are their own
    /// (AVX-512 BF16's are VNNI's): what a test or bench of those kernels
    /// measures once each.
    pub fn with_own_matrix_kernels_here() -> Vec<SimdLevel> {
        Self::all_here().into_iter().filter(|&l| l != SimdLevel::Scalar && l != SimdLevel::Avx512Bf16).collect()
    }

    const ALL: [SimdLevel; 4] = [SimdLevel::Scalar, SimdLevel::Avx2, SimdLevel::Avx512Vnni, SimdLevel::Avx512Bf16];

    pub fn parse(name: &str) -> Option<SimdLevel> {
        Self::ALL.into_iter().find(|l| l.name() == name)
    }
}

/// The level every SIMD choice in ember is made at, decided once: the highest
/// this CPU runs, or the one `EMBER_SIMD` names (`scalar`, `avx2`,
/// `avx512vnni`, `avx512bf16`), so a plainer path can be exercised on any machine. A
/// value that names no level, or one this CPU does not run, is an error,
/// never a silent choice of another.
pub fn checked_level() -> Result<SimdLevel, String> {
    static LEVEL: OnceLock<Result<SimdLevel, String>> = OnceLock::new();
    LEVEL
        .get_or_init(|| {
            let best = *SimdLevel::all_here().last().expect("scalar runs everywhere");
            let Some(asked) = std::env::var_os("EMBER_SIMD") else { return Ok(best) };
            let asked = asked.to_string_lossy().trim().to_ascii_lowercase();
            match SimdLevel::parse(&asked) {
                None => Err(format!("EMBER_SIMD={asked}: expected scalar, avx2, avx512vnni or avx512bf16")),
                Some(l) if !l.runs_here() => Err(format!("EMBER_SIMD={asked}: this CPU does not run it")),
                Some(l) => Ok(l),
            }
        })
        .clone()
}

/// [`checked_level`], for the kernels' choices (a model load checks it first,
/// so a bad `EMBER_SIMD` is refused there).
pub fn level() -> SimdLevel {
    checked_level().unwrap_or_else(|e| panic!("{e}"))
}

/// The fastest kernel for `w` on this CPU, or `None` when `w` has no dot
/// product. Fetch it once per matrix; calling it is then a plain indirect call.
pub fn dot_fn(w: GgmlType) -> Option<DotFn> {
    match level() {
        SimdLevel::Scalar => scalar_dot_fn(w),
        #[cfg(target_arch = "x86_64")]
        _ => x86::avx2::dot_fn(w).or_else(|| scalar_dot_fn(w)),
        #[cfg(not(target_arch = "x86_64"))]
        _ => scalar_dot_fn(w),
    }
}

/// The fastest tile kernel for a repacked format on this CPU.
pub fn tile_fn(fmt: PackedFormat) -> TileFn {
    tile_fn_at(level(), fmt).unwrap_or_else(|| tile::scalar_tile_fn(fmt))
}

/// The tile kernel for a repacked format at `level`, or `None` where this
/// CPU does not run that level.
pub fn tile_fn_at(level: SimdLevel, fmt: PackedFormat) -> Option<TileFn> {
    match level {
        SimdLevel::Scalar => Some(tile::scalar_tile_fn(fmt)),
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx2 => x86::tile::tile_fn(fmt, false),
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx512Vnni | SimdLevel::Avx512Bf16 => x86::tile::tile_fn(fmt, true),
        #[cfg(not(target_arch = "x86_64"))]
        _ => None,
    }
}

/// The unpacking and tile kernel over unpacked rows for a repacked format,
/// where this CPU has them and the format's quants are not bytes already.
pub fn unpacked_tile(fmt: PackedFormat) -> Option<tile::UnpackedTile> {
    unpacked_tile_at(level(), fmt)
}

/// [`unpacked_tile`] at `level`; `None` at the scalar level too, whose
/// kernels read the packed layout only.
pub fn unpacked_tile_at(level: SimdLevel, fmt: PackedFormat) -> Option<tile::UnpackedTile> {
    match level {
        SimdLevel::Scalar => None,
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx2 => x86::tile::unpacked_tile(fmt, false),
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx512Vnni | SimdLevel::Avx512Bf16 => x86::tile::unpacked_tile(fmt, true),
        #[cfg(not(target_arch = "x86_64"))]
        _ => None,
    }
}

/// Name of the level the kernels were chosen at ("avx512bf16",
/// "avx512vnni", "avx2" or "scalar"), for logs and benchmarks.
pub fn simd_level() -> &'static str {
    level().name()
}

/// Dot product of a `k`-element weight row of type `w` with an activation row
/// produced by [`quantize_activation`](crate::quantize_activation) for
/// [`activation_type`]`(w)`.
///
/// # Panics
/// When `w` has no kernel ([`dot_fn`] returns `None`) or a row is shorter
/// than `k` elements. Exact row lengths are checked in debug builds.
pub fn vec_dot(w: GgmlType, w_row: &[u8], act_row: &[u8], k: usize) -> f32 {
    debug_assert_eq!(Some(w_row.len() as u64), w.row_bytes(k as u64), "{w} weight row length");
    debug_assert_eq!(Some(act_row.len()), act_row_bytes(activation_type(w), k), "{w} activation row length");
    let f = dot_fn(w).unwrap_or_else(|| panic!("no dot product kernel for {w}"));
    f(k, w_row, act_row)
}
