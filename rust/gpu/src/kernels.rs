//! The WGSL kernels: each one's source, assembled from shared parts, and the
//! pipelines built from them on first use.

use std::collections::HashMap;
use std::sync::Mutex;

use ember_gguf::GgmlType;

/// The matrix product's template and, per weight format, the file that
/// gives its block (elements, bytes, and the dot of one block with the input).
const MATMUL: &str = include_str!("shaders/matmul.wgsl");
const K_SCALES: &str = include_str!("shaders/formats/k_scales.wgsl");
const RMS_NORM: &str = include_str!("shaders/rms_norm.wgsl");
const ELEMENTWISE: &str = include_str!("shaders/elementwise.wgsl");
const ADD_IN_PLACE: &str = include_str!("shaders/add_in_place.wgsl");
const ROPE: &str = include_str!("shaders/rope.wgsl");
const KV_STORE: &str = include_str!("shaders/kv_store.wgsl");
const ATTENTION: &str = include_str!("shaders/attention.wgsl");

/// The template's line that sets how many inputs a thread takes.
const WIDE_COLS: &str = "const COLS: u32 = 8u;";

fn format_source(ty: GgmlType) -> Option<&'static str> {
    use GgmlType::*;
    Some(match ty {
        F32 => include_str!("shaders/formats/f32.wgsl"),
        F16 => include_str!("shaders/formats/f16.wgsl"),
        BF16 => include_str!("shaders/formats/bf16.wgsl"),
        Q4_0 => include_str!("shaders/formats/q4_0.wgsl"),
        Q4_1 => include_str!("shaders/formats/q4_1.wgsl"),
        Q5_0 => include_str!("shaders/formats/q5_0.wgsl"),
        Q5_1 => include_str!("shaders/formats/q5_1.wgsl"),
        Q8_0 => include_str!("shaders/formats/q8_0.wgsl"),
        Q2_K => include_str!("shaders/formats/q2_k.wgsl"),
        Q4_K => include_str!("shaders/formats/q4_k.wgsl"),
        Q5_K => include_str!("shaders/formats/q5_k.wgsl"),
        Q6_K => include_str!("shaders/formats/q6_k.wgsl"),
        _ => return None,
    })
}

/// Whether the device has a matrix product for weights of this type.
pub fn matmul_supports(ty: GgmlType) -> bool {
    format_source(ty).is_some()
}

/// A kernel, as the pipeline cache names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Kernel {
    /// The weight type, and whether a thread takes eight inputs (a prompt)
    /// or one (a decoded token, where eight would cost it the unused columns).
    Matmul(GgmlType, bool),
    RmsNorm,
    SiluMul,
    GeluMul,
    AddInPlace,
    Rope,
    KvStore,
    Attention,
}

impl Kernel {
    fn entry_point(self) -> &'static str {
        match self {
            Kernel::SiluMul => "silu_mul",
            Kernel::GeluMul => "gelu_mul",
            _ => "main",
        }
    }

    fn source(self) -> Option<String> {
        Some(match self {
            Kernel::Matmul(ty, wide) => {
                let block = format_source(ty)?;
                // The format's block reads the template's buffers and readers;
                // WGSL declarations may come in any order.
                let scales = if matches!(ty, GgmlType::Q4_K | GgmlType::Q5_K) { K_SCALES } else { "" };
                let template =
                    if wide { MATMUL.to_string() } else { MATMUL.replace(WIDE_COLS, "const COLS: u32 = 1u;") };
                format!("{template}\n{scales}\n{block}")
            }
            Kernel::RmsNorm => RMS_NORM.to_string(),
            Kernel::SiluMul | Kernel::GeluMul => ELEMENTWISE.to_string(),
            Kernel::AddInPlace => ADD_IN_PLACE.to_string(),
            Kernel::Rope => ROPE.to_string(),
            Kernel::KvStore => KV_STORE.to_string(),
            Kernel::Attention => ATTENTION.to_string(),
        })
    }
}

/// Pipelines built once per device and kernel.
#[derive(Default)]
pub(crate) struct Pipelines {
    built: Mutex<HashMap<Kernel, wgpu::ComputePipeline>>,
}

impl Pipelines {
    /// The kernel's pipeline, building it on first use; None for a kernel
    /// that has no source (a weight type without a device kernel).
    pub(crate) fn get(&self, device: &wgpu::Device, kernel: Kernel) -> Option<wgpu::ComputePipeline> {
        let mut built = self.built.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = built.get(&kernel) {
            return Some(p.clone());
        }
        let source = kernel.source()?;
        let label = format!("{kernel:?}");
        let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some(&label),
            source: wgpu::ShaderSource::Wgsl(source.into()),
        });
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(&label),
            layout: None,
            module: &module,
            entry_point: Some(kernel.entry_point()),
            compilation_options: Default::default(),
            cache: None,
        });
        built.insert(kernel, pipeline.clone());
        Some(pipeline)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_matmul_template_sets_its_width_where_the_narrow_form_replaces_it() {
        assert!(super::MATMUL.contains(super::WIDE_COLS));
    }
}
