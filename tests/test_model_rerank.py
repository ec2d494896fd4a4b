"""Reranking in process (`ember.Model.rerank`): a reranker's classification
head over the last position of each (query, document) pair, written as
llama-server writes the pair. No reranker is small enough to fetch here, so
the family is shown on a tiny random-weight Qwen3 reranker (made of the tiny
qwen3 model as llama.cpp's converter makes Qwen3-Reranker) held against
llama.cpp's scores in tests/fixtures/tiny/qwen3rank.json."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import ember
from ember.errors import InvalidRequestError

FIXTURES = Path(__file__).resolve().parent / "fixtures"
sys.path.insert(0, str(FIXTURES))
import make_tiny_models  # noqa: E402


@pytest.fixture(scope="module")
def reranker():
    return ember.Model(make_tiny_models.ensure_reranker(), n_ctx=512)


def test_scores_match_llama_cpp(reranker):
    ref = json.loads((FIXTURES / "tiny" / "qwen3rank.json").read_text())
    assert reranker.can_rank and reranker.pooling_type == "rank"
    for pair in ref["pairs"]:
        scores = reranker.rank(reranker.rerank_prompt(pair["query"], pair["document"]))
        # Probabilities of yes and no (a softmax, as llama.cpp takes Qwen3's); within llama.cpp's
        # 8-bit activations' rounding of them.
        assert sum(scores) == pytest.approx(1.0, abs=1e-6)
        assert scores == pytest.approx(pair["scores"], abs=0.01), pair
    docs = [p["document"] for p in ref["pairs"][:2]]
    assert reranker.rerank(ref["pairs"][0]["query"], docs) == [
        reranker.rank(reranker.rerank_prompt(ref["pairs"][0]["query"], d))[0] for d in docs]


def test_the_pair_is_written_in_the_files_rerank_template(reranker):
    ids = reranker.rerank_prompt("what is it", "a <b> tag")
    text = make_tiny_models.QWEN3_RERANK_TEMPLATE.replace("{query}", "what is it").replace("{document}", "a <b> tag")
    assert ids == reranker.tokenize(text, add_special=False, parse_special=True)


def test_without_a_template_the_pair_is_query_then_document(smollm2):
    # SmolLM2's vocabulary adds no EOS or SEP between them, as llama-server writes it.
    bos = [smollm2._native.bos_id] if smollm2._native.add_bos else []
    want = bos + smollm2.tokenize("the query", add_special=False) + smollm2.tokenize("a document", add_special=False)
    assert smollm2.rerank_prompt("the query", "a document") == want


def test_a_model_without_a_head_does_not_rank(smollm2):
    assert not smollm2.can_rank
    with pytest.raises(InvalidRequestError, match="classification head"):
        smollm2.rank([1, 2, 3])
