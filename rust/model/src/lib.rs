//! Forward passes of the supported families over mapped GGUF weights.
