//! Rotary position tables: each rope variant's inverse frequencies, with the
//! file's per-pair divisors (llama3 scaling, proportional rope, LongRoPE's
//! short and long factors) and YaRN's blend folded in once at load, and the
//! angles of a position computed from them as ggml's `rope_yarn` does.

use crate::config::{RopeConfig, RopeFactors, Yarn};
use crate::error::{ModelError, Result};
use crate::ops;
use crate::weights::Weights;

pub struct RopeTable {
    /// Inverse frequency of each rotated pair.
    inv: Vec<f32>,
    /// LongRoPE: the frequencies for a sequence of more than this many positions.
    long: Option<(usize, Vec<f32>)>,
    freq_scale: f32,
    mscale: f32,
}

impl RopeTable {
    pub fn new(r: &RopeConfig, w: &Weights) -> Result<RopeTable> {
        let half = r.n_rot / 2;
        let base_inv = ops::rope_inv_freq(r.base, r.n_rot);
        let divided = |name: &str, f: Option<&Vec<f32>>| -> Result<Vec<f32>> {
            let f = f.ok_or_else(|| ModelError::MissingTensor(name.to_string()))?;
            if f.len() != half {
                return Err(ModelError::BadTensor {
                    name: name.into(),
                    problem: format!("{} factors for {half} rotated pairs", f.len()),
                });
            }
            if let Some(i) = f.iter().position(|&x| x <= 0.0) {
                return Err(ModelError::BadTensor {
                    name: name.into(),
                    problem: format!("element {i} is {} (divisors must be positive)", f[i]),
                });
            }
            Ok(base_inv.iter().zip(f).map(|(x, d)| x / d).collect())
        };
        let (mut inv, mut long) = match r.factors {
            RopeFactors::None => (base_inv.clone(), None),
            RopeFactors::Freqs => (divided("rope_freqs.weight", w.rope_freqs.as_ref())?, None),
            RopeFactors::LongShort { original_ctx } => (
                divided("rope_factors_short.weight", w.rope_short.as_ref())?,
                Some((original_ctx, divided("rope_factors_long.weight", w.rope_long.as_ref())?)),
            ),
        };
        let mut freq_scale = r.freq_scale;
        if let Some(y) = r.yarn {
            yarn_blend(&mut inv, r, &y);
            if let Some((_, l)) = &mut long {
                yarn_blend(l, r, &y);
            }
            // The interpolation is in the frequencies now.
            freq_scale = 1.0;
        }
        Ok(RopeTable { inv, long, freq_scale, mscale: r.mscale })
    }

    /// Rotated pairs.
    pub fn half(&self) -> usize {
        self.inv.len()
    }

    /// Fills `cos`/`sin` (length [`half`](Self::half)) for position `pos` of
    /// a sequence whose context holds `n_ctx` positions.
    #[inline]
    pub fn angles(&self, pos: usize, n_ctx: usize, cos: &mut [f32], sin: &mut [f32]) {
        let inv = match &self.long {
            Some((original, long)) if n_ctx > *original => long,
            _ => &self.inv,
        };
        ops::rope_angles(pos, self.freq_scale, inv, cos, sin);
        if self.mscale != 1.0 {
            cos.iter_mut().chain(sin.iter_mut()).for_each(|v| *v *= self.mscale);
        }
    }
}

/// YaRN: pair `i` turns at `inv * (s (1 - mix) + mix)`, `s` the
/// interpolation scale and `mix` ggml's ramp over the correction range
/// (extrapolated below it, interpolated above).
fn yarn_blend(inv: &mut [f32], r: &RopeConfig, y: &Yarn) {
    let n_dims = r.n_rot as f32;
    let corr =
        |beta: f32| n_dims * (y.original_ctx as f32 / (beta * 2.0 * std::f32::consts::PI)).ln() / (2.0 * r.base.ln());
    let low = corr(y.beta_fast).floor().max(0.0);
    let high = corr(y.beta_slow).ceil().min(n_dims - 1.0);
    for (i, x) in inv.iter_mut().enumerate() {
        let ramp = 1.0 - ((i as f32 - low) / (high - low).max(0.001)).clamp(0.0, 1.0);
        *x *= r.freq_scale * (1.0 - ramp) + ramp;
    }
}
