"""Qwen3.5's hybrid served: the tiny random-weight qwen35 (three gated
DeltaNet layers and one gated attention layer,
tests/fixtures/make_tiny_models.py). A slot of it holds keys and values for
the attention layer and a recurrent state for the others. The state sums every
token it has read, so a prompt that extends what the slot holds reads only its
new tokens, while one that parts from it earlier cannot cut the state back and
reads from zero when no checkpoint stands at or before the parting
(test_qwen35_checkpoints.py beside this file holds the checkpoints): these
tests hold the counts and the tokens to that."""

from __future__ import annotations

import json
import sys

import pytest

from paths import FIXTURES
from server_process import ServerProcess, http

sys.path.insert(0, str(FIXTURES))
import make_tiny_models  # noqa: E402

PROMPT = [1] + [(i * 37 + 11) % 1500 + 20 for i in range(30)]


@pytest.fixture(scope="module")
def model_path():
    return make_tiny_models.ensure("qwen35")


def complete(server, prompt: list[int], n: int = 4) -> dict:
    body = {"prompt": prompt, "n_predict": n, "temperature": 0, "return_tokens": True, "cache_prompt": True}
    status, _, raw = http(server.url + "/completion", body)
    assert status == 200, raw
    return json.loads(raw)


def test_a_prompt_that_extends_the_slot_reads_only_its_new_tokens(model_path):
    with ServerProcess(model_path, "-np", "1") as s:
        first = complete(s, PROMPT)
        held = PROMPT + first["tokens"][:-1]
        more = [300, 301, 302, 303, 304]
        second = complete(s, held + more)
        assert second["timings"]["cache_n"] == len(held), second["timings"]
        assert second["timings"]["prompt_n"] == len(more), second["timings"]


def test_a_prompt_that_parts_earlier_reads_from_zero_with_a_clean_state(model_path):
    """Parting inside what the slot holds: nothing is reused (a state cannot
    lose its last tokens), and the tokens drawn are those of the same prompt
    read by a fresh server, which a state left over would change."""
    parted = PROMPT[:12] + [900, 901, 902, 903]
    with ServerProcess(model_path, "-np", "1") as fresh:
        want = complete(fresh, parted, 6)
    with ServerProcess(model_path, "-np", "1") as s:
        complete(s, PROMPT)
        got = complete(s, parted, 6)
        assert got["timings"]["cache_n"] == 0, got["timings"]
        assert got["timings"]["prompt_n"] == len(parted), got["timings"]
        assert got["tokens"] == want["tokens"]


def test_a_saved_hybrid_slot_continues_identically_in_a_new_server(model_path, tmp_path):
    with ServerProcess(model_path, "-np", "1", "--slot-save-path", str(tmp_path)) as s:
        first = complete(s, PROMPT)
        held = PROMPT + first["tokens"][:-1]
        status, _, raw = http(f"{s.url}/slots/0?action=save", {"filename": "hybrid.bin"})
        assert status == 200 and json.loads(raw)["n_saved"] == len(held), raw
        want = complete(s, held + [400, 401], 6)
    with ServerProcess(model_path, "-np", "1", "--slot-save-path", str(tmp_path)) as s:
        status, _, raw = http(f"{s.url}/slots/0?action=restore", {"filename": "hybrid.bin"})
        assert status == 200 and json.loads(raw)["n_restored"] == len(held), raw
        got = complete(s, held + [400, 401], 6)
        assert got["timings"]["cache_n"] == len(held), got["timings"]
        assert got["tokens"] == want["tokens"]
