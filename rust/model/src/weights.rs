//! Binds a model's tensors by name, checking each one's shape and type against
//! the configuration before the first pass, and remembers which tensors were
//! read so that a half-wired architecture can be reported.
//!
//! Weight matrices stay in the file's mapping, except those in a format with
//! a repacked layout (`ember_quant::packed`): their rows are rewritten once at
//! load into the layout the tile kernels stream, which pays for itself in the
//! first pass. Norm vectors and biases are read into f32.

use std::collections::BTreeSet;
use std::sync::Arc;

use ember_gguf::{GgmlType, GgufFile};
use ember_quant::packed::{PackedFormat, GROUP};
use ember_quant::{ActType, DotColsFn, DotFn, TileFn, UnpackedTile};

use crate::config::Config;
use crate::error::{ModelError, Result};

/// A weight matrix in the file's layout: `rows` output features, each a row of
/// `cols` input features stored contiguously in the tensor's type.
pub struct Matrix {
    pub name: String,
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub row_bytes: usize,
    /// The activation rows its kernel reads.
    pub input: ActFormat,
    pub dot: DotFn,
    /// The same dot over several columns at once, where the format has one.
    pub dot_cols: Option<DotColsFn>,
    /// The rows repacked for the tile kernels, where the format has a layout.
    pub packed: Option<PackedRows>,
    data: &'static [u8],
}

/// How a matrix wants its input quantized.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActFormat {
    /// Rows of blocks of the file format's activation type, for its dot kernel.
    File(ActType),
    /// The tile kernels' layout (`ember_quant::packed::quantize_act_row`).
    Packed,
}

/// A matrix's rows in groups of [`GROUP`], interleaved for the tile kernels.
pub struct PackedRows {
    pub format: PackedFormat,
    pub tile: TileFn,
    /// The unpacking and tile kernel over unpacked rows, where the format and the CPU have them.
    pub unpacked: Option<UnpackedTile>,
    pub group_bytes: usize,
    data: Vec<u8>,
}

impl PackedRows {
    /// The groups holding rows `rows.start..rows.end`; `rows.start` is a
    /// multiple of [`GROUP`].
    #[inline]
    pub fn groups(&self, rows: std::ops::Range<usize>) -> &[u8] {
        debug_assert_eq!(rows.start % GROUP, 0);
        &self.data[rows.start / GROUP * self.group_bytes..rows.end.div_ceil(GROUP) * self.group_bytes]
    }
}

impl Matrix {
    #[inline]
    pub fn row(&self, r: usize) -> &[u8] {
        &self.data[r * self.row_bytes..(r + 1) * self.row_bytes]
    }
}

#[cfg(test)]
impl Matrix {
    /// A matrix of `rows` rows of `cols` over `data` in the file layout of
    /// `ty`, bound as a file's tensor would be.
    pub(crate) fn for_test(ty: GgmlType, rows: usize, cols: usize, data: Vec<u8>, repack_rows: bool) -> Matrix {
        let row_bytes = ty.row_bytes(cols as u64).unwrap() as usize;
        assert_eq!(data.len(), rows * row_bytes);
        let data: &'static [u8] = Vec::leak(data);
        let packed = PackedFormat::of(ty).filter(|_| repack_rows).map(|f| repack(f, rows, cols, row_bytes, data).unwrap());
        let input = if packed.is_some() { ActFormat::Packed } else { ActFormat::File(ember_quant::activation_type(ty)) };
        let (dot, dot_cols) = (ember_quant::dot_fn(ty).unwrap(), ember_quant::dot_cols_fn(ty));
        Matrix { name: format!("test.{}", ty.name()), ty, rows, cols, row_bytes, input, dot, dot_cols, packed, data }
    }
}

/// One transformer block. Shapes are written as (rows = outputs, cols = inputs).
pub struct LayerWeights {
    pub attn_norm: Vec<f32>,         // [n_embd]
    pub wq: Matrix,                  // (n_head * head_dim_k, n_embd)
    pub wk: Matrix,                  // (n_head_kv * head_dim_k, n_embd)
    pub wv: Matrix,                  // (n_head_kv * head_dim_v, n_embd)
    pub bq: Option<Vec<f32>>,        // [n_head * head_dim_k] (qwen2)
    pub bk: Option<Vec<f32>>,        // [n_head_kv * head_dim_k]
    pub bv: Option<Vec<f32>>,        // [n_head_kv * head_dim_v]
    pub q_norm: Option<Vec<f32>>,    // [head_dim_k] (qwen3, gemma3)
    pub k_norm: Option<Vec<f32>>,    // [head_dim_k]
    pub wo: Matrix,                  // (n_embd, n_head * head_dim_v)
    pub post_attn_norm: Option<Vec<f32>>, // [n_embd] (gemma)
    pub ffn_norm: Vec<f32>,          // [n_embd]
    pub w_gate: Matrix,              // (n_ff, n_embd)
    pub w_up: Matrix,                // (n_ff, n_embd)
    pub w_down: Matrix,              // (n_embd, n_ff)
    pub post_ffn_norm: Option<Vec<f32>>, // [n_embd] (gemma)
}

pub struct Weights {
    pub token_embd: Matrix, // (n_vocab, n_embd)
    pub layers: Vec<LayerWeights>,
    pub output_norm: Vec<f32>, // [n_embd]
    /// The output head; the token embedding itself when the file ties them.
    pub output: Option<Matrix>, // (n_vocab, n_embd)
    /// Tensors in the file that the architecture never read.
    pub unread: Vec<String>,
}

impl Weights {
    pub fn output(&self) -> &Matrix {
        self.output.as_ref().unwrap_or(&self.token_embd)
    }
}

struct Binder<'a> {
    file: &'a Arc<GgufFile>,
    read: BTreeSet<String>,
    repack: bool,
}

impl<'a> Binder<'a> {
    fn matrix(&mut self, name: &str, rows: usize, cols: usize) -> Result<Matrix> {
        self.matrix_opt(name, rows, cols)?.ok_or_else(|| ModelError::MissingTensor(name.to_string()))
    }

    fn matrix_opt(&mut self, name: &str, rows: usize, cols: usize) -> Result<Option<Matrix>> {
        let Some(t) = self.file.tensor(name) else { return Ok(None) };
        let bad = |problem: String| ModelError::BadTensor { name: name.to_string(), problem };
        if t.dims.len() > 2 || t.dims[0] as usize != cols || t.n_rows() != rows {
            return Err(bad(format!("shape {:?}, expected [{cols}, {rows}]", t.dims)));
        }
        let dot = ember_quant::dot_fn(t.ty)
            .ok_or_else(|| ModelError::UnsupportedType { name: name.to_string(), ty: t.ty.name().to_string() })?;
        let act = ember_quant::activation_type(t.ty);
        if ember_quant::act_row_bytes(act, cols).is_none() {
            return Err(bad(format!("row of {cols} is not a whole number of {act:?} blocks")));
        }
        let data = self.file.tensor_data(t);
        // SAFETY: the mapping lives in the `Arc<GgufFile>` that `Model` holds
        // for as long as these weights exist (it is dropped after them).
        let data: &'static [u8] = unsafe { std::mem::transmute::<&[u8], &'static [u8]>(data) };
        self.read.insert(name.to_string());
        let row_bytes = t.ty.row_bytes(cols as u64).unwrap() as usize;
        let packed = match PackedFormat::of(t.ty) {
            Some(format) if self.repack => Some(repack(format, rows, cols, row_bytes, data).map_err(|e| bad(e.to_string()))?),
            _ => None,
        };
        let input = if packed.is_some() { ActFormat::Packed } else { ActFormat::File(act) };
        let dot_cols = ember_quant::dot_cols_fn(t.ty);
        Ok(Some(Matrix { name: name.to_string(), ty: t.ty, rows, cols, row_bytes, input, dot, dot_cols, packed, data }))
    }

    fn vector(&mut self, name: &str, len: usize) -> Result<Vec<f32>> {
        self.vector_opt(name, len)?.ok_or_else(|| ModelError::MissingTensor(name.to_string()))
    }

    fn vector_opt(&mut self, name: &str, len: usize) -> Result<Option<Vec<f32>>> {
        let Some(t) = self.file.tensor(name) else { return Ok(None) };
        if t.n_elements() != len as u64 {
            return Err(ModelError::BadTensor { name: name.to_string(), problem: format!("shape {:?}, expected [{len}]", t.dims) });
        }
        let mut out = vec![0.0f32; len];
        ember_quant::dequantize_row(t.ty, self.file.tensor_data(t), &mut out)
            .map_err(|e| ModelError::BadTensor { name: name.to_string(), problem: e.to_string() })?;
        if let Some(bad) = out.iter().position(|v| !v.is_finite()) {
            return Err(ModelError::BadTensor { name: name.to_string(), problem: format!("element {bad} is not finite") });
        }
        self.read.insert(name.to_string());
        Ok(Some(out))
    }
}

fn repack(format: PackedFormat, rows: usize, cols: usize, row_bytes: usize, src: &[u8]) -> std::result::Result<PackedRows, ember_quant::QuantError> {
    use rayon::prelude::*;
    let group_bytes = format.group_bytes(cols).expect("row width checked before");
    let mut data = vec![0u8; rows.div_ceil(GROUP) * group_bytes];
    data.par_chunks_mut(group_bytes)
        .zip(src[..rows * row_bytes].par_chunks(GROUP * row_bytes))
        .try_for_each(|(dst, src)| format.pack_group(cols, src, dst))?;
    Ok(PackedRows { format, tile: ember_quant::tile_fn(format), unpacked: ember_quant::unpacked_tile(format), group_bytes, data })
}

/// Binds every tensor the architecture reads; `repack` rewrites the rows of
/// formats that have a tile layout (off: every matrix stays in the mapping and
/// uses the file-format dot kernels, for comparison).
pub fn bind(file: &Arc<GgufFile>, c: &Config, repack: bool) -> Result<Weights> {
    let mut b = Binder { file, read: BTreeSet::new(), repack };
    let (e, hk, hv) = (c.n_embd, c.head_dim_k, c.head_dim_v);
    let token_embd = b.matrix("token_embd.weight", c.n_vocab, e)?;
    let mut layers = Vec::with_capacity(c.n_layer);
    for il in 0..c.n_layer {
        let n = |s: &str| format!("blk.{il}.{s}");
        let qk_norm = |b: &mut Binder, s: &str| -> Result<Option<Vec<f32>>> {
            if c.opts.qk_norm {
                b.vector(&n(s), hk).map(Some)
            } else {
                Ok(None)
            }
        };
        let post = |b: &mut Binder, s: &str| -> Result<Option<Vec<f32>>> {
            if c.opts.post_norms {
                b.vector(&n(s), e).map(Some)
            } else {
                Ok(None)
            }
        };
        layers.push(LayerWeights {
            attn_norm: b.vector(&n("attn_norm.weight"), e)?,
            wq: b.matrix(&n("attn_q.weight"), c.n_head * hk, e)?,
            wk: b.matrix(&n("attn_k.weight"), c.n_head_kv * hk, e)?,
            wv: b.matrix(&n("attn_v.weight"), c.n_head_kv * hv, e)?,
            bq: b.vector_opt(&n("attn_q.bias"), c.n_head * hk)?,
            bk: b.vector_opt(&n("attn_k.bias"), c.n_head_kv * hk)?,
            bv: b.vector_opt(&n("attn_v.bias"), c.n_head_kv * hv)?,
            q_norm: qk_norm(&mut b, "attn_q_norm.weight")?,
            k_norm: qk_norm(&mut b, "attn_k_norm.weight")?,
            wo: b.matrix(&n("attn_output.weight"), e, c.n_head * hv)?,
            post_attn_norm: post(&mut b, "post_attention_norm.weight")?,
            ffn_norm: b.vector(&n("ffn_norm.weight"), e)?,
            w_gate: b.matrix(&n("ffn_gate.weight"), c.n_ff, e)?,
            w_up: b.matrix(&n("ffn_up.weight"), c.n_ff, e)?,
            w_down: b.matrix(&n("ffn_down.weight"), e, c.n_ff)?,
            post_ffn_norm: post(&mut b, "post_ffw_norm.weight")?,
        });
    }
    let output_norm = b.vector("output_norm.weight", e)?;
    let output = b.matrix_opt("output.weight", c.n_vocab, e)?;
    let unread = file.tensors.iter().map(|t| t.name.clone()).filter(|n| !b.read.contains(n)).collect();
    Ok(Weights { token_embd, layers, output_norm, output, unread })
}
