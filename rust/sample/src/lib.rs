//! Samplers in llama.cpp's order: penalties, bias, top-k, top-p, min-p, temperature.
