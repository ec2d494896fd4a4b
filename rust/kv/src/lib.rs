//! Per-sequence KV cache: append, truncate, copy, save and restore.
