//! A mixture of experts on the device: each expert tensor uploaded once in
//! its file format, the router's choice made on the device, and the chosen
//! experts' products read from the choice there (llama.cpp's
//! `mul_mat_id`), so a layer's mixture needs nothing read back.

use ember_gguf::GgmlType;

use crate::device::{DeviceBuffer, Gpu, Pass};
use crate::error::{GpuError, Result};
use crate::kernels::Kernel;

/// One expert tensor on the device (`ffn_gate_exps`, ...): `n_expert`
/// matrices of `rows` rows of `cols` in the file's format, side by side, in
/// runs of whole experts of at most one binding each.
pub struct DeviceExperts {
    pub ty: GgmlType,
    pub n_expert: usize,
    pub rows: usize,
    pub cols: usize,
    row_bytes: usize,
    runs: Vec<ExpertRun>,
}

struct ExpertRun {
    first: usize,
    experts: usize,
    buf: wgpu::Buffer,
}

impl DeviceExperts {
    /// Bytes it holds on the device.
    pub fn bytes(&self) -> u64 {
        self.runs.iter().map(|r| r.buf.size()).sum()
    }

    /// Buffers it is held in (more than one past the binding limit).
    pub fn runs(&self) -> usize {
        self.runs.len()
    }
}

/// A mixture's routing of `rows` rows: each row's top `n_used` of
/// `n_expert` experts, their weights normalised to sum to one where
/// `normalise`, then multiplied by `scale`.
#[derive(Clone, Copy, Debug)]
pub struct Routing {
    pub rows: usize,
    pub n_expert: usize,
    pub n_used: usize,
    pub normalise: bool,
    pub scale: f32,
}

impl Gpu {
    /// The `n_expert` matrices of one expert tensor, `expert(e)` giving
    /// expert e's bytes in the file's layout of `ty`.
    pub fn upload_experts<'a>(
        &self,
        name: &str,
        ty: GgmlType,
        n_expert: usize,
        rows: usize,
        cols: usize,
        expert: impl Fn(usize) -> &'a [u8],
    ) -> Result<DeviceExperts> {
        if !crate::matmul_supports(ty) {
            return Err(GpuError::UnsupportedType { ty });
        }
        if cols % ty.block_size() != 0 || n_expert == 0 || rows == 0 {
            return Err(GpuError::Shape(format!("{name}: {n_expert} experts of {rows} rows of {cols} {ty}")));
        }
        let file_expert_bytes = rows * ty.row_bytes(cols as u64).expect("whole blocks") as usize;
        let row_bytes = crate::layout::row_bytes(ty, cols);
        let expert_bytes = rows * row_bytes;
        let per_run = (self.binding_limit().saturating_sub(8) / expert_bytes as u64) as usize;
        if per_run == 0 {
            return Err(GpuError::TooLarge {
                what: format!("{name}: one expert"),
                bytes: expert_bytes as u64,
                limit: self.binding_limit(),
            });
        }
        let mut runs = Vec::new();
        for first in (0..n_expert).step_by(per_run) {
            let n = per_run.min(n_expert - first);
            let mut data = Vec::with_capacity(n * expert_bytes);
            for e in first..first + n {
                let bytes = expert(e);
                if bytes.len() != file_expert_bytes {
                    return Err(GpuError::Shape(format!(
                        "{name}: expert {e} has {} bytes, not {file_expert_bytes} ({rows} rows of {cols} {ty})",
                        bytes.len()
                    )));
                }
                data.extend_from_slice(&crate::layout::device_rows(ty, cols, bytes));
            }
            let buf = self.storage(name, &data, data.len())?;
            runs.push(ExpertRun { first, experts: n, buf });
        }
        Ok(DeviceExperts { ty, n_expert, rows, cols, row_bytes, runs })
    }
}

impl Pass<'_> {
    /// The router's choice over `r.rows` rows of `logits` ([rows,
    /// n_expert]): the chosen experts into `ids` ([rows, n_used], as u32)
    /// and their weights into `weights`.
    pub fn moe_route(&mut self, r: &Routing, logits: &DeviceBuffer, ids: &DeviceBuffer, weights: &DeviceBuffer) -> Result<()> {
        let chosen = r.rows * r.n_used;
        if r.rows == 0
            || r.n_used == 0
            || r.n_used > r.n_expert
            || logits.len < r.rows * r.n_expert
            || ids.len < chosen
            || weights.len < chosen
        {
            return Err(GpuError::Shape(format!(
                "routing {r:?}: the logits hold {}, ids {}, weights {}",
                logits.len, ids.len, weights.len
            )));
        }
        let (groups, threads_x) = self.spread(r.rows, "routing")?;
        let params = [r.rows as u32, r.n_expert as u32, r.n_used as u32, r.normalise as u32, r.scale.to_bits(), threads_x, 0, 0];
        self.dispatch(Kernel::MoeRoute, &[&logits.buf, &ids.buf, &weights.buf], &params, groups);
        Ok(())
    }

    /// y[c] = w[ids[c]] · x[c / x_group] for the `n` chosen pairs c (rows of
    /// the routing, then their experts): y's rows are `w.rows` wide.
    pub fn matmul_id(
        &mut self,
        w: &DeviceExperts,
        x: &DeviceBuffer,
        x_group: usize,
        ids: &DeviceBuffer,
        n: usize,
        y: &DeviceBuffer,
    ) -> Result<()> {
        if n == 0 || x_group == 0 || x.len < n.div_ceil(x_group) * w.cols || ids.len < n || y.len < n * w.rows {
            return Err(GpuError::Shape(format!(
                "expert products of {} x {} over {n} pairs ({x_group} an input): x holds {}, ids {}, y {}",
                w.rows, w.cols, x.len, ids.len, y.len
            )));
        }
        let max = self.max_groups();
        let groups = w.rows.div_ceil(64);
        let groups_x = groups.min(max);
        let groups_y = groups.div_ceil(groups_x);
        if n > max || groups_y > max {
            return Err(GpuError::Shape(format!(
                "expert products of {} rows over {n} pairs are past the dispatch limit of {max}",
                w.rows
            )));
        }
        for run in &w.runs {
            let params = [w.rows, w.cols, n, w.row_bytes, groups_x, w.cols, w.rows, x_group, run.first, run.experts, 0, 0]
                .map(|v| v as u32);
            let groups = [groups_x as u32, groups_y as u32, n as u32];
            self.dispatch(Kernel::MatmulId(w.ty), &[&run.buf, &x.buf, &ids.buf, &y.buf], &params, groups);
        }
        Ok(())
    }

    /// out[j] (=, or += where `accumulate`) the sum over the experts row j
    /// chose of weight · expert_scale[expert] · y[j * n_used + s], over
    /// `rows` rows `width` wide.
    #[allow(clippy::too_many_arguments)]
    pub fn moe_combine(
        &mut self,
        y: &DeviceBuffer,
        ids: &DeviceBuffer,
        weights: &DeviceBuffer,
        expert_scale: &DeviceBuffer,
        rows: usize,
        n_used: usize,
        width: usize,
        out: &DeviceBuffer,
        accumulate: bool,
    ) -> Result<()> {
        let chosen = rows * n_used;
        if rows == 0 || width == 0 || y.len < chosen * width || ids.len < chosen || weights.len < chosen || out.len < rows * width {
            return Err(GpuError::Shape(format!(
                "summing {rows} rows of {n_used} experts {width} wide: y holds {}, ids {}, weights {}, out {}",
                y.len, ids.len, weights.len, out.len
            )));
        }
        let (groups, threads_x) = self.spread(rows * width, "summing the experts")?;
        let params = [rows as u32, width as u32, n_used as u32, accumulate as u32, threads_x, 0, 0, 0];
        let buffers = [&y.buf, &ids.buf, &weights.buf, &expert_scale.buf, &out.buf];
        self.dispatch(Kernel::MoeCombine, &buffers, &params, groups);
        Ok(())
    }
}
