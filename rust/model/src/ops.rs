//! Elementwise and per-row operations of the forward pass, on f32 rows.

use half::f16;

use crate::config::RopeStyle;

/// `out = x / rms(x) * w`.
#[inline]
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let ss: f32 = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let scale = 1.0 / (ss + eps).sqrt();
    for ((o, &v), &g) in out.iter_mut().zip(x).zip(w) {
        *o = v * scale * g;
    }
}

/// RMS norm in place.
#[inline]
pub fn rms_norm_inplace(x: &mut [f32], w: &[f32], eps: f32) {
    let ss: f32 = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let scale = 1.0 / (ss + eps).sqrt();
    for (v, &g) in x.iter_mut().zip(w) {
        *v *= scale * g;
    }
}

#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

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

fn gelu_f16_table() -> &'static [u16] {
    static TABLE: std::sync::OnceLock<Vec<u16>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| (0..=u16::MAX).map(|i| f16::from_f32(gelu_tanh(f16::from_bits(i).to_f32())).to_bits()).collect())
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

    #[test]
    fn rms_norm_normalises() {
        let x = [3.0, 4.0];
        let mut o = [0.0; 2];
        rms_norm(&x, &[1.0, 2.0], 0.0, &mut o);
        let r = (12.5f32).sqrt();
        assert!((o[0] - 3.0 / r).abs() < 1e-6 && (o[1] - 8.0 / r).abs() < 1e-6);
    }
}
