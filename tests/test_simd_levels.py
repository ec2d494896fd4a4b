"""The kernel level ember runs at, chosen once: the highest this CPU runs,
or the one `EMBER_SIMD` names, so the scalar twins of every SIMD path
(matrix products, attention, norms and activations, the delta rule) run on
any machine. Both levels give the same answers; a level ember cannot honour
is refused at load."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "fixtures"))
import make_tiny_models  # noqa: E402

PROBE = textwrap.dedent("""
    import sys
    import numpy as np
    from ember import Model, _native
    out = sys.argv[1]
    for i, path in enumerate(sys.argv[2:]):
        m = Model(path, n_ctx=256)
        ids = [(3 + 37 * i) % m.n_vocab for i in range(90)]
        np.save(f"{out}/{i}.npy", m.logits(ids))
    print(_native.simd_level())
""")


def probe(paths: list[str], simd: str | None, out) -> tuple[str, list]:
    """The level a process ran at, and each model's logits there."""
    import numpy as np

    env = {k: v for k, v in os.environ.items() if k != "EMBER_SIMD"}
    if simd is not None:
        env["EMBER_SIMD"] = simd
    out.mkdir()
    r = subprocess.run([sys.executable, "-c", PROBE, str(out), *paths], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip(), [np.load(out / f"{i}.npy") for i in range(len(paths))]


def test_the_scalar_level_gives_the_detected_levels_answers(tmp_path):
    import numpy as np

    paths = [str(make_tiny_models.ensure(a)) for a in ("llama", "gemma3", "qwen35f32", "qwen35")]
    (level, detected), (scalar_level, scalar) = probe(paths, None, tmp_path / "a"), probe(paths, "scalar", tmp_path / "b")
    assert scalar_level == "scalar"
    if level == "scalar":
        pytest.skip("this CPU runs no SIMD level: nothing to compare")
    for p, a, b in zip(paths, detected, scalar):
        assert a.shape == b.shape
        diff = np.abs(a - b)
        if "f32" in p:
            # Nothing quantized on the way: the levels meet to f32 rounding.
            assert diff.max() < 1e-4, (p, diff.max())
        else:
            # The float dot kernels sum in another order, and the 8-bit
            # activations of the next product turn that into a few
            # hundredths of a logit at most, as in the hybrids' prefill
            # against decode (tests/fixtures/make_tiny_models.py).
            assert diff.mean() < 0.02 and diff.max() < 0.5, (p, diff.mean(), diff.max())
        # The top choice is the same wherever it leads clearly: random weights
        # leave near ties, which a few hundredths of a logit may turn.
        top2 = np.sort(a, axis=-1)[..., -2:]
        clear = (top2[..., 1] - top2[..., 0]) > 4 * diff.max(axis=-1)
        assert clear.mean() > 0.5, (p, clear.mean())
        assert (a.argmax(-1) == b.argmax(-1))[clear].all(), p


@pytest.mark.parametrize("value, says", [("avx9", "expected scalar, avx2, avx512vnni or avx512bf16"),
                                          ("", "expected scalar, avx2, avx512vnni or avx512bf16")])
def test_a_level_ember_cannot_honour_is_refused_at_load(value, says):
    env = {**os.environ, "EMBER_SIMD": value}
    code = f"from ember import Model; Model({str(make_tiny_models.ensure('llama'))!r})"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and f"EMBER_SIMD={value}: {says}" in r.stderr, r.stderr
