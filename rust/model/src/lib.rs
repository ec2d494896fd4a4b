//! Forward passes of the supported families (llama, qwen2, qwen3, qwen3moe,
//! qwen35, qwen35moe, gemma3, gemma4) over weights that stay in the GGUF
//! file's mapping.
//!
//! A [`Model`] (`model.rs`) is immutable once loaded and owns its worker
//! pool; its passes are in `forward.rs`, a layer an attention (or DeltaNet)
//! block and a feed-forward block; the state of a conversation lives in a
//! [`Session`], so one model serves many sequences.

mod attention;
pub mod batch;
pub mod bench;
pub mod config;
pub mod delta_net;
pub mod device;
mod error;
mod forward;
pub mod generate;
mod matmul;
mod model;
mod ops;
mod pool;
mod rope;
pub mod vision;
pub mod weights;

pub use config::{Arch, Config, FamilyOptions};
pub use device::{device_kv_format, device_refusal, DeviceWeights};
pub use ember_gpu::{DeviceKind, Gpu};
pub use ember_kv::KvType;
pub use error::{ModelError, Result};
pub use forward::{Logits, Media, SeqPass, Session, Snapshot, Workspace};
pub use generate::{GenerateParams, Generation, Slot, Step, StopReason};
pub use model::{physical_cores, LoadOptions, Model};
pub use vision::{Pixels, Projector, ProjectorKind, VisionParams};
