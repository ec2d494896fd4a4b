//! Quant block formats, dequantizers and dot-product kernels.
