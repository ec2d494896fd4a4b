use ember_gguf::GgmlType;

/// What went wrong on the device, worded for the one line a user reads.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error("no Vulkan device found (install a Vulkan driver, or run on the CPU)")]
    NoDevice,
    #[error("no device named {name:?}; the devices are: {available}")]
    NoSuchDevice { name: String, available: String },
    #[error("{device}: could not open it: {reason}")]
    Open { device: String, reason: String },
    #[error("{ty} has no device kernel")]
    UnsupportedType { ty: GgmlType },
    #[error("{0}")]
    Shape(String),
    #[error("{what} takes {bytes} bytes, more than the device's largest buffer ({limit} bytes)")]
    TooLarge { what: String, bytes: u64, limit: u64 },
    #[error("the device is out of memory: {0}")]
    OutOfMemory(String),
    #[error("the device was lost: {0}")]
    Lost(String),
    #[error("the device refused the work: {0}")]
    Device(String),
}

pub type Result<T> = std::result::Result<T, GpuError>;
