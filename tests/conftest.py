"""Shared fixtures: the two test models (loaded once per run) and llama.cpp's
golden outputs. A missing model fails with the command that fetches it."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

# The helpers beside this file (server_process, thinking_model, api_helpers, ...)
# are imported by test modules in subfolders too: pytest's "prepend" import mode
# puts only a test module's own folder on sys.path, so this one is put there.
sys.path.insert(0, str(Path(__file__).resolve().parent))

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA3_FILE = "gemma-3-270m-q4_k_m.gguf"


def models_dir() -> Path:
    env = os.environ.get("EMBER_TEST_MODELS")
    return Path(env) if env else Path.home() / ".cache" / "ember" / "models"


def model_path(name: str) -> Path:
    if os.environ.get("EMBER_SKIP_MODEL_TESTS") == "1":
        pytest.skip("EMBER_SKIP_MODEL_TESTS=1")
    p = models_dir() / name
    if not p.is_file():
        pytest.fail(f"test model {p} is missing: run `python tests/fetch_test_models.py` (or set EMBER_TEST_MODELS)")
    return p


def golden(name: str) -> dict:
    return json.loads((GOLDEN / name).read_text(encoding="utf-8"))


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    return model_path(SMOLLM2_FILE)


@pytest.fixture(scope="session")
def gemma3_path() -> Path:
    return model_path(GEMMA3_FILE)


@pytest.fixture(scope="session")
def smollm2_fim_path(smollm2_path, tmp_path_factory) -> Path:
    """A copy of SmolLM2 whose metadata names FIM tokens (neither test model's
    vocabulary has them), for /infill. SmolLM2 was not trained on them."""
    import subprocess

    from api_helpers import SMOLLM2_FIM_IDS

    copy = tmp_path_factory.mktemp("fim") / "smollm2-fim.gguf"
    flags = [a for name, id in SMOLLM2_FIM_IDS.items() for a in ("--special-token-by-id", name, str(id))]
    subprocess.run([sys.executable, "-m", "gguf.scripts.gguf_new_metadata", *flags, str(smollm2_path), str(copy)],
                   check=True, capture_output=True)
    return copy


@pytest.fixture(scope="session")
def smollm2(smollm2_path):
    import ember

    return ember.Model(smollm2_path, n_ctx=2048)


@pytest.fixture(scope="session")
def gemma3(gemma3_path):
    import ember

    return ember.Model(gemma3_path, n_ctx=2048)


@pytest.fixture(scope="session")
def smollm2_golden() -> dict:
    return golden("smollm2-135m-instruct-q4_1.json")


@pytest.fixture(scope="session")
def gemma3_golden() -> dict:
    return golden("gemma-3-270m-q4_k_m.json")
