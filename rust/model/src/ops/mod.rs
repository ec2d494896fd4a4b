//! Elementwise and per-row operations of the forward pass, on f32 rows.

use ember_kv::to_bf16;
use half::{bf16, f16};

use crate::config::RopeStyle;

/// `out = x / rms(x) * w`.
#[inline]
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let ss = sum_squares(x) / x.len() as f32;
    let scale = 1.0 / (ss + eps).sqrt();
    for ((o, &v), &g) in out.iter_mut().zip(x).zip(w) {
        *o = v * scale * g;
    }
}

/// RMS norm in place.
#[inline]
pub fn rms_norm_inplace(x: &mut [f32], w: &[f32], eps: f32) {
    let ss = sum_squares(x) / x.len() as f32;
    let scale = 1.0 / (ss + eps).sqrt();
    for (v, &g) in x.iter_mut().zip(w) {
        *v *= scale * g;
    }
}

/// RMS norm without a weight, in place (gemma4's values).
#[inline]
pub fn rms_norm_plain(x: &mut [f32], eps: f32) {
    let ss = sum_squares(x) / x.len() as f32;
    let scale = 1.0 / (ss + eps).sqrt();
    x.iter_mut().for_each(|v| *v *= scale);
}

/// RMS norm without a weight, `x` into `out` (gemma4's router input).
#[inline]
pub fn rms_norm_plain_into(x: &[f32], eps: f32, out: &mut [f32]) {
    let ss = sum_squares(x) / x.len() as f32;
    let scale = 1.0 / (ss + eps).sqrt();
    out.iter_mut().zip(x).for_each(|(o, v)| *o = v * scale);
}

/// SiLU by the library's `exp`: the definition [`silu_mul`] is held to.
#[cfg(test)]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

// The exponentials of SiLU and of the softmax, each in one arithmetic that
// the scalar form, the AVX2 form (eight lanes) and the AVX-512 form
// (sixteen) follow operation for operation, fused multiply-adds included,
// so they agree bit for bit: x = n ln2 + r with n = round(x log2 e) (halves
// to even), a polynomial in r, scaled by 2^n; inputs are clamped to where
// 2^n is a normal float.
//
// SiLU's ([`exp_fast`]) splits ln2 in two and takes a degree-6 polynomial
// (Cephes' expf coefficients): within a couple of ulp of exp. The softmax's
// ([`exp_softmax`]) takes ln2 whole and a degree-4 polynomial (minimax for
// the relative error on |r| <= ln2 / 2): within 6e-6 of exp, in three fewer
// multiply-adds of some ten. Its results are a softmax's numerators, which
// an f16 or bf16 cache rounds to 11 or 8 bits before they weigh a value,
// and which an f32 cache meets with values far less exact than that. Its
// inputs are scores less their maximum, never above 0, so it clamps them
// only from below (a NaN to the lower clamp, as in every form).
const EXP_HI: f32 = 88.376_26;
const EXP_LO: f32 = -87.336_54;
const LOG2E: f32 = std::f32::consts::LOG2_E;
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
const EXP_POLY: [f32; 6] = [1.987_569_1e-4, 1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 1.666_666_5e-1, 0.5];
const LN2: f32 = std::f32::consts::LN_2;
const SOFTMAX_POLY: [f32; 3] = [4.127_721_5e-2, 1.675_358_4e-1, 5.000_512_6e-1];

/// `exp(x)` in SiLU's arithmetic above, scalar form.
#[inline]
pub fn exp_fast(x: f32) -> f32 {
    exp_in::<false>(x)
}

/// `exp(x)` in the softmax's arithmetic above, scalar form, for `x <= 0`
/// (above, the forms may part where the result overflows).
#[inline]
pub fn exp_softmax(x: f32) -> f32 {
    exp_in::<true>(x)
}

#[inline(always)]
fn exp_in<const SOFTMAX: bool>(x: f32) -> f32 {
    let x = match SOFTMAX {
        true => x.max(EXP_LO),
        false => x.clamp(EXP_LO, EXP_HI),
    };
    let n = (x * LOG2E).round_ties_even();
    let (r, poly): (f32, &[f32]) = match SOFTMAX {
        true => (n.mul_add(-LN2, x), &SOFTMAX_POLY),
        false => (n.mul_add(-LN2_LO, n.mul_add(-LN2_HI, x)), &EXP_POLY),
    };
    let mut p = poly[0];
    for &c in &poly[1..] {
        p = p.mul_add(r, c);
    }
    let y = p.mul_add(r * r, r) + 1.0;
    y * f32::from_bits(((n as i32 + 127) << 23) as u32)
}

/// A softmax's numerators and their sum: `row[i] = exp(row[i] - shift)`
/// for every element (by [`exp_softmax`]: `shift` is at least every
/// element, a NaN aside), and the sum of the results, element `i` added into
/// lane `i % 16` in order, the lanes summed pairwise (lane `l` with `l + 8`,
/// then with `l + 4`, `l + 2` and `l + 1`). The sum is taken as the
/// exponentials are made, where a pass of its own would read the row again;
/// sixteen lanes of f32 fill one AVX-512 vector, so that an addition per
/// vector of exponentials is all it costs.
///
/// `next` is the row whose numerators are taken after these: its largest
/// element, the shift it needs, is read in the same loop, its loads hidden
/// under this row's arithmetic. Taken in a pass of its own, from the
/// second-level cache where a span's scores are, it was a quarter of the
/// softmax's time (a prompt's at depth, sixteen lanes).
pub fn exp_shifted_sum(row: &mut [f32], shift: f32, next: &[f32]) -> ExpSum {
    exp_shifted_sum_in::<false>(row, shift, next)
}

/// What the `exp_shifted_sum` forms return.
#[derive(Clone, Copy, Debug)]
pub struct ExpSum {
    /// The sum of the row's exponentials (those not rounded).
    pub sum: f32,
    /// The largest element of `next` (-inf for none; exact, NaNs aside).
    pub next_max: f32,
}

/// [`exp_shifted_sum`] with each exponential kept rounded to f16 (as
/// `f16::from_f32` rounds) and widened back: an f16 cache's weights, rounded
/// as they are made rather than in a pass of their own. The sum is that of
/// the unrounded exponentials.
pub fn exp_shifted_sum_f16(row: &mut [f32], shift: f32, next: &[f32]) -> ExpSum {
    exp_shifted_sum_in::<true>(row, shift, next)
}

fn exp_shifted_sum_in<const F16: bool>(row: &mut [f32], shift: f32, next: &[f32]) -> ExpSum {
    #[cfg(target_arch = "x86_64")]
    if avx512::available() {
        // SAFETY: the CPU has the features `avx512` needs.
        return unsafe { avx512::exp_shifted_sum::<F16>(row, shift, next) };
    }
    #[cfg(target_arch = "x86_64")]
    if avx2::available() {
        // SAFETY: the CPU has the features `avx` needs.
        return unsafe { avx2::exp_shifted_sum::<F16>(row, shift, next) };
    }
    ExpSum { sum: exp_shifted_sum_from::<F16>(row, shift, [0.0; 16]), next_max: max_of(next) }
}

/// [`exp_shifted_sum`] with each exponential rounded to bf16 (as
/// [`to_bf16`] rounds) into `out` rather than kept in `row`: a bf16 cache's
/// weights, laid out as the exponentials are made rather than read back.
/// The sum is that of the unrounded exponentials, as in [`exp_shifted_sum`].
pub fn exp_shifted_sum_bf16(row: &[f32], shift: f32, out: &mut [bf16], next: &[f32]) -> ExpSum {
    assert!(out.len() >= row.len(), "one bf16 per exponential");
    #[cfg(target_arch = "x86_64")]
    if avx512::bf16_available() {
        // SAFETY: the CPU has the features `avx512::exp_shifted_sum_bf16` needs.
        return unsafe { avx512::exp_shifted_sum_bf16(row, shift, out, next) };
    }
    ExpSum { sum: exp_shifted_sum_bf16_scalar(row, shift, out), next_max: max_of(next) }
}

/// [`exp_shifted_sum_bf16`] without SIMD.
pub fn exp_shifted_sum_bf16_scalar(row: &[f32], shift: f32, out: &mut [bf16]) -> f32 {
    let mut lanes = [0.0f32; 16];
    for (i, (&x, o)) in row.iter().zip(out).enumerate() {
        let e = exp_softmax(x - shift);
        lanes[i % 16] += e;
        *o = to_bf16(e);
    }
    sum_lanes(lanes)
}

/// The largest element of `row`, -inf for none (NaNs aside).
fn max_of(row: &[f32]) -> f32 {
    row.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x))
}

/// [`exp_shifted_sum`] without SIMD: the definition the vector forms are tested against.
#[cfg(test)]
pub fn exp_shifted_sum_scalar(row: &mut [f32], shift: f32) -> f32 {
    exp_shifted_sum_from::<false>(row, shift, [0.0; 16])
}

/// [`exp_shifted_sum_f16`] without SIMD.
#[cfg(test)]
pub fn exp_shifted_sum_f16_scalar(row: &mut [f32], shift: f32) -> f32 {
    exp_shifted_sum_from::<true>(row, shift, [0.0; 16])
}

/// [`exp_shifted_sum`] (`F16`: [`exp_shifted_sum_f16`]) of a row's last
/// elements, its first ones (a multiple of sixteen) already summed into `lanes`.
#[inline]
fn exp_shifted_sum_from<const F16: bool>(row: &mut [f32], shift: f32, mut lanes: [f32; 16]) -> f32 {
    for (i, x) in row.iter_mut().enumerate() {
        let e = exp_softmax(*x - shift);
        lanes[i % 16] += e;
        *x = match F16 {
            true => f16::from_f32(e).to_f32(),
            false => e,
        };
    }
    sum_lanes(lanes)
}

/// The sum of the squares of `x` (a norm's), element `i`'s square added
/// into lane `i % 16` in order and the lanes summed pairwise, as
/// [`exp_shifted_sum`] sums: the vector forms agree with it bit for bit.
/// One chain of additions, a latency each, was a few percent of a prompt.
pub fn sum_squares(x: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if avx512::available() {
        // SAFETY: the CPU has the features `avx512` needs.
        return unsafe { avx512::sum_squares(x) };
    }
    #[cfg(target_arch = "x86_64")]
    if avx2::available() {
        // SAFETY: the CPU has the features `avx2` needs.
        return unsafe { avx2::sum_squares(x) };
    }
    sum_squares_from(x, [0.0; 16])
}

/// [`sum_squares`] of a row's last elements, its first ones (a multiple of
/// sixteen) already summed into `lanes`.
#[inline]
fn sum_squares_from(x: &[f32], mut lanes: [f32; 16]) -> f32 {
    for (i, &v) in x.iter().enumerate() {
        lanes[i % 16] += v * v;
    }
    sum_lanes(lanes)
}

/// Sixteen lanes summed pairwise, as an AVX-512 vector is folded in halves.
#[inline]
fn sum_lanes(mut l: [f32; 16]) -> f32 {
    for half in [8, 4, 2, 1] {
        for i in 0..half {
            l[i] += l[i + half];
        }
    }
    l[0]
}

/// `out[i] = silu(g[i]) * u[i]`, with `silu(x) = x / (1 + exp(-x))` and the
/// exponential above.
pub fn silu_mul(out: &mut [f32], g: &[f32], u: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if avx2::available() {
        // SAFETY: the CPU has the features `avx` needs.
        return unsafe { avx2::silu_mul(out, g, u) };
    }
    silu_mul_scalar(out, g, u)
}

/// [`silu_mul`] without SIMD.
pub fn silu_mul_scalar(out: &mut [f32], g: &[f32], u: &[f32]) {
    for ((o, &g), &u) in out.iter_mut().zip(g).zip(u) {
        *o = g / (1.0 + exp_fast(-g)) * u;
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;

/// GELU, tanh approximation (as ggml's `gelu`).
#[inline]
pub fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    const COEF_A: f32 = 0.044_715;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + COEF_A * x * x)).tanh())
}

/// GELU as llama.cpp's CPU backend computes it: `x` rounded to f16 indexes a
/// table of [`gelu_tanh`] rounded to f16 (ggml's `GGML_GELU_FP16`), outside
/// ±10 the limits. The reference outputs carry this rounding, and a lookup
/// costs far less than a `tanh` per element of every feed-forward row.
#[inline]
pub fn gelu_table(x: f32) -> f32 {
    if x <= -10.0 {
        0.0
    } else if x >= 10.0 {
        x
    } else {
        f16::from_bits(gelu_f16_table()[f16::from_f32(x).to_bits() as usize]).to_f32()
    }
}

/// `out = gelu_table(g) * u`, eight at a time where the CPU converts to f16
/// in vectors (the per-element conversions cost more than the lookup).
pub fn gelu_mul(out: &mut [f32], g: &[f32], u: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if avx2::available() {
        // SAFETY: the CPU has the features `avx` and F16C need.
        return unsafe { avx2::gelu_mul(out, g, u, gelu_f16_table()) };
    }
    gelu_mul_scalar(out, g, u)
}

/// [`gelu_mul`] without SIMD.
pub fn gelu_mul_scalar(out: &mut [f32], g: &[f32], u: &[f32]) {
    for ((o, &g), &u) in out.iter_mut().zip(g).zip(u) {
        *o = gelu_table(g) * u;
    }
}

fn gelu_f16_table() -> &'static [u16] {
    static TABLE: std::sync::OnceLock<Vec<u16>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        (0..=u16::MAX).map(|i| f16::from_f32(gelu_tanh(f16::from_bits(i).to_f32())).to_bits()).collect()
    })
}

/// Inverse frequencies of rope: `base^(-2i/n_rot)` for each rotated pair.
pub fn rope_inv_freq(base: f32, n_rot: usize) -> Vec<f32> {
    (0..n_rot / 2).map(|i| (base as f64).powf(-2.0 * i as f64 / n_rot as f64) as f32).collect()
}

/// Fills `cos`/`sin` (length n_rot/2) for one position.
#[inline]
pub fn rope_angles(pos: usize, freq_scale: f32, inv_freq: &[f32], cos: &mut [f32], sin: &mut [f32]) {
    let p = pos as f32 * freq_scale;
    for ((c, s), &f) in cos.iter_mut().zip(sin.iter_mut()).zip(inv_freq) {
        let (sv, cv) = (p * f).sin_cos();
        *c = cv;
        *s = sv;
    }
}

/// Rotates the first `2 * cos.len()` dimensions of one head.
#[inline]
pub fn rope_apply(head: &mut [f32], style: RopeStyle, cos: &[f32], sin: &[f32]) {
    let half = cos.len();
    match style {
        RopeStyle::Adjacent => {
            for i in 0..half {
                let (a, b) = (head[2 * i], head[2 * i + 1]);
                head[2 * i] = a * cos[i] - b * sin[i];
                head[2 * i + 1] = a * sin[i] + b * cos[i];
            }
        }
        RopeStyle::Halves => {
            for i in 0..half {
                let (a, b) = (head[i], head[i + half]);
                head[i] = a * cos[i] - b * sin[i];
                head[i + half] = a * sin[i] + b * cos[i];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values from -100 to 100 with fine steps near 0 and halfway points of
    /// the range reduction.
    fn exp_inputs() -> Vec<f32> {
        let mut v: Vec<f32> = (-20_000..=20_000).map(|i| i as f32 * 0.005).collect();
        v.extend((-100..=100).map(|i| i as f32));
        v.extend((-60..60).map(|i| (i as f32 + 0.5) * std::f32::consts::LN_2));
        v.extend([0.0, -0.0, 1e-30, -1e-30, 88.0, 88.5, -87.0, -88.0, -1000.0, 1000.0]);
        // Near both clamps, where 2^n is at the ends of its range and the
        // result may be subnormal or the largest finite powers.
        for edge in [EXP_LO, EXP_HI] {
            v.extend((-2000..=2000).map(|i| edge + i as f32 * 2e-4));
        }
        v
    }

    #[test]
    fn exp_is_accurate_and_the_vector_form_equals_the_scalar() {
        let xs = exp_inputs();
        for &x in &xs {
            let want = (x.clamp(EXP_LO, EXP_HI) as f64).exp();
            let got = exp_fast(x);
            assert!(((got as f64 - want) / want).abs() < 4e-7, "exp({x}) = {got}, want {want}");
            if x <= 0.0 {
                let got = exp_softmax(x);
                assert!(((got as f64 - want) / want).abs() < 6e-6, "softmax's exp({x}) = {got}, want {want}");
            }
        }
        // The softmax's inputs: scores never above the shift (a NaN aside).
        let mut scores: Vec<f32> = xs.iter().map(|x| -x.abs()).collect();
        scores.push(f32::NAN);
        // The rows read beside for their maxima: longer and shorter than the
        // row, ending in every lane, and none.
        let ahead: Vec<f32> = xs.iter().rev().map(|x| x * 0.5 - 3.0).collect();
        let next = |n: usize| &ahead[..(n * 7 + 5) % ahead.len().min(97)];
        let next_max = |n: usize| next(n).iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
        for shift in [0.0f32, 3.25, 7.5] {
            let mut b = scores.clone();
            let want = exp_shifted_sum_scalar(&mut b, shift);
            // The sum as its definition takes it, lane by lane.
            let mut l = [0.0f32; 16];
            b.iter().enumerate().for_each(|(i, &e)| l[i % 16] += e);
            let l: [f32; 8] = std::array::from_fn(|i| l[i] + l[i + 8]);
            let l: [f32; 4] = std::array::from_fn(|i| l[i] + l[i + 4]);
            assert_eq!(want.to_bits(), ((l[0] + l[2]) + (l[1] + l[3])).to_bits());
            for (i, (&x, &e)) in scores.iter().zip(&b).enumerate() {
                assert_eq!(e.to_bits(), exp_softmax(x - shift).to_bits(), "element {i}");
            }
            // Each vector form where the CPU has it, whatever level was
            // chosen, on lengths that end in every lane.
            #[cfg(target_arch = "x86_64")]
            for (name, form, here) in [
                ("avx2", avx2::exp_shifted_sum::<false> as unsafe fn(&mut [f32], f32, &[f32]) -> ExpSum, avx2::available()),
                ("avx512", avx512::exp_shifted_sum::<false>, avx512::available()),
                ("chosen", |r: &mut [f32], s, next: &[f32]| exp_shifted_sum(r, s, next), true),
            ] {
                for n in [scores.len(), scores.len() - 1, 47, 33, 16, 7, 0] {
                    if here {
                        let (mut a, mut b) = (scores[..n].to_vec(), scores[..n].to_vec());
                        let got = unsafe { form(&mut a, shift, next(n)) };
                        let want = exp_shifted_sum_scalar(&mut b, shift);
                        assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()), "{name} shift {shift}");
                        assert_eq!(got.sum.to_bits(), want.to_bits(), "{name} sum of {n}, shift {shift}");
                        assert_eq!(got.next_max, next_max(n), "{name}: the next row's maximum ({n})");
                    }
                }
            }
        }
        // Kept rounded to f16: the same sum, each exponential as `f16` rounds it.
        for shift in [0.0f32, 3.25] {
            for n in [scores.len(), scores.len() - 1, 47, 33, 16, 7, 0] {
                let mut exps = scores[..n].to_vec();
                let want = exp_shifted_sum_scalar(&mut exps, shift);
                let mut scalar = scores[..n].to_vec();
                let sum = exp_shifted_sum_f16_scalar(&mut scalar, shift);
                assert_eq!(sum.to_bits(), want.to_bits(), "sum of {n}");
                let rounded = |e: &f32| f16::from_f32(*e).to_f32().to_bits();
                assert!(scalar.iter().zip(&exps).all(|(r, e)| r.to_bits() == rounded(e)), "{n} rounded");
                #[cfg(target_arch = "x86_64")]
                for (name, form, here) in [
                    ("avx2", avx2::exp_shifted_sum::<true> as unsafe fn(&mut [f32], f32, &[f32]) -> ExpSum, avx2::available()),
                    ("avx512", avx512::exp_shifted_sum::<true>, avx512::available()),
                    ("chosen", |r: &mut [f32], s, next: &[f32]| exp_shifted_sum_f16(r, s, next), true),
                ] {
                    if here {
                        let mut vector = scores[..n].to_vec();
                        let got = unsafe { form(&mut vector, shift, next(n)) };
                        assert_eq!(got.sum.to_bits(), want.to_bits(), "{name}: sum of {n}");
                        assert_eq!(got.next_max, next_max(n), "{name}: the next row's maximum ({n})");
                        assert!(vector.iter().zip(&scalar).all(|(a, b)| a.to_bits() == b.to_bits()), "{name}: {n}");
                    }
                }
            }
        }
        // Rounded to bf16 as they are made: the same sum, each exponential as
        // `to_bf16` rounds it, nothing written past the row.
        for shift in [0.0f32, 3.25] {
            for n in [scores.len(), scores.len() - 1, 47, 33, 16, 7, 0] {
                let mut exps = scores[..n].to_vec();
                let want = exp_shifted_sum_scalar(&mut exps, shift);
                let mut scalar = vec![bf16::ZERO; n];
                let sum = exp_shifted_sum_bf16_scalar(&scores[..n], shift, &mut scalar);
                assert_eq!(sum.to_bits(), want.to_bits(), "sum of {n}");
                assert!(scalar.iter().zip(&exps).all(|(b, &e)| b.to_bits() == to_bf16(e).to_bits()), "{n} rounded");
                let mut chosen = vec![bf16::ONE; n + 1];
                let got = exp_shifted_sum_bf16(&scores[..n], shift, &mut chosen, next(n));
                assert_eq!(got.sum.to_bits(), want.to_bits(), "sum of {n}, as chosen");
                assert_eq!(got.next_max, next_max(n), "the next row's maximum ({n}), as chosen");
                assert!(chosen[..n].iter().zip(&scalar).all(|(a, b)| a.to_bits() == b.to_bits()), "{n} as chosen");
                assert_eq!(chosen[n], bf16::ONE, "past the row");
                #[cfg(target_arch = "x86_64")]
                if ember_quant::SimdLevel::Avx512Bf16.runs_here() {
                    let mut vector = vec![bf16::ONE; n + 1];
                    let got = unsafe { avx512::exp_shifted_sum_bf16(&scores[..n], shift, &mut vector, next(n + 1)) };
                    assert_eq!(got.sum.to_bits(), want.to_bits(), "sum of {n}, AVX-512 BF16");
                    assert_eq!(got.next_max, next_max(n + 1), "the next row's maximum ({n}), AVX-512 BF16");
                    assert!(vector[..n].iter().zip(&scalar).all(|(a, b)| a.to_bits() == b.to_bits()), "{n} converted");
                    assert_eq!(vector[n], bf16::ONE, "past the row, AVX-512 BF16");
                }
            }
        }
        let u: Vec<f32> = xs.iter().map(|x| 1.0 - x * 0.01).collect();
        let (mut a, mut b) = (vec![0.0; xs.len()], vec![0.0; xs.len()]);
        silu_mul(&mut a, &xs, &u);
        silu_mul_scalar(&mut b, &xs, &u);
        for ((x, y), g) in a.iter().zip(&b).zip(&xs) {
            assert_eq!(x.to_bits(), y.to_bits(), "silu at {g}");
        }
        for (&g, &y) in xs.iter().zip(&b).filter(|(g, _)| g.abs() < 80.0) {
            let u = 1.0 - g * 0.01;
            let want = silu(g) * u;
            assert!((y - want).abs() <= 1e-6 * want.abs().max(1e-30) + 1e-37, "silu({g}) * {u}: {y} vs {want}");
        }
    }

    #[test]
    fn rope_at_position_zero_is_identity_and_preserves_norm() {
        let inv = rope_inv_freq(10000.0, 8);
        let (mut c, mut s) = (vec![0.0; 4], vec![0.0; 4]);
        let x: Vec<f32> = (0..8).map(|i| i as f32 - 3.5).collect();
        for style in [RopeStyle::Adjacent, RopeStyle::Halves] {
            rope_angles(0, 1.0, &inv, &mut c, &mut s);
            let mut h = x.clone();
            rope_apply(&mut h, style, &c, &s);
            assert_eq!(h, x);
            rope_angles(17, 1.0, &inv, &mut c, &mut s);
            rope_apply(&mut h, style, &c, &s);
            let n0: f32 = x.iter().map(|v| v * v).sum();
            let n1: f32 = h.iter().map(|v| v * v).sum();
            assert!((n0 - n1).abs() < 1e-4);
        }
    }

    #[test]
    fn activations_match_their_definitions() {
        assert!((silu(1.0) - 0.731_058_6).abs() < 1e-6);
        assert!((gelu_tanh(1.0) - 0.841_192).abs() < 1e-5);
        assert_eq!(gelu_tanh(0.0), 0.0);
        // The table agrees with the formula to f16 precision, and keeps the limits.
        for x in [-9.99f32, -3.0, -0.5, 0.0, 0.3, 1.0, 2.5, 9.9] {
            assert!((gelu_table(x) - gelu_tanh(x)).abs() <= 2e-3 * (1.0 + x.abs()), "{x}");
        }
        assert_eq!((gelu_table(-10.0), gelu_table(12.0)), (0.0, 12.0));
    }

    /// The vector GELU rounds, looks up and clamps exactly as the scalar
    /// table does: every finite f16 value and the f32 halfway to the next
    /// one (the rounding ties), the limits, infinities, and a tail that is
    /// not a multiple of eight.
    #[test]
    fn gelu_mul_equals_its_scalar_twin() {
        let mut g: Vec<f32> = Vec::new();
        for h in (0..=u16::MAX).map(f16::from_bits).filter(|h| h.is_finite()) {
            let (x, next) = (h.to_f32(), f16::from_bits(h.to_bits().wrapping_add(1)).to_f32());
            g.push(x);
            if next.is_finite() {
                g.push((x + next) / 2.0);
            }
        }
        g.extend([-10.0, 10.0, -10.001, 9.999, 65504.0, 1e6, -1e6, f32::INFINITY, f32::NEG_INFINITY, 0.0, -0.0, 1e-8]);
        let u: Vec<f32> = (0..g.len()).map(|i| if i % 3 == 0 { -1.5 } else { 0.75 + i as f32 * 1e-5 }).collect();
        let (mut a, mut b) = (vec![0.0; g.len()], vec![0.0; g.len()]);
        gelu_mul(&mut a, &g, &u);
        gelu_mul_scalar(&mut b, &g, &u);
        for i in 0..g.len() {
            assert_eq!(a[i].to_bits(), b[i].to_bits(), "gelu({}) * {}: {} vs {}", g[i], u[i], a[i], b[i]);
        }
    }

    #[test]
    fn sum_squares_forms_agree_with_their_definition() {
        let x: Vec<f32> = (0..1000).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.173 + 1e-3 * i as f32).collect();
        for n in [x.len(), 999, 576, 47, 33, 17, 16, 15, 1, 0] {
            let x = &x[..n];
            // The definition, written out: lanes, then halves folded.
            let mut l = [0.0f32; 16];
            x.iter().enumerate().for_each(|(i, &v)| l[i % 16] += v * v);
            let l: [f32; 8] = std::array::from_fn(|i| l[i] + l[i + 8]);
            let l: [f32; 4] = std::array::from_fn(|i| l[i] + l[i + 4]);
            let want = (l[0] + l[2]) + (l[1] + l[3]);
            assert_eq!(sum_squares_from(x, [0.0; 16]).to_bits(), want.to_bits(), "scalar, {n}");
            assert_eq!(sum_squares(x).to_bits(), want.to_bits(), "chosen, {n}");
            #[cfg(target_arch = "x86_64")]
            for (name, form, here) in [
                ("avx2", avx2::sum_squares as unsafe fn(&[f32]) -> f32, avx2::available()),
                ("avx512", avx512::sum_squares, avx512::available()),
            ] {
                if here {
                    assert_eq!(unsafe { form(x) }.to_bits(), want.to_bits(), "{name}, {n}");
                }
            }
        }
    }

    #[test]
    fn rms_norm_normalises() {
        let x = [3.0, 4.0];
        let mut o = [0.0; 2];
        rms_norm(&x, &[1.0, 2.0], 0.0, &mut o);
        let r = (12.5f32).sqrt();
        assert!((o[0] - 3.0 / r).abs() < 1e-6 && (o[1] - 8.0 / r).abs() < 1e-6);
    }
}
