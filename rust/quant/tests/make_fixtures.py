#!/usr/bin/env python3
"""Regenerates the dequantization and activation-quantization fixtures.

The expected values come from the `gguf` Python package (llama.cpp's own
numpy implementation of the formats), independent of ember's Rust code.
Types `gguf` can quantize are built from random f32 data; for the others the
blocks are random bytes with their f16 scale fields set to sane values
(including a subnormal and a negative one) and only dequantized by `gguf`.
Q8_K, which `gguf` does not implement at all, is computed here with numpy
following ggml's `quantize_row_q8_K_ref` / `dequantize_row_q8_K`.

Output, per name: `<name>.bin` (row bytes) and `<name>.f32` (little-endian
f32 values): dequantizer input/expected output, or for the `*_act` fixtures
quantizer input (`.f32`) / expected output (`.bin`).

Usage: python3 make_fixtures.py   (writes into ./fixtures next to this file)
"""

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize, quantize

OUT = Path(__file__).resolve().parent / "fixtures"
N = 1024  # elements per fixture: 32 blocks of 32 or 4 super-blocks of 256
rng = np.random.default_rng(20240607)


def f16_bytes(v: float) -> bytes:
    return np.array([v], dtype="<f2").tobytes()


def scale_values(n_blocks: int) -> list[float]:
    """Realistic positive scales, with a subnormal f16 and a negative one."""
    d = list(rng.uniform(1e-3, 2e-2, n_blocks))
    d[1] = 3.0e-6  # below f16's smallest normal (6.1e-5)
    d[2] = -d[2]
    return d


def random_blocks(ty: T, f16_fields: list[int]) -> np.ndarray:
    block, size = GGML_QUANT_SIZES[ty]
    nb = N // block
    raw = bytearray(rng.integers(0, 256, size=nb * size, dtype=np.uint8).tobytes())
    for off in f16_fields:
        for i, d in enumerate(scale_values(nb)):
            raw[i * size + off : i * size + off + 2] = f16_bytes(d)
    return np.frombuffer(bytes(raw), dtype=np.uint8).reshape(1, -1)


def write(name: str, data: bytes, values: np.ndarray) -> None:
    (OUT / f"{name}.bin").write_bytes(data)
    (OUT / f"{name}.f32").write_bytes(np.asarray(values, dtype="<f4").tobytes())


def quantized_from_floats(ty: T) -> None:
    x = rng.standard_normal((1, N)).astype(np.float32)
    x[0, :32] *= 100.0  # one block far from unit scale
    x[0, 32:64] = 0.0  # and one all-zero block
    q = quantize(x, ty).view(np.uint8)  # F32 / F16 come back as floats
    write(ty.name.lower(), q.tobytes(), dequantize(q, ty).reshape(-1))


def quantized_from_bytes(ty: T, f16_fields: list[int]) -> None:
    q = random_blocks(ty, f16_fields)
    write(ty.name.lower(), q.tobytes(), dequantize(q, ty).reshape(-1))


def q8_k_blocks() -> None:
    nb = N // 256
    out = bytearray()
    vals = []
    for i in range(nb):
        d = np.float32(rng.uniform(1e-3, 5e-2) * (-1 if i % 2 else 1))
        qs = rng.integers(-127, 128, size=256).astype(np.int8)
        bsums = qs.astype(np.int16).reshape(16, 16).sum(axis=1).astype("<i2")
        out += np.array([d], dtype="<f4").tobytes() + qs.tobytes() + bsums.tobytes()
        vals.append(d * qs.astype(np.float32))
    write("q8_k", bytes(out), np.concatenate(vals))


def activation_input(block: int) -> np.ndarray:
    x = rng.standard_normal(N).astype(np.float32) * np.float32(0.7)
    x[block : 2 * block] = 0.0  # all-zero block: scale 0, quants 0
    # A block with exact halves after scaling: the rounding mode shows.
    ties = (np.arange(block) % 64 - 32).astype(np.float32) + np.float32(0.5)
    ties[0] = np.float32(-127.0)  # largest magnitude, negative: scale exactly 1
    x[2 * block : 3 * block] = ties
    x[3 * block : 4 * block] *= np.float32(1000.0)
    return x


def q8_0_act() -> None:
    x = activation_input(32)
    q = quantize(x.reshape(1, -1), T.Q8_0)  # bit-exact with quantize_row_q8_0_ref
    write("q8_0_act", q.tobytes(), x)


def q8_k_act() -> None:
    x = activation_input(256)
    out = bytearray()
    for b in x.reshape(-1, 256):
        amax = np.float32(0.0)
        mx = np.float32(0.0)
        for v in b:
            if abs(v) > amax:
                amax, mx = np.float32(abs(v)), v
        if amax == 0:
            out += np.zeros(1, "<f4").tobytes() + bytes(256) + bytes(32)
            continue
        iscale = np.float32(-127.0) / mx
        qs = np.minimum(np.rint(iscale * b), 127).astype(np.int8)  # rint: ties to even
        bsums = qs.astype(np.int16).reshape(16, 16).sum(axis=1).astype("<i2")
        d = np.float32(1.0) / iscale
        out += np.array([d], "<f4").tobytes() + qs.tobytes() + bsums.tobytes()
    write("q8_k_act", bytes(out), x)


def main() -> None:
    OUT.mkdir(exist_ok=True)
    for ty in (T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0):
        quantized_from_floats(ty)
    # Offsets of the f16 fields inside each block.
    quantized_from_bytes(T.Q2_K, [80, 82])
    quantized_from_bytes(T.Q3_K, [108])
    quantized_from_bytes(T.Q4_K, [0, 2])
    quantized_from_bytes(T.Q5_K, [0, 2])
    quantized_from_bytes(T.Q6_K, [208])
    quantized_from_bytes(T.IQ4_NL, [0])
    quantized_from_bytes(T.IQ4_XS, [0])
    q8_k_blocks()
    q8_0_act()
    q8_k_act()


if __name__ == "__main__":
    main()
