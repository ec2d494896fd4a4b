//! ember's kernels on a GPU, through wgpu on Vulkan: the device and its
//! buffers, weight matrices uploaded in their file formats (no f32 copies on
//! the card; `layout.rs` sets some formats' scales apart so that every block
//! starts on a word), and WGSL kernels recorded into one command buffer a
//! pass.
//!
//! It knows tensors and kernels, not models: the model crate decides which
//! layers live here. Every kernel is tested against the CPU's arithmetic by
//! normalised error (`tests/kernels.rs`), on any Vulkan device, Mesa's
//! lavapipe included.

mod delta;
mod device;
mod error;
mod experts;
mod kernels;
mod layout;

pub use device::{
    list_devices, Activation, AttentionShape, DeviceBuffer, DeviceInfo, DeviceKind, DeviceKvLayer, DeviceMatrix, Gpu, KvFormat,
    Pass, Rotation, StackedMatrix, MAX_HEAD_DIM,
};
pub use delta::{DeltaShape, MAX_CONV, MAX_DELTA_HEAD_DIM};
pub use error::{GpuError, Result};
pub use experts::{DeviceExperts, Routing};
pub use kernels::matmul_supports;
