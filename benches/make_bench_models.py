"""Random-weight GGUF files at the shapes of the models people run, for
speed comparisons (`benches/compare_llamacpp.py -m FILE`): random weights
cost what trained ones cost to multiply.

    python benches/make_bench_models.py [--shape NAME ...] [--quant q4_0|q8_0|q4_k_m] [--out DIR]
    python benches/make_bench_models.py --like FILE ... [--out DIR]

`--like FILE` writes FILE's twin with random weights: the same metadata,
tensors, shapes and block types byte for byte up to where the data starts,
so FILE may be only its header (`head -c`), which is how a real model's
shape travels to a machine it cannot be copied to whole.

Shapes (scaled to fit this kind of machine where the real model would not):
  llama3.2-3b   Llama 3.2 3B: 28 layers of 3072, 24 query and 8 key/value
                heads of 128, feed-forwards of 8192, tied embeddings over
                SmolLM2's 49,152 tokens (the real model has 128,256)
  gemma4-e2b    Gemma 4 E2B as llama.cpp reads it: 35 layers of 1536, a
                4 sliding : 1 full pattern (heads of 256 and 512, one
                key/value head), the last 20 layers reading earlier caches,
                doubled feed-forwards there, per-layer embeddings of 256
                (a 262,144 x 8,960 table that stays in the mapping)
  qwen3moe-a3b  Qwen3-30B-A3B's layer (2048 wide, 32 query and 4 key/value
                heads of 128, experts 768 wide, 8 used) with 64 experts and
                12 layers instead of 128 and 48: about 2 GB at Q4_0
  qwen35-0.8b   Qwen3.5-0.8B: 24 layers of 1024, every fourth gated
                attention (8 query and 2 key/value heads of 256, rope on a
                quarter), the others gated DeltaNet (16 key and 16 value
                heads of 128, a convolution of 4), tied embeddings over
                Gemma 3's 262,144 tokens (the real model has 248,320)

Quantized blocks are written directly: random quants under one small scale
(every f16 scale field set, so no block is inf or NaN), which takes seconds
where quantizing random floats would take minutes. `q4_k_m` follows
llama.cpp's Q4_K_M mix: Q4_K matrices, Q6_K for the value projections,
the down projections and the output head. Vocabularies come from the test
models in $EMBER_TEST_MODELS (SmolLM2's 49,152 tokens for the Qwen shape,
Gemma 3's 262,144 for Gemma 4's).
"""
from __future__ import annotations

import argparse
import os
import sys
from functools import partial
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "fixtures"))
import make_tiny_models as tiny  # noqa: E402  (vocabularies and their writer)

# Bytes per block, elements per block, and where the f16 scales sit.
_BLOCKS = {
    Q.Q4_0: (18, 32, [0]),
    Q.Q4_1: (20, 32, [0, 2]),
    Q.Q5_0: (22, 32, [0]),
    Q.Q8_0: (34, 32, [0]),
    Q.Q4_K: (144, 256, [0, 2]),
    Q.Q5_K: (176, 256, [0, 2]),
    Q.Q6_K: (210, 256, [208]),
}
_SCALE = np.float16(0.004).tobytes()


def random_rows(rng: np.random.Generator, ty: Q, rows: int, cols: int) -> np.ndarray:
    """`rows` rows of `cols` in block format `ty`: random bytes, valid scales."""
    if ty == Q.F32:
        return (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02)
    if ty == Q.F16:
        return (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float16)
    size, per, scales = _BLOCKS[ty]
    assert cols % per == 0, f"rows of {cols} are not whole {ty.name} blocks"
    blocks = rng.integers(0, 256, size=(rows, cols // per, size), dtype=np.uint8)
    for at in scales:
        blocks[:, :, at:at + 2] = np.frombuffer(_SCALE, dtype=np.uint8)
    return blocks.reshape(rows, -1)


def add_matrix(w: gguf.GGUFWriter, rng, mix: "Mix", name: str, kind: str, rows: int, cols: int) -> None:
    """A random matrix of `rows` rows of `cols`, in the block type `mix` gives its kind."""
    ty = mix(kind)
    w.add_tensor(name, random_rows(rng, ty, rows, cols), raw_dtype=ty if ty not in (Q.F32, Q.F16) else None)


def add_norm(w: gguf.GGUFWriter, name: str, n: int) -> None:
    """A norm's weights: ones."""
    w.add_tensor(name, np.ones(n, dtype=np.float32))


def add_vocab(w: gguf.GGUFWriter, model: str, pre: str | None) -> int:
    """A test model's vocabulary written to `w`; returns its size."""
    vocab = tiny.load_vocab(model)
    tiny.write_vocab(w, vocab, pre)
    return len(vocab["tokens"])


class Mix:
    """Which block type each kind of matrix gets."""

    def __init__(self, quant: str):
        self.quant = quant

    def __call__(self, kind: str) -> Q:
        if self.quant == "q4_0":
            return Q.Q4_0
        if self.quant == "q8_0":
            return Q.Q8_0
        # Q4_K_M: Q6_K where llama.cpp's mix spends more bits.
        return Q.Q6_K if kind in ("attn_v", "ffn_down", "output") else Q.Q4_K


def gemma4_e2b(w: gguf.GGUFWriter, rng, mix: Mix) -> None:
    n_layer, e, n_head, hd_swa, hd_full, n_ff, npl, shared = 35, 1536, 8, 256, 512, 6144, 256, 20
    swa = [il % 5 != 4 for il in range(n_layer)]
    owned = n_layer - shared
    n_ffs = [n_ff if il < owned else 2 * n_ff for il in range(n_layer)]
    w.add_context_length(131072)
    w.add_embedding_length(e)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ffs)
    w.add_head_count(n_head)
    w.add_head_count_kv(1)
    w.add_rope_freq_base(1000000.0)
    w.add_rope_freq_base_swa(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_key_length(hd_full)
    w.add_value_length(hd_full)
    w.add_key_length_swa(hd_swa)
    w.add_value_length_swa(hd_swa)
    w.add_rope_dimension_count(hd_full)
    w.add_rope_dimension_count_swa(hd_swa)
    w.add_sliding_window(512)
    w.add_sliding_window_pattern(swa)
    w.add_shared_kv_layers(shared)
    w.add_embedding_length_per_layer_input(npl)
    w.add_final_logit_softcapping(30.0)
    nv = add_vocab(w, "gemma3", None)

    m = partial(add_matrix, w, rng, mix)

    norm = partial(add_norm, w)

    m("token_embd.weight", "embd", nv, e)
    m("per_layer_token_embd.weight", "embd", nv, n_layer * npl)
    m("per_layer_model_proj.weight", "proj", n_layer * npl, e)
    norm("per_layer_proj_norm.weight", npl)
    n_rot = int(hd_full * 0.25 / 2)
    w.add_tensor("rope_freqs.weight", np.array([1.0] * n_rot + [1e30] * (hd_full // 2 - n_rot), dtype=np.float32))
    for il in range(n_layer):
        p = f"blk.{il}."
        hd = hd_swa if swa[il] else hd_full
        norm(p + "attn_norm.weight", e)
        m(p + "attn_q.weight", "attn_q", n_head * hd, e)
        if il < owned:
            m(p + "attn_k.weight", "attn_k", hd, e)
            m(p + "attn_v.weight", "attn_v", hd, e)
            norm(p + "attn_k_norm.weight", hd)
        norm(p + "attn_q_norm.weight", hd)
        m(p + "attn_output.weight", "attn_o", e, n_head * hd)
        norm(p + "post_attention_norm.weight", e)
        norm(p + "ffn_norm.weight", e)
        m(p + "ffn_gate.weight", "ffn_gate", n_ffs[il], e)
        m(p + "ffn_up.weight", "ffn_up", n_ffs[il], e)
        m(p + "ffn_down.weight", "ffn_down", e, n_ffs[il])
        norm(p + "post_ffw_norm.weight", e)
        m(p + "inp_gate.weight", "per_layer", npl, e)
        m(p + "proj.weight", "per_layer", e, npl)
        norm(p + "post_norm.weight", e)
        w.add_tensor(p + "layer_output_scale.weight", np.array([0.5], dtype=np.float32))
    norm("output_norm.weight", e)


def qwen3moe_a3b(w: gguf.GGUFWriter, rng, mix: Mix) -> None:
    n_layer, e, n_head, n_kv, hd, n_expert, n_used, n_ff_exp = 12, 2048, 32, 4, 128, 64, 8, 768
    w.add_context_length(40960)
    w.add_embedding_length(e)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(6144)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_rope_freq_base(1000000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_expert_count(n_expert)
    w.add_expert_used_count(n_used)
    w.add_expert_feed_forward_length(n_ff_exp)
    nv = add_vocab(w, "smollm2", "qwen2")

    def m(name, kind, rows, cols, n=1):
        ty = mix(kind)
        data = random_rows(rng, ty, rows * n, cols)
        if n > 1:
            data = data.reshape(n, rows, -1)
        w.add_tensor(name, data, raw_dtype=ty if ty not in (Q.F32, Q.F16) else None)

    norm = partial(add_norm, w)

    m("token_embd.weight", "embd", nv, e)
    for il in range(n_layer):
        p = f"blk.{il}."
        norm(p + "attn_norm.weight", e)
        m(p + "attn_q.weight", "attn_q", n_head * hd, e)
        m(p + "attn_k.weight", "attn_k", n_kv * hd, e)
        m(p + "attn_v.weight", "attn_v", n_kv * hd, e)
        norm(p + "attn_q_norm.weight", hd)
        norm(p + "attn_k_norm.weight", hd)
        m(p + "attn_output.weight", "attn_o", e, n_head * hd)
        norm(p + "ffn_norm.weight", e)
        # The router in f32, as the converter leaves it.
        w.add_tensor(p + "ffn_gate_inp.weight", rng.standard_normal((n_expert, e), dtype=np.float32) * 0.02)
        m(p + "ffn_gate_exps.weight", "ffn_gate", n_ff_exp, e, n_expert)
        m(p + "ffn_up_exps.weight", "ffn_up", n_ff_exp, e, n_expert)
        m(p + "ffn_down_exps.weight", "ffn_down", e, n_ff_exp, n_expert)
    norm("output_norm.weight", e)
    m("output.weight", "output", nv, e)


def qwen35_0_8b(w: gguf.GGUFWriter, rng, mix: Mix) -> None:
    n_layer, e, n_head, n_kv, hd, n_ff = 24, 1024, 8, 2, 256, 3584
    d_state, n_k_heads, n_v_heads, d_conv = 128, 16, 16, 4
    key_dim, value_dim = d_state * n_k_heads, d_state * n_v_heads
    recurrent = [(il + 1) % 4 != 0 for il in range(n_layer)]
    w.add_context_length(262144)
    w.add_embedding_length(e)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_freq_base(10000000.0)
    w.add_rope_dimension_count(hd // 4)
    w.add_rope_dimension_sections([11, 11, 10, 0])
    w.add_layer_norm_rms_eps(1e-6)
    w.add_ssm_conv_kernel(d_conv)
    w.add_ssm_inner_size(value_dim)
    w.add_ssm_state_size(d_state)
    w.add_ssm_time_step_rank(n_v_heads)
    w.add_ssm_group_count(n_k_heads)
    w.add_array("qwen35.attention.recurrent_layers", recurrent)
    nv = add_vocab(w, "gemma3", None)

    m = partial(add_matrix, w, rng, mix)

    def vec(name, values):
        w.add_tensor(name, np.asarray(values, dtype=np.float32))

    m("token_embd.weight", "output", nv, e)
    for il in range(n_layer):
        p = f"blk.{il}."
        vec(p + "attn_norm.weight", np.ones(e))
        if recurrent[il]:
            m(p + "attn_qkv.weight", "attn_q", 2 * key_dim + value_dim, e)
            m(p + "attn_gate.weight", "attn_q", value_dim, e)
            vec(p + "ssm_conv1d.weight", rng.standard_normal((2 * key_dim + value_dim, d_conv)) * 0.3)
            vec(p + "ssm_dt.bias", np.zeros(n_v_heads))
            vec(p + "ssm_a", -rng.uniform(0.5, 2.0, n_v_heads))
            m(p + "ssm_beta.weight", "attn_k", n_v_heads, e)
            m(p + "ssm_alpha.weight", "attn_k", n_v_heads, e)
            vec(p + "ssm_norm.weight", np.ones(d_state))
            m(p + "ssm_out.weight", "attn_o", e, value_dim)
        else:
            m(p + "attn_q.weight", "attn_q", 2 * n_head * hd, e)
            m(p + "attn_k.weight", "attn_k", n_kv * hd, e)
            m(p + "attn_v.weight", "attn_v", n_kv * hd, e)
            vec(p + "attn_q_norm.weight", np.ones(hd))
            vec(p + "attn_k_norm.weight", np.ones(hd))
            m(p + "attn_output.weight", "attn_o", e, n_head * hd)
        vec(p + "post_attention_norm.weight", np.ones(e))
        m(p + "ffn_gate.weight", "ffn_gate", n_ff, e)
        m(p + "ffn_up.weight", "ffn_up", n_ff, e)
        m(p + "ffn_down.weight", "ffn_down", e, n_ff)
    vec("output_norm.weight", np.ones(e))


def llama32_3b(w: gguf.GGUFWriter, rng, mix: Mix) -> None:
    n_layer, e, n_head, n_kv, hd, n_ff = 28, 3072, 24, 8, 128, 8192
    w.add_context_length(131072)
    w.add_embedding_length(e)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_rope_freq_base(500000.0)
    w.add_rope_dimension_count(hd)
    w.add_layer_norm_rms_eps(1e-5)
    nv = add_vocab(w, "smollm2", None)

    m = partial(add_matrix, w, rng, mix)

    norm = partial(add_norm, w)

    m("token_embd.weight", "output", nv, e)
    for il in range(n_layer):
        p = f"blk.{il}."
        norm(p + "attn_norm.weight", e)
        m(p + "attn_q.weight", "attn_q", n_head * hd, e)
        m(p + "attn_k.weight", "attn_k", n_kv * hd, e)
        m(p + "attn_v.weight", "attn_v", n_kv * hd, e)
        m(p + "attn_output.weight", "attn_o", e, n_head * hd)
        norm(p + "ffn_norm.weight", e)
        m(p + "ffn_gate.weight", "ffn_gate", n_ff, e)
        m(p + "ffn_up.weight", "ffn_up", n_ff, e)
        m(p + "ffn_down.weight", "ffn_down", e, n_ff)
    norm("output_norm.weight", e)


def like(source: Path, out: Path, rng) -> None:
    """`source`'s twin with random weights (see the module's doc)."""
    md, tensors, data_start = tiny.read_header(source)
    align = md.get("general.alignment", 32)
    with open(source, "rb") as f:
        header = f.read(data_start)
    if len(header) != data_start:
        sys.exit(f"{source}: cut before its data starts ({len(header)} of {data_start} bytes)")
    with open(out, "wb") as f:
        f.write(header)
        for name, dims, ty, offset in sorted(tensors, key=lambda t: t[3]):
            f.write(b"\0" * (data_start + offset - f.tell()))
            ty = Q(ty)
            cols, rows = dims[0], int(np.prod(dims[1:], dtype=np.int64))
            if ty == Q.F32 and len(dims) == 1:
                data = np.ones(cols, dtype=np.float32)  # a norm's weights
            elif ty in (Q.F32, Q.F16) or ty in _BLOCKS:
                data = random_rows(rng, ty, rows, cols)
            else:
                sys.exit(f"{source}: {name} is {ty.name}, which --like does not write yet")
            f.write(data.tobytes())
            f.write(b"\0" * (-f.tell() % align))


SHAPES = {
    "llama3.2-3b": ("llama", llama32_3b),
    "gemma4-e2b": ("gemma4", gemma4_e2b),
    "qwen3moe-a3b": ("qwen3moe", qwen3moe_a3b),
    "qwen35-0.8b": ("qwen35", qwen35_0_8b),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", nargs="*", default=None, choices=list(SHAPES))
    ap.add_argument("--like", nargs="+", type=Path, default=[], metavar="FILE",
                    help="random weights in each FILE's layout, written as STEM.random.gguf")
    ap.add_argument("--quant", default="q4_0", choices=["q4_0", "q8_0", "q4_k_m"])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("EMBER_BENCH_MODELS", Path.home() / ".cache/ember/bench-models")))
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    for source in a.like:
        path = a.out / (source.name.removesuffix(".gguf") + ".random.gguf")
        tmp = path.with_suffix(".partial")
        like(source, tmp, np.random.default_rng(7))
        tmp.replace(path)
        print(f"{path} {path.stat().st_size / 2**30:.2f} GiB")
    shapes = a.shape if a.shape is not None else ([] if a.like else list(SHAPES))
    for name in shapes:
        arch, build = SHAPES[name]
        path = a.out / f"{name}.{a.quant}.gguf"
        if path.is_file():
            print(f"{path} exists")
            continue
        tmp = path.with_suffix(".partial")
        w = gguf.GGUFWriter(str(tmp), arch)
        w.add_name(f"random {name}")
        w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0)
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
        build(w, np.random.default_rng(7), Mix(a.quant))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        tmp.replace(path)
        print(f"{path} {path.stat().st_size / 2**30:.2f} GiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
