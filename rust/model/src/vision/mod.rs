//! Multimodal projectors: the encoders of an mmproj file (llama.cpp's
//! `clip` files), which turn a picture into rows the text model reads in
//! place of token embeddings.
//!
//! A projector is loaded beside a model and checked against it before the
//! model serves: its output width must be the model's embedding width, and
//! its kind must be one the model's family reads. The picture arrives
//! already decoded, resized and normalised (the Python side does that with
//! Pillow, as llama.cpp's `clip` does with its port of Pillow's resampling):
//! an encoder sees `image_size` square pixels in three planes.

mod siglip;

use std::path::Path;
use std::sync::Arc;

use ember_gguf::GgufFile;

use crate::config::Arch;
use crate::error::{ModelError, Result};
use crate::pool::Pool;

/// The encoders ember runs, by the name a file gives in `clip.projector_type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProjectorKind {
    /// Gemma 3's SigLIP tower, its patches average-pooled and projected.
    Gemma3,
}

impl ProjectorKind {
    pub fn name(self) -> &'static str {
        match self {
            ProjectorKind::Gemma3 => "gemma3",
        }
    }

    /// The text families this encoder's rows are trained for.
    fn fits(self, arch: Arch) -> bool {
        match self {
            ProjectorKind::Gemma3 => arch == Arch::Gemma3,
        }
    }

    /// Whether an image's rows attend to each other both ways in the text
    /// model (llama.cpp's `mtmd_decode_use_non_causal`).
    pub fn bidirectional(self) -> bool {
        match self {
            ProjectorKind::Gemma3 => true,
        }
    }

    /// The text that opens and closes an image's rows in a prompt.
    pub fn markers(self) -> (&'static str, &'static str) {
        match self {
            ProjectorKind::Gemma3 => ("<start_of_image>", "<end_of_image>"),
        }
    }
}

/// How the picture is made ready: llama.cpp's choice per encoder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resize {
    /// Pillow's bilinear filter, the aspect kept and the rest padded black
    /// (llama.cpp's `PAD_CEIL` with its default colour).
    BilinearPadded,
}

/// A vision encoder's shape, as the file gives it.
#[derive(Clone, Debug)]
pub struct VisionParams {
    pub image_size: usize,
    pub patch_size: usize,
    pub n_embd: usize,
    pub n_ff: usize,
    pub n_layer: usize,
    pub n_head: usize,
    pub eps: f32,
    pub image_mean: [f32; 3],
    pub image_std: [f32; 3],
    /// Patches merged per side into one output row.
    pub n_merge: usize,
    /// The output rows' width: the text model's embedding width.
    pub proj_dim: usize,
}

impl VisionParams {
    pub fn patches_per_side(&self) -> usize {
        self.image_size / self.patch_size
    }

    pub fn n_patches(&self) -> usize {
        self.patches_per_side() * self.patches_per_side()
    }

    /// Rows an image becomes in the text model's prompt.
    pub fn tokens_per_image(&self) -> usize {
        let side = self.patches_per_side() / self.n_merge;
        side * side
    }
}

/// A loaded projector: its kind, shape and weights, in the file's mapping.
pub struct Projector {
    pub kind: ProjectorKind,
    pub params: VisionParams,
    pub resize: Resize,
    /// The file's `general.name`, where it has one.
    pub name: Option<String>,
    encoder: siglip::Siglip,
    // Declared after the weights, which borrow its mapping.
    _file: Arc<GgufFile>,
}

/// One picture's pixels as the encoder reads them: `image_size` square,
/// normalised, RGB interleaved row by row (llama.cpp's `clip_image_f32`).
pub struct Pixels<'a> {
    pub width: usize,
    pub height: usize,
    pub rgb: &'a [f32],
}

impl Projector {
    /// Opens an mmproj file and binds every tensor its encoder reads; a
    /// tensor left unread, a kind ember does not run, or a shape that does
    /// not fit is refused by name.
    pub fn load(path: impl AsRef<Path>, repack: bool) -> Result<Projector> {
        let path = path.as_ref();
        let file = Arc::new(GgufFile::open(path)?);
        let h = file.header();
        let arch = h.architecture()?;
        if arch != "clip" {
            return Err(ModelError::Projector(format!(
                "{} is a {arch:?} file, not a projector (an mmproj file's architecture is \"clip\")",
                path.display()
            )));
        }
        if h.get_bool_opt("clip.has_vision_encoder")? != Some(true) {
            return Err(ModelError::Projector(format!(
                "{} has no vision encoder (ember reads pictures; sound encoders are not run yet)",
                path.display()
            )));
        }
        let kind_name = match h.get_str_opt("clip.vision.projector_type")? {
            Some(k) => k,
            None => h.get_str("clip.projector_type")?,
        };
        let kind = match kind_name {
            "gemma3" => ProjectorKind::Gemma3,
            other => {
                return Err(ModelError::Projector(format!(
                    "projector type {other:?} is not supported (ember runs gemma3)"
                )))
            }
        };
        let params = read_params(&file, kind)?;
        let mut b = crate::weights::Binder { file: &file, read: Default::default(), repack };
        let encoder = siglip::Siglip::bind(&mut b, &params)?;
        let unread: Vec<String> = file.tensors.iter().map(|t| t.name.clone()).filter(|n| !b.read.contains(n)).collect();
        if !unread.is_empty() {
            return Err(ModelError::UnreadTensors { arch: kind.name(), names: unread });
        }
        let name = h.get_str_opt("general.name")?.map(str::to_string);
        Ok(Projector { kind, params, resize: Resize::BilinearPadded, name, encoder, _file: file })
    }

    /// Refuses a projector whose rows the model cannot read, naming why.
    pub fn check_fits(&self, arch: Arch, n_embd: usize) -> Result<()> {
        if self.params.proj_dim != n_embd {
            return Err(ModelError::Projector(format!(
                "the projector's rows are {} wide but the model's embedding is {n_embd}: it belongs to another model",
                self.params.proj_dim
            )));
        }
        if !self.kind.fits(arch) {
            return Err(ModelError::Projector(format!(
                "a {} projector does not fit a {} model",
                self.kind.name(),
                arch.name()
            )));
        }
        Ok(())
    }

    /// The rows of one picture, `tokens_per_image` of `proj_dim` each.
    pub(crate) fn encode(&self, pool: &Pool, px: &Pixels<'_>) -> Result<Vec<f32>> {
        let s = self.params.image_size;
        if px.width != s || px.height != s {
            return Err(ModelError::Invalid(format!(
                "the encoder takes {s}x{s} pixels, not {}x{}",
                px.width, px.height
            )));
        }
        if px.rgb.len() != s * s * 3 {
            return Err(ModelError::Invalid(format!(
                "{s}x{s} RGB pixels are {} values, not {}",
                s * s * 3,
                px.rgb.len()
            )));
        }
        if let Some(bad) = px.rgb.iter().position(|v| !v.is_finite()) {
            return Err(ModelError::Invalid(format!("pixel value {bad} is not finite")));
        }
        Ok(self.encoder.encode(pool, &self.params, px.rgb))
    }
}

fn read_params(file: &GgufFile, kind: ProjectorKind) -> Result<VisionParams> {
    let h = file.header();
    let req = |key: &str| -> Result<usize> {
        h.get_u64_opt(key)?
            .map(|v| v as usize)
            .filter(|&v| v > 0)
            .ok_or_else(|| ModelError::BadMetadata { key: key.into(), problem: "missing or zero".into() })
    };
    let triple = |key: &str| -> Result<[f32; 3]> {
        let bad = |problem: &str| ModelError::BadMetadata { key: key.into(), problem: problem.into() };
        let a = h.get(key).and_then(|v| v.as_array()).ok_or_else(|| bad("missing, or not an array"))?;
        if a.len() < 3 {
            return Err(bad("fewer than three values"));
        }
        let mut out = [0.0; 3];
        for (o, v) in out.iter_mut().zip(a) {
            *o = v.as_f64().ok_or_else(|| bad("not numbers"))? as f32;
        }
        Ok(out)
    };
    let p = VisionParams {
        image_size: req("clip.vision.image_size")?,
        patch_size: req("clip.vision.patch_size")?,
        n_embd: req("clip.vision.embedding_length")?,
        n_ff: req("clip.vision.feed_forward_length")?,
        n_layer: req("clip.vision.block_count")?,
        n_head: req("clip.vision.attention.head_count")?,
        eps: h.get_f64_opt("clip.vision.attention.layer_norm_epsilon")?.unwrap_or(1e-6) as f32,
        image_mean: triple("clip.vision.image_mean")?,
        image_std: triple("clip.vision.image_std")?,
        n_merge: match kind {
            // Gemma 3's default; only its test models say otherwise.
            ProjectorKind::Gemma3 => h.get_u64_opt("clip.vision.projector.scale_factor")?.unwrap_or(4) as usize,
        },
        proj_dim: req("clip.vision.projection_dim")?,
    };
    let bad = |key: &str, problem: String| Err(ModelError::BadMetadata { key: key.into(), problem });
    if p.image_size % p.patch_size != 0 {
        return bad("clip.vision.patch_size", format!("{} does not divide the image size {}", p.patch_size, p.image_size));
    }
    if p.n_merge == 0 || p.patches_per_side() % p.n_merge != 0 {
        return bad(
            "clip.vision.projector.scale_factor",
            format!("{} does not divide the {} patches of a side", p.n_merge, p.patches_per_side()),
        );
    }
    if p.n_embd % p.n_head != 0 {
        return bad("clip.vision.attention.head_count", format!("{} does not divide the width {}", p.n_head, p.n_embd));
    }
    if p.image_std.contains(&0.0) {
        return bad("clip.vision.image_std", "a zero would divide by zero".into());
    }
    if p.image_size > 8192 {
        return bad("clip.vision.image_size", format!("{} is past what any encoder takes", p.image_size));
    }
    Ok(p)
}
