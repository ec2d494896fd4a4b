//! Qwen3.5's hybrid layers on the device: a gated DeltaNet layer's per-head
//! terms, short convolution, L2 norms and the gated delta rule over each
//! sequence's recurrent state (a buffer per sequence holding every layer's
//! state, in the CPU cache's layout), and the gates of its attention layers
//! and of its shared expert.

use crate::device::{DeviceBuffer, Pass};
use crate::error::{GpuError, Result};
use crate::kernels::Kernel;

/// The widest head the rule holds (its MAX_HEAD_DIM).
pub const MAX_DELTA_HEAD_DIM: usize = 256;
/// The longest convolution it holds (its MAX_CONV).
pub const MAX_CONV: usize = 16;

/// One sequence's part of a gated DeltaNet layer: `n` rows from `row0` of
/// the convolution's output (rows of `qkv_stride`: every query head, every
/// key head from `key_dim`, the values from twice it), `n_v_heads` value
/// heads of `head_dim` reading key head h % `n_k_heads`, and the rule's
/// state at `state_at` of the sequence's states.
#[derive(Clone, Copy, Debug)]
pub struct DeltaShape {
    pub n: usize,
    pub row0: usize,
    pub head_dim: usize,
    pub n_v_heads: usize,
    pub n_k_heads: usize,
    pub qkv_stride: usize,
    pub key_dim: usize,
    pub state_at: usize,
}

impl Pass<'_> {
    /// beta = sigmoid(beta) and gate = softplus(gate + dt_bias) * a, in
    /// place over `n` values in rows of `dt_bias.len()` heads.
    pub fn delta_gates(&mut self, beta: &DeviceBuffer, gate: &DeviceBuffer, dt_bias: &DeviceBuffer, a: &DeviceBuffer, n: usize) -> Result<()> {
        let heads = dt_bias.len;
        if n == 0 || heads == 0 || a.len != heads || n % heads != 0 || beta.len < n || gate.len < n {
            return Err(GpuError::Shape(format!(
                "the rule's terms of {n} values in heads of {heads}: beta holds {}, the gates {}, a {}",
                beta.len, gate.len, a.len
            )));
        }
        let (groups, threads_x) = self.spread(n, "the rule's terms")?;
        let params = [n as u32, threads_x, heads as u32, 0];
        self.dispatch(Kernel::DeltaGates, &[&beta.buf, &gate.buf, &dt_bias.buf, &a.buf], &params, groups);
        Ok(())
    }

    /// The causal convolution of `n` rows from `row0` of `x` (`channels`
    /// wide), then SiLU, into the same rows of `out`, carrying the state
    /// (`d_conv - 1` rows of `channels`) at `state_at` of `states`.
    #[allow(clippy::too_many_arguments)]
    pub fn delta_conv(
        &mut self,
        x: &DeviceBuffer,
        w: &DeviceBuffer,
        states: &DeviceBuffer,
        state_at: usize,
        out: &DeviceBuffer,
        row0: usize,
        n: usize,
        channels: usize,
        d_conv: usize,
    ) -> Result<()> {
        let end = (row0 + n) * channels;
        if n == 0
            || !(2..=MAX_CONV).contains(&d_conv)
            || w.len != channels * d_conv
            || x.len < end
            || out.len < end
            || states.len < state_at + (d_conv - 1) * channels
        {
            return Err(GpuError::Shape(format!(
                "a convolution of {n} rows of {channels} over {d_conv} taps: x holds {}, out {}, the taps {}, the states {}",
                x.len, out.len, w.len, states.len
            )));
        }
        let (groups, threads_x) = self.spread(channels, "the convolution")?;
        let params = [n, row0, channels, d_conv, state_at, threads_x as usize, 0, 0].map(|v| v as u32);
        self.dispatch(Kernel::DeltaConv, &[&x.buf, &w.buf, &states.buf, &out.buf], &params, groups);
        Ok(())
    }

    /// x / sqrt(Σx² + eps) in place, over the first `heads` heads of
    /// `width` of each of `rows` rows `stride` apart.
    pub fn l2_norm_heads(&mut self, x: &DeviceBuffer, rows: usize, heads: usize, width: usize, stride: usize, eps: f32) -> Result<()> {
        let count = rows * heads;
        if count == 0 || width == 0 || heads * width > stride || x.len < (rows - 1) * stride + heads * width {
            return Err(GpuError::Shape(format!(
                "L2 norms of {heads} heads of {width} in {rows} rows of {stride}: x holds {}",
                x.len
            )));
        }
        let max = self.max_groups();
        let (gx, gy) = (count.min(max), count.div_ceil(max));
        if gy > max {
            return Err(GpuError::Shape(format!("L2 norms of {count} heads are past the dispatch limit")));
        }
        let params = [rows as u32, heads as u32, width as u32, stride as u32, eps.to_bits(), gx as u32, 0, 0];
        self.dispatch(Kernel::L2Norm, &[&x.buf], &params, [gx as u32, gy as u32, 1]);
        Ok(())
    }

    /// The gated delta rule over one sequence's rows (`s`), token after
    /// token: each value head's state in `states` carried forward, its
    /// outputs into rows of `n_v_heads * head_dim` of `out`.
    #[allow(clippy::too_many_arguments)]
    pub fn delta_rule(
        &mut self,
        s: &DeltaShape,
        qkv: &DeviceBuffer,
        gate: &DeviceBuffer,
        beta: &DeviceBuffer,
        states: &DeviceBuffer,
        out: &DeviceBuffer,
    ) -> Result<()> {
        let (d, rows) = (s.head_dim, s.row0 + s.n);
        let bad = || Err(GpuError::Shape(format!("the delta rule of {s:?}")));
        if s.n == 0 || d == 0 || d > MAX_DELTA_HEAD_DIM || s.n_k_heads == 0 || s.n_v_heads == 0 || s.n_v_heads % s.n_k_heads != 0 {
            return bad();
        }
        if s.key_dim != s.n_k_heads * d || 2 * s.key_dim + s.n_v_heads * d > s.qkv_stride {
            return bad();
        }
        if qkv.len < rows * s.qkv_stride
            || gate.len < rows * s.n_v_heads
            || beta.len < rows * s.n_v_heads
            || out.len < rows * s.n_v_heads * d
            || states.len < s.state_at + s.n_v_heads * d * d
            || s.n_v_heads > self.max_groups()
        {
            return bad();
        }
        let params = [s.n, s.row0, d, s.n_v_heads, s.n_k_heads, s.qkv_stride, s.key_dim, s.state_at].map(|v| v as u32);
        let groups = [d.div_ceil(64) as u32, s.n_v_heads as u32, 1];
        self.dispatch(Kernel::DeltaRule, &[&qkv.buf, &gate.buf, &beta.buf, &states.buf, &out.buf], &params, groups);
        Ok(())
    }

    /// Rows of per-head (query, gate) pairs (`head_dim` each) in `raw`,
    /// split into the queries `q` and the gates `gates`: `heads` heads in all.
    pub fn split_gates(&mut self, raw: &DeviceBuffer, q: &DeviceBuffer, gates: &DeviceBuffer, heads: usize, head_dim: usize) -> Result<()> {
        let n = heads * head_dim;
        if n == 0 || raw.len < 2 * n || q.len < n || gates.len < n {
            return Err(GpuError::Shape(format!(
                "splitting {heads} heads of {head_dim} and their gates: raw holds {}, q {}, gates {}",
                raw.len, q.len, gates.len
            )));
        }
        let (groups, threads_x) = self.spread(n, "splitting the gates")?;
        self.dispatch(Kernel::SplitGates, &[&raw.buf, &q.buf, &gates.buf], &[n as u32, threads_x, head_dim as u32, 0], groups);
        Ok(())
    }

    /// x[j] *= sigmoid(z[j]) for each of `rows` rows of `width`, in place.
    pub fn row_gate(&mut self, x: &DeviceBuffer, z: &DeviceBuffer, rows: usize, width: usize) -> Result<()> {
        let n = rows * width;
        if n == 0 || x.len < n || z.len < rows {
            return Err(GpuError::Shape(format!("gating {rows} rows of {width}: x holds {}, z {}", x.len, z.len)));
        }
        let (groups, threads_x) = self.spread(n, "a row gate")?;
        self.dispatch(Kernel::RowGate, &[&x.buf, &z.buf], &[n as u32, threads_x, width as u32, 0], groups);
        Ok(())
    }
}
