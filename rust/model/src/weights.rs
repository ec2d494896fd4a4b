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

use crate::config::{Arch, Config, DeltaLayer, FfnShape, KvSource, RopeFactors, RouterInput};
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
    /// The bytes `data` points into, where they were made at load (a
    /// transposed tensor) rather than mapped from the file.
    _owned: Option<Box<[u8]>>,
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
    /// Every row in the file's layout (what a device uploads as it is).
    pub fn bytes(&self) -> &[u8] {
        self.data
    }

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
        let packed =
            PackedFormat::of(ty).filter(|_| repack_rows).map(|f| repack(ty, f, rows, cols, row_bytes, data).unwrap());
        let input =
            if packed.is_some() { ActFormat::Packed } else { ActFormat::File(ember_quant::activation_type(ty)) };
        let (dot, dot_cols) = (ember_quant::dot_fn(ty).unwrap(), ember_quant::dot_cols_fn(ty));
        Matrix { name: format!("test.{}", ty.name()), ty, rows, cols, row_bytes, input, dot, dot_cols, packed, data, _owned: None }
    }
}

/// One transformer block. Shapes are written as (rows = outputs, cols = inputs).
pub struct LayerWeights {
    pub attn_norm: Vec<f32>, // [n_embd]
    /// Queries (and their gates, qwen35); a gated DeltaNet layer has none of the attention weights.
    pub wq: Option<Matrix>, // (q_rows, n_embd)
    /// Keys and values; a layer that reads an earlier layer's cache has none.
    pub wk: Option<Matrix>, // (n_head_kv * head_dim_k, n_embd)
    /// Without it (gemma4), values are the keys before their norm.
    pub wv: Option<Matrix>, // (n_head_kv * head_dim_v, n_embd)
    pub bq: Option<Vec<f32>>, // [n_head * head_dim_k] (qwen2)
    pub bk: Option<Vec<f32>>, // [n_head_kv * head_dim_k]
    pub bv: Option<Vec<f32>>, // [n_head_kv * head_dim_v]
    pub q_norm: Option<Vec<f32>>, // [head_dim_k] (qwen3, gemma)
    pub k_norm: Option<Vec<f32>>, // [head_dim_k]
    pub wo: Option<Matrix>,  // (n_embd, n_head * head_dim_v)
    pub delta: Option<DeltaNetWeights>,
    pub post_attn_norm: Option<Vec<f32>>, // [n_embd] (gemma)
    pub ffn_norm: Vec<f32>,               // [n_embd]
    pub ffn: Option<DenseFfn>,
    pub experts: Option<Experts>,
    pub post_ffn_norm: Option<Vec<f32>>, // [n_embd] (gemma)
    /// qwen35moe: the dense block is a shared expert whose output is scaled
    /// by `sigmoid(gate · x)` of the block's normed input.
    pub shared_gate: Option<Vec<f32>>, // [n_embd]
    pub per_layer: Option<PerLayerInput>,
    /// The whole residual stream multiplied by this after the block (gemma4).
    pub out_scale: Option<f32>,
}

/// A gated DeltaNet layer (qwen35): its input projections, the convolution's
/// taps, the decay and write-strength terms, the gated output norm.
pub struct DeltaNetWeights {
    pub qkv: Matrix,       // (conv_dim, n_embd): queries, keys, values before the convolution
    pub z: Matrix,         // (value_dim, n_embd): the output norm's gate
    pub beta: Matrix,      // (n_v_heads, n_embd)
    pub alpha: Matrix,     // (n_v_heads, n_embd)
    pub conv: Vec<f32>,    // [conv_dim][d_conv]
    pub dt_bias: Vec<f32>, // [n_v_heads]
    /// `-exp(A_log)`, as the converter stores it.
    pub a: Vec<f32>, // [n_v_heads]
    pub norm: Vec<f32>,    // [head_dim]
    pub out: Matrix,       // (n_embd, value_dim)
}

/// A gated feed-forward: `down(act(gate x) * up x)`.
pub struct DenseFfn {
    pub gate: Matrix, // (n_ff, n_embd)
    pub up: Matrix,   // (n_ff, n_embd)
    pub down: Matrix, // (n_embd, n_ff)
}

/// A mixture of experts: one gated feed-forward per expert, stored as the
/// file's 3-D tensors (one matrix per expert, back to back) and bound as one
/// [`Matrix`] per expert over its slice of the mapping.
pub struct Experts {
    pub router: Matrix,    // (n_expert, n_embd)
    pub gate: Vec<Matrix>, // n_expert x (n_ff_exp, n_embd)
    pub up: Vec<Matrix>,   // n_expert x (n_ff_exp, n_embd)
    pub down: Vec<Matrix>, // n_expert x (n_embd, n_ff_exp)
    /// Each expert's output multiplied by its entry (`ffn_down_exps.scale`).
    pub down_scale: Option<Vec<f32>>, // [n_expert]
    /// gemma4: the router's scale of its normed input, and the norms around
    /// the mixture that sits beside the dense block.
    pub router_scale: Option<Vec<f32>>, // [n_embd]
    pub pre_norm: Option<Vec<f32>>, // [n_embd] (pre_ffw_norm_2)
    pub post_norm_dense: Option<Vec<f32>>, // [n_embd] (post_ffw_norm_1)
    pub post_norm: Option<Vec<f32>>, // [n_embd] (post_ffw_norm_2)
}

/// gemma4's per-layer input: a gate from the residual times this layer's
/// slice of the per-layer embeddings, projected back and normed.
pub struct PerLayerInput {
    pub gate: Matrix,        // (n_embd_per_layer, n_embd)
    pub proj: Matrix,        // (n_embd, n_embd_per_layer)
    pub post_norm: Vec<f32>, // [n_embd]
}

/// The per-layer token embeddings of gemma4's E models and what mixes them
/// with the residual before the first layer.
pub struct PerLayerEmbeddings {
    /// Stays in the file's mapping: only the rows of a pass's tokens are read.
    pub table: Matrix, // (n_vocab, n_layer * n_embd_per_layer)
    pub model_proj: Matrix,  // (n_layer * n_embd_per_layer, n_embd)
    pub proj_norm: Vec<f32>, // [n_embd_per_layer]
}

/// A reranker's classification head (llama.cpp's `cls.output`): one score
/// a label, from the hidden state of a sequence's last position.
pub struct Classifier {
    /// (n_labels, n_embd), row-major
    pub weight: Vec<f32>,
    pub bias: Option<Vec<f32>>,
    pub n_labels: usize,
}

impl Classifier {
    /// The labels' scores for `hidden` (n_embd): the head's product, its
    /// bias added; each a dot in f64 (the head is a few rows).
    pub fn scores(&self, hidden: &[f32]) -> Vec<f32> {
        let n_embd = self.weight.len() / self.n_labels;
        assert_eq!(hidden.len(), n_embd, "a hidden state of the model's width");
        (0..self.n_labels)
            .map(|l| {
                let row = &self.weight[l * n_embd..(l + 1) * n_embd];
                let dot: f64 = row.iter().zip(hidden).map(|(&w, &h)| w as f64 * h as f64).sum();
                (dot + self.bias.as_ref().map_or(0.0, |b| b[l] as f64)) as f32
            })
            .collect()
    }
}

pub struct Weights {
    pub token_embd: Matrix, // (n_vocab, n_embd)
    pub layers: Vec<LayerWeights>,
    pub output_norm: Vec<f32>, // [n_embd]
    /// The output head; the token embedding itself when the file ties them.
    pub output: Option<Matrix>, // (n_vocab, n_embd)
    /// Divisors of each rotated pair's frequency, where the file has them.
    pub rope_freqs: Option<Vec<f32>>,
    /// LongRoPE's divisors for sequences beyond the original context, and within it.
    pub rope_long: Option<Vec<f32>>,
    pub rope_short: Option<Vec<f32>>,
    pub per_layer: Option<PerLayerEmbeddings>,
    /// A reranker's head, where the file has one.
    pub classifier: Option<Classifier>,
    /// Tensors in the file that the architecture never read.
    pub unread: Vec<String>,
}

impl Weights {
    pub fn output(&self) -> &Matrix {
        self.output.as_ref().unwrap_or(&self.token_embd)
    }
}

pub(crate) struct Binder<'a> {
    pub(crate) file: &'a Arc<GgufFile>,
    pub(crate) read: BTreeSet<String>,
    pub(crate) repack: bool,
}

impl<'a> Binder<'a> {
    pub(crate) fn matrix(&mut self, name: &str, rows: usize, cols: usize) -> Result<Matrix> {
        self.matrix_opt(name, rows, cols)?.ok_or_else(|| ModelError::MissingTensor(name.to_string()))
    }

    pub(crate) fn matrix_opt(&mut self, name: &str, rows: usize, cols: usize) -> Result<Option<Matrix>> {
        let Some(ty) = self.tensor_2d(name, rows, cols)? else {
            return Ok(None);
        };
        let data = self.tensor_bytes(name);
        self.bind_rows(name, ty, rows, cols, data, self.repack).map(Some)
    }

    /// A tensor of any rank read as `rows` rows (its last dimension) of
    /// `cols` (the product of the others): a convolution's kernel, whose
    /// product with a patch is one row's dot.
    pub(crate) fn matrix_flat(&mut self, name: &str, rows: usize, cols: usize) -> Result<Matrix> {
        let t = self.file.tensor(name).ok_or_else(|| ModelError::MissingTensor(name.to_string()))?;
        let inner: u64 = t.dims.iter().rev().skip(1).product();
        if t.dims.last() != Some(&(rows as u64)) || inner != cols as u64 {
            return Err(ModelError::BadTensor {
                name: name.to_string(),
                problem: format!("shape {:?}, expected {cols} elements in each of {rows} rows", t.dims),
            });
        }
        let ty = t.ty;
        let data = self.tensor_bytes(name);
        self.bind_rows(name, ty, rows, cols, data, self.repack)
    }

    /// The transpose of 2-D tensor `name` (stored `cols` rows of `rows`) as a
    /// matrix of `rows` rows of `cols`, in the tensor's own float type: what
    /// llama.cpp makes of a projection it multiplies by its transpose.
    pub(crate) fn matrix_transposed(&mut self, name: &str, rows: usize, cols: usize) -> Result<Matrix> {
        let ty = self.tensor_2d(name, cols, rows)?.ok_or_else(|| ModelError::MissingTensor(name.to_string()))?;
        let width = match ty {
            GgmlType::F32 => 4,
            GgmlType::F16 | GgmlType::BF16 => 2,
            _ => {
                return Err(ModelError::BadTensor {
                    name: name.to_string(),
                    problem: format!("type {} cannot be transposed at load (F32, F16 or BF16 can)", ty.name()),
                })
            }
        };
        let src = self.tensor_bytes(name);
        let mut owned = vec![0u8; src.len()].into_boxed_slice();
        for r in 0..rows {
            for c in 0..cols {
                let from = (c * rows + r) * width;
                owned[(r * cols + c) * width..][..width].copy_from_slice(&src[from..from + width]);
            }
        }
        // SAFETY: the bytes live in the box the matrix owns, which never
        // moves them and drops with the matrix.
        let data = unsafe { std::mem::transmute::<&[u8], &'static [u8]>(&owned[..]) };
        let mut m = self.bind_rows(name, ty, rows, cols, data, false)?;
        m._owned = Some(owned);
        Ok(m)
    }

    /// The type of 2-D tensor `name`, checked to be `rows` rows of `cols`, if the file has it.
    fn tensor_2d(&self, name: &str, rows: usize, cols: usize) -> Result<Option<GgmlType>> {
        let Some(t) = self.file.tensor(name) else {
            return Ok(None);
        };
        if t.dims.len() > 2 || t.dims[0] as usize != cols || t.n_rows() != rows {
            return Err(ModelError::BadTensor {
                name: name.to_string(),
                problem: format!("shape {:?}, expected [{cols}, {rows}]", t.dims),
            });
        }
        Ok(Some(t.ty))
    }

    /// Rows `first..first + rows` of a 2-D tensor of `total` rows, as a
    /// matrix of its own (a fused tensor's parts).
    fn row_range(&mut self, name: &str, total: usize, cols: usize, first: usize, rows: usize) -> Result<Matrix> {
        let ty = self.tensor_2d(name, total, cols)?.ok_or_else(|| ModelError::MissingTensor(name.to_string()))?;
        let row_bytes = ty.row_bytes(cols as u64).unwrap_or(0) as usize;
        let data = self.tensor_bytes(name);
        let part = format!("{name}[{first}..{}]", first + rows);
        self.bind_rows(&part, ty, rows, cols, &data[first * row_bytes..(first + rows) * row_bytes], self.repack)
    }

    /// A table whose rows are looked up, never multiplied: left in the
    /// mapping as the file stores it.
    fn lookup_table(&mut self, name: &str, rows: usize, cols: usize) -> Result<Matrix> {
        let ty = self.tensor_2d(name, rows, cols)?.ok_or_else(|| ModelError::MissingTensor(name.to_string()))?;
        let data = self.tensor_bytes(name);
        self.bind_rows(name, ty, rows, cols, data, false)
    }

    /// The experts of a 3-D tensor `[cols, rows, n_expert]`, one matrix each,
    /// or the row range `split` of each (a merged gate and up tensor).
    fn experts(
        &mut self,
        name: &str,
        n_expert: usize,
        rows: usize,
        cols: usize,
        split: Option<(usize, usize)>,
    ) -> Result<Vec<Matrix>> {
        let t = self.file.tensor(name).ok_or_else(|| ModelError::MissingTensor(name.to_string()))?;
        let (first, total) = split.unwrap_or((0, rows));
        if t.dims.len() != 3 || t.dims[..] != [cols as u64, total as u64, n_expert as u64] {
            return Err(ModelError::BadTensor {
                name: name.to_string(),
                problem: format!("shape {:?}, expected [{cols}, {total}, {n_expert}]", t.dims),
            });
        }
        let ty = t.ty;
        let row_bytes = ty.row_bytes(cols as u64).ok_or_else(|| ModelError::BadTensor {
            name: name.to_string(),
            problem: format!("rows of {cols} do not fit {}", ty.name()),
        })? as usize;
        let data = self.tensor_bytes(name);
        (0..n_expert)
            .map(|e| {
                let at = (e * total + first) * row_bytes;
                self.bind_rows(&format!("{name}[{e}]"), ty, rows, cols, &data[at..at + rows * row_bytes], self.repack)
            })
            .collect()
    }

    pub(crate) fn tensor_bytes(&mut self, name: &str) -> &'static [u8] {
        let t = self.file.tensor(name).expect("looked up by the caller");
        self.read.insert(name.to_string());
        // SAFETY: the mapping lives in the `Arc<GgufFile>` that `Model` holds
        // for as long as these weights exist (it is dropped after them).
        unsafe { std::mem::transmute::<&[u8], &'static [u8]>(self.file.tensor_data(t)) }
    }

    pub(crate) fn bind_rows(
        &self,
        name: &str,
        ty: GgmlType,
        rows: usize,
        cols: usize,
        data: &'static [u8],
        repack_rows: bool,
    ) -> Result<Matrix> {
        let bad = |problem: String| ModelError::BadTensor { name: name.to_string(), problem };
        let dot = ember_quant::dot_fn(ty)
            .ok_or_else(|| ModelError::UnsupportedType { name: name.to_string(), ty: ty.name().to_string() })?;
        let act = ember_quant::activation_type(ty);
        if ember_quant::act_row_bytes(act, cols).is_none() {
            return Err(bad(format!("row of {cols} is not a whole number of {act:?} blocks")));
        }
        let row_bytes = ty.row_bytes(cols as u64).unwrap() as usize;
        let packed = match PackedFormat::of(ty) {
            Some(format) if repack_rows => {
                Some(repack(ty, format, rows, cols, row_bytes, data).map_err(|e| bad(e.to_string()))?)
            }
            _ => None,
        };
        let input = if packed.is_some() { ActFormat::Packed } else { ActFormat::File(act) };
        let dot_cols = ember_quant::dot_cols_fn(ty);
        Ok(Matrix { name: name.to_string(), ty, rows, cols, row_bytes, input, dot, dot_cols, packed, data, _owned: None })
    }

    pub(crate) fn vector(&mut self, name: &str, len: usize) -> Result<Vec<f32>> {
        self.vector_opt(name, len)?.ok_or_else(|| ModelError::MissingTensor(name.to_string()))
    }

    pub(crate) fn vector_opt(&mut self, name: &str, len: usize) -> Result<Option<Vec<f32>>> {
        let Some(t) = self.file.tensor(name) else {
            return Ok(None);
        };
        if t.n_elements() != len as u64 {
            return Err(ModelError::BadTensor {
                name: name.to_string(),
                problem: format!("shape {:?}, expected [{len}]", t.dims),
            });
        }
        let mut out = vec![0.0f32; len];
        ember_quant::dequantize_row(t.ty, self.file.tensor_data(t), &mut out)
            .map_err(|e| ModelError::BadTensor { name: name.to_string(), problem: e.to_string() })?;
        if let Some(bad) = out.iter().position(|v| !v.is_finite()) {
            return Err(ModelError::BadTensor {
                name: name.to_string(),
                problem: format!("element {bad} is not finite"),
            });
        }
        self.read.insert(name.to_string());
        Ok(Some(out))
    }

    /// A vector of whatever length the file gives (checked by its reader).
    pub(crate) fn vector_any(&mut self, name: &str) -> Result<Option<Vec<f32>>> {
        let Some(t) = self.file.tensor(name) else {
            return Ok(None);
        };
        let n = t.n_elements() as usize;
        self.vector_opt(name, n)
    }

    /// A vector that the family reads where present and must be there where `needed`.
    fn vector_if(&mut self, needed: bool, name: &str, len: usize) -> Result<Option<Vec<f32>>> {
        if needed {
            self.vector(name, len).map(Some)
        } else {
            Ok(None)
        }
    }
}

fn repack(
    ty: GgmlType,
    format: PackedFormat,
    rows: usize,
    cols: usize,
    row_bytes: usize,
    src: &[u8],
) -> std::result::Result<PackedRows, ember_quant::QuantError> {
    use rayon::prelude::*;
    let pack = |format: PackedFormat| -> std::result::Result<(Vec<u8>, usize), ember_quant::QuantError> {
        let group_bytes = format.group_bytes(cols).expect("row width checked before");
        let mut data = vec![0u8; rows.div_ceil(GROUP) * group_bytes];
        ask_for_huge_pages(&mut data);
        data.par_chunks_mut(group_bytes)
            .zip(src[..rows * row_bytes].par_chunks(GROUP * row_bytes))
            .try_for_each(|(dst, src)| format.pack_group_from(ty, cols, src, dst))?;
        Ok((data, group_bytes))
    };
    let (data, group_bytes) = pack(format)?;
    Ok(PackedRows {
        format,
        tile: ember_quant::tile_fn(format),
        unpacked: ember_quant::unpacked_tile(format),
        group_bytes,
        data,
    })
}

/// Asks the kernel to back `buf` with huge pages where it can, before its
/// first write: a decoded token streams every packed weight once, and with
/// 4 KiB pages each 2 MiB of it costs 512 page walks.
fn ask_for_huge_pages(buf: &mut [u8]) {
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        let start = (buf.as_ptr() as usize).next_multiple_of(HUGE);
        let end = (buf.as_ptr() as usize + buf.len()) / HUGE * HUGE;
        if end > start {
            // SAFETY: the range lies inside `buf`, which this call borrows
            // mutably; MADV_HUGEPAGE changes how it is backed, not its bytes.
            // A refusal (a kernel without transparent huge pages) leaves it as it is.
            unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
        }
    }
}

/// Binds every tensor the architecture reads; `repack` rewrites the rows of
/// formats that have a tile layout (off: every matrix stays in the mapping and
/// uses the file-format dot kernels, for comparison). A tensor left unread is
/// a load error naming it: a weight the forward pass would silently ignore.
pub fn bind(file: &Arc<GgufFile>, c: &Config, repack: bool) -> Result<Weights> {
    let mut b = Binder { file, read: BTreeSet::new(), repack };
    let e = c.n_embd;
    let token_embd = b.matrix("token_embd.weight", c.n_vocab, e)?;
    let mut layers = Vec::with_capacity(c.n_layer);
    for (il, l) in c.layers.iter().enumerate() {
        let n = |s: &str| format!("blk.{il}.{s}");
        let (hk, hv) = (l.head_dim_k, l.head_dim_v);
        let own_kv = matches!(l.kv, KvSource::Own(_));
        let attention = l.delta.is_none();
        let (wq, wk, wv, bq, bk, bv) = match l.delta {
            None => {
                let (q, k, v, bq, bk, bv) = attention_inputs(&mut b, c, il)?;
                (Some(q), k, v, bq, bk, bv)
            }
            Some(_) => (None, None, None, None, None, None),
        };
        let delta = match l.delta {
            Some(d) => Some(delta_net(&mut b, c, il, d)?),
            None => None,
        };
        if own_kv && wv.is_none() && hv != hk {
            return Err(ModelError::BadTensor {
                name: n("attn_v.weight"),
                problem: format!("missing, and keys of {hk} cannot stand for values of {hv}"),
            });
        }
        let post = c.opts.post_norms;
        let (ffn, experts) = match l.ffn {
            FfnShape::Dense { n_ff } => (Some(dense_ffn(&mut b, c, il, n_ff)?), None),
            FfnShape::Experts { n_ff_exp } => (None, Some(experts(&mut b, c, il, n_ff_exp)?)),
            FfnShape::DenseAndExperts { n_ff, n_ff_exp } if c.arch == Arch::Qwen35Moe => {
                (Some(shared_expert(&mut b, c, il, n_ff)?), Some(experts(&mut b, c, il, n_ff_exp)?))
            }
            FfnShape::DenseAndExperts { n_ff, n_ff_exp } => {
                (Some(dense_ffn(&mut b, c, il, n_ff)?), Some(experts(&mut b, c, il, n_ff_exp)?))
            }
        };
        let shared_gate =
            b.vector_if(c.arch == Arch::Qwen35Moe && ffn.is_some(), &n("ffn_gate_inp_shexp.weight"), e)?;
        let per_layer = if c.n_embd_per_layer > 0 {
            Some(PerLayerInput {
                gate: b.matrix(&n("inp_gate.weight"), c.n_embd_per_layer, e)?,
                proj: b.matrix(&n("proj.weight"), e, c.n_embd_per_layer)?,
                post_norm: b.vector(&n("post_norm.weight"), e)?,
            })
        } else {
            None
        };
        layers.push(LayerWeights {
            attn_norm: b.vector(&n("attn_norm.weight"), e)?,
            wq,
            wk,
            wv,
            bq,
            bk,
            bv,
            q_norm: b.vector_if(c.opts.qk_norm && attention, &n("attn_q_norm.weight"), hk)?,
            k_norm: b.vector_if(c.opts.qk_norm && own_kv, &n("attn_k_norm.weight"), hk)?,
            wo: if attention { Some(b.matrix(&n("attn_output.weight"), e, l.att_width())?) } else { None },
            delta,
            post_attn_norm: b.vector_if(post, &n("post_attention_norm.weight"), e)?,
            ffn_norm: b.vector(&n(c.opts.ffn_norm), e)?,
            ffn,
            experts,
            post_ffn_norm: b.vector_if(post, &n("post_ffw_norm.weight"), e)?,
            shared_gate,
            per_layer,
            out_scale: b.vector_opt(&n("layer_output_scale.weight"), 1)?.map(|v| v[0]),
        });
    }
    // Frequency divisors, checked against the rope variants that read them
    // when their tables are built.
    let reads = |f: &dyn Fn(RopeFactors) -> bool| c.ropes.iter().any(|r| f(r.factors));
    let rope_freqs = if reads(&|f| f == RopeFactors::Freqs) { b.vector_any("rope_freqs.weight")? } else { None };
    let long_short = reads(&|f| matches!(f, RopeFactors::LongShort { .. }));
    let (rope_long, rope_short) = if long_short {
        (b.vector_any("rope_factors_long.weight")?, b.vector_any("rope_factors_short.weight")?)
    } else {
        (None, None)
    };
    let per_layer = if c.n_embd_per_layer > 0 {
        let width = c.n_layer * c.n_embd_per_layer;
        Some(PerLayerEmbeddings {
            table: b.lookup_table("per_layer_token_embd.weight", c.n_vocab, width)?,
            model_proj: b.matrix("per_layer_model_proj.weight", width, e)?,
            proj_norm: b.vector("per_layer_proj_norm.weight", c.n_embd_per_layer)?,
        })
    } else {
        None
    };
    let output_norm = b.vector("output_norm.weight", e)?;
    let output = b.matrix_opt("output.weight", c.n_vocab, e)?;
    let classifier = classifier(&mut b, e)?;
    let unread: Vec<String> = file.tensors.iter().map(|t| t.name.clone()).filter(|n| !b.read.contains(n)).collect();
    Ok(Weights {
        token_embd,
        layers,
        output_norm,
        output,
        rope_freqs,
        rope_long,
        rope_short,
        per_layer,
        classifier,
        unread,
    })
}

/// `cls.output.weight` (n_labels rows of the model's width) and its bias.
/// The pooler head of encoder rerankers (`cls.weight`) is not read: no
/// family here has one, and a file that does fails on it as unread.
fn classifier(b: &mut Binder, n_embd: usize) -> Result<Option<Classifier>> {
    const NAME: &str = "cls.output.weight";
    let Some(t) = b.file.tensor(NAME) else {
        return Ok(None);
    };
    if t.dims.len() > 2 || t.dims[0] as usize != n_embd || t.n_rows() == 0 {
        return Err(ModelError::BadTensor {
            name: NAME.to_string(),
            problem: format!("shape {:?}, expected [{n_embd}, labels]", t.dims),
        });
    }
    let n_labels = t.n_rows();
    let weight = b.vector(NAME, n_labels * n_embd)?;
    let bias = b.vector_opt("cls.output.bias", n_labels)?;
    Ok(Some(Classifier { weight, bias, n_labels }))
}

type AttentionInputs = (Matrix, Option<Matrix>, Option<Matrix>, Option<Vec<f32>>, Option<Vec<f32>>, Option<Vec<f32>>);

/// q, k and v (and their biases): three tensors, or one fused `attn_qkv`
/// whose rows are q's, then k's, then v's (phi3; any family, as llama.cpp's
/// `create_tensor_qkv`), bound as three matrices over its rows.
fn attention_inputs(b: &mut Binder, c: &Config, il: usize) -> Result<AttentionInputs> {
    let l = &c.layers[il];
    let n = |s: &str| format!("blk.{il}.{s}");
    let e = c.n_embd;
    let (q, k, v) = (l.q_rows(), l.k_width(), l.v_width());
    let own_kv = matches!(l.kv, KvSource::Own(_));
    let fused = n("attn_qkv.weight");
    if own_kv && b.file.tensor(&fused).is_some() {
        let total = q + k + v;
        let wq = b.row_range(&fused, total, e, 0, q)?;
        let wk = b.row_range(&fused, total, e, q, k)?;
        let wv = b.row_range(&fused, total, e, q + k, v)?;
        let (bq, bk, bv) = match b.vector_opt(&n("attn_qkv.bias"), total)? {
            Some(all) => (Some(all[..q].to_vec()), Some(all[q..q + k].to_vec()), Some(all[q + k..].to_vec())),
            None => (None, None, None),
        };
        return Ok((wq, Some(wk), Some(wv), bq, bk, bv));
    }
    let wk = if own_kv { Some(b.matrix(&n("attn_k.weight"), k, e)?) } else { None };
    let wv = match own_kv {
        // gemma4 layers may take their values from the keys.
        true if c.arch == Arch::Gemma4 => b.matrix_opt(&n("attn_v.weight"), v, e)?,
        true => Some(b.matrix(&n("attn_v.weight"), v, e)?),
        false => None,
    };
    let bk = if own_kv { b.vector_opt(&n("attn_k.bias"), k)? } else { None };
    let bv = if own_kv { b.vector_opt(&n("attn_v.bias"), v)? } else { None };
    Ok((b.matrix(&n("attn_q.weight"), q, e)?, wk, wv, b.vector_opt(&n("attn_q.bias"), q)?, bk, bv))
}

fn delta_net(b: &mut Binder, c: &Config, il: usize, d: DeltaLayer) -> Result<DeltaNetWeights> {
    let n = |s: &str| format!("blk.{il}.{s}");
    let (e, nv, conv_dim) = (c.n_embd, d.net.n_v_heads, d.conv_dim());
    let conv = n("ssm_conv1d.weight");
    if let Some(t) = b.file.tensor(&conv) {
        if t.dims[..] != [d.d_conv as u64, conv_dim as u64] {
            return Err(ModelError::BadTensor {
                name: conv,
                problem: format!("shape {:?}, expected [{}, {conv_dim}]", t.dims, d.d_conv),
            });
        }
    }
    Ok(DeltaNetWeights {
        qkv: b.matrix(&n("attn_qkv.weight"), conv_dim, e)?,
        z: b.matrix(&n("attn_gate.weight"), d.value_dim(), e)?,
        beta: b.matrix(&n("ssm_beta.weight"), nv, e)?,
        alpha: b.matrix(&n("ssm_alpha.weight"), nv, e)?,
        conv: b.vector(&conv, conv_dim * d.d_conv)?,
        dt_bias: b.vector(&n("ssm_dt.bias"), nv)?,
        a: b.vector(&n("ssm_a"), nv)?,
        norm: b.vector(&n("ssm_norm.weight"), d.net.head_dim)?,
        out: b.matrix(&n("ssm_out.weight"), e, d.value_dim())?,
    })
}

/// qwen35moe's shared expert, a gated feed-forward of its own names.
fn shared_expert(b: &mut Binder, c: &Config, il: usize, n_ff: usize) -> Result<DenseFfn> {
    let n = |s: &str| format!("blk.{il}.{s}");
    let e = c.n_embd;
    Ok(DenseFfn {
        gate: b.matrix(&n("ffn_gate_shexp.weight"), n_ff, e)?,
        up: b.matrix(&n("ffn_up_shexp.weight"), n_ff, e)?,
        down: b.matrix(&n("ffn_down_shexp.weight"), e, n_ff)?,
    })
}

fn dense_ffn(b: &mut Binder, c: &Config, il: usize, n_ff: usize) -> Result<DenseFfn> {
    let n = |s: &str| format!("blk.{il}.{s}");
    let e = c.n_embd;
    if c.opts.fused_gate_up {
        // phi3: ffn_up holds the gate's rows, then the up rows.
        let up = n("ffn_up.weight");
        return Ok(DenseFfn {
            gate: b.row_range(&up, 2 * n_ff, e, 0, n_ff)?,
            up: b.row_range(&up, 2 * n_ff, e, n_ff, n_ff)?,
            down: b.matrix(&n("ffn_down.weight"), e, n_ff)?,
        });
    }
    Ok(DenseFfn {
        gate: b.matrix(&n("ffn_gate.weight"), n_ff, e)?,
        up: b.matrix(&n("ffn_up.weight"), n_ff, e)?,
        down: b.matrix(&n("ffn_down.weight"), e, n_ff)?,
    })
}

fn experts(b: &mut Binder, c: &Config, il: usize, n_ff_exp: usize) -> Result<Experts> {
    let m = c.moe.as_ref().expect("a layer of experts in a model with a mixture");
    let (e, n_expert) = (c.n_embd, m.n_expert);
    let n = |s: &str| format!("blk.{il}.{s}");
    let (gate, up) = if b.file.tensor(&n("ffn_gate_up_exps.weight")).is_some() {
        let name = n("ffn_gate_up_exps.weight");
        (
            b.experts(&name, n_expert, n_ff_exp, e, Some((0, 2 * n_ff_exp)))?,
            b.experts(&name, n_expert, n_ff_exp, e, Some((n_ff_exp, 2 * n_ff_exp)))?,
        )
    } else {
        (
            b.experts(&n("ffn_gate_exps.weight"), n_expert, n_ff_exp, e, None)?,
            b.experts(&n("ffn_up_exps.weight"), n_expert, n_ff_exp, e, None)?,
        )
    };
    // gemma4 norms the mixture beside its dense block on its own.
    let beside_dense = matches!(c.layers[il].ffn, FfnShape::DenseAndExperts { .. }) && c.arch == Arch::Gemma4;
    Ok(Experts {
        router: b.matrix(&n("ffn_gate_inp.weight"), n_expert, e)?,
        gate,
        up,
        down: b.experts(&n("ffn_down_exps.weight"), n_expert, e, n_ff_exp, None)?,
        down_scale: b.vector_opt(&n("ffn_down_exps.scale"), n_expert)?,
        router_scale: b.vector_if(c.opts.router == RouterInput::ScaledResidual, &n("ffn_gate_inp.scale"), e)?,
        pre_norm: b.vector_if(beside_dense, &n("pre_ffw_norm_2.weight"), e)?,
        post_norm_dense: b.vector_if(beside_dense, &n("post_ffw_norm_1.weight"), e)?,
        post_norm: b.vector_if(beside_dense, &n("post_ffw_norm_2.weight"), e)?,
    })
}

#[cfg(test)]
mod tests {
    use super::Classifier;

    #[test]
    fn a_classifier_scores_each_label_with_its_row_and_bias() {
        let head =
            Classifier { weight: vec![1.0, 2.0, 3.0, -1.0, 0.5, 0.0], bias: Some(vec![0.25, -2.0]), n_labels: 2 };
        assert_eq!(head.scores(&[1.0, 1.0, 2.0]), vec![1.0 + 2.0 + 6.0 + 0.25, -1.0 + 0.5 - 2.0]);
        let unbiased = Classifier { bias: None, ..head };
        assert_eq!(unbiased.scores(&[0.0, 2.0, 0.0]), vec![4.0, 1.0]);
    }
}
