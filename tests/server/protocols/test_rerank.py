"""llama-server's /rerank (`ember.server.protocols.embeddings.rerank`) on a
real `ember serve --reranking`: Jina's and Cohere's answer and TEI's, best
first, each score the one the model gives in process (held against
llama.cpp's in tests/test_model_rerank.py), on the tiny random-weight Qwen3
reranker: its order says nothing of relevance, only that the scores are the
model's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import ember
from ember.server.cli import OptionError, parse_options
from paths import FIXTURES
from server_process import ServerProcess, error_of, http, post_ok

sys.path.insert(0, str(FIXTURES))
import make_tiny_models  # noqa: E402

QUERY = "what is a lighthouse"
DOCS = ["A tower with a light that guides ships.", "Bananas are yellow.", "Keepers climbed the stairs at dusk.",
        "Le phare éclaire la mer."]


@pytest.fixture(scope="module")
def reranker_path() -> Path:
    return make_tiny_models.ensure_reranker()


@pytest.fixture(scope="module")
def server(reranker_path):
    with ServerProcess(reranker_path, "--reranking") as s:
        yield s


@pytest.fixture(scope="module")
def model(reranker_path):
    return ember.Model(reranker_path, n_ctx=512)


@pytest.fixture(scope="module")
def scores(model) -> list[float]:
    return model.rerank(QUERY, DOCS)


@pytest.mark.parametrize("path", ["/rerank", "/reranking", "/v1/rerank", "/v1/reranking"])
def test_documents_come_back_best_first_with_the_models_scores(server, model, scores, path):
    r = post_ok(server, path, {"query": QUERY, "documents": DOCS, "model": "mine"})
    assert r["object"] == "list" and r["model"] == "mine"
    order = sorted(range(len(DOCS)), key=lambda i: -scores[i])
    assert [x["index"] for x in r["results"]] == order
    assert [x["relevance_score"] for x in r["results"]] == pytest.approx([scores[i] for i in order], abs=1e-6)
    assert all("document" not in x for x in r["results"])
    n = sum(len(model.rerank_prompt(QUERY, d)) for d in DOCS)
    assert r["usage"] == {"prompt_tokens": n, "total_tokens": n}


def test_top_n_and_the_texts_asked_back(server, scores):
    r = post_ok(server, "/v1/rerank", {"query": QUERY, "documents": DOCS, "top_n": 2, "return_documents": True})
    best = sorted(range(len(DOCS)), key=lambda i: -scores[i])[:2]
    assert [(x["index"], x["document"]["text"]) for x in r["results"]] == [(i, DOCS[i]) for i in best]


def test_texts_get_teis_answer(server, scores):
    r = post_ok(server, "/rerank", {"query": QUERY, "texts": DOCS, "return_text": True})
    order = sorted(range(len(DOCS)), key=lambda i: -scores[i])
    assert [(x["index"], x["text"]) for x in r] == [(i, DOCS[i]) for i in order]
    assert [x["score"] for x in r] == pytest.approx([scores[i] for i in order], abs=1e-6)
    assert all("text" not in x for x in post_ok(server, "/rerank", {"query": QUERY, "texts": DOCS}))


@pytest.mark.parametrize("body, field", [
    ({"documents": DOCS}, "query"),
    ({"query": 7, "documents": DOCS}, "query"),
    ({"query": QUERY}, "documents"),
    ({"query": QUERY, "documents": []}, "documents"),
    ({"query": QUERY, "documents": "one"}, "documents"),
    ({"query": QUERY, "documents": ["a", {"text": "b"}]}, "documents"),
    ({"query": QUERY, "documents": DOCS, "texts": DOCS}, "documents"),
    ({"query": QUERY, "texts": [1]}, "texts"),
    ({"query": QUERY, "documents": DOCS, "top_n": 0}, "top_n"),
])
def test_a_misshapen_request_is_a_400_naming_the_field(server, body, field):
    assert error_of(http(server.url + "/rerank", body), 400)["param"] == field


def test_a_ranking_server_makes_no_embeddings_and_a_plain_one_no_ranks(server, plain_server):
    e = error_of(http(server.url + "/v1/embeddings", {"input": "hello"}), 400)
    assert "POST /rerank" in e["message"]
    e = error_of(http(plain_server.url + "/rerank", {"query": QUERY, "documents": DOCS}), 501)
    assert "--reranking" in e["message"]


def test_the_flags_are_checked(smollm2_path, reranker_path):
    opts, lines = parse_options(["-m", str(reranker_path), "--rerank"], {}, mem_available=8 << 30)
    assert opts.embeddings and opts.pooling == "rank" and any("reranking: at /rerank" in x for x in lines)
    opts, _ = parse_options(["-m", str(reranker_path)], {"LLAMA_ARG_RERANKING": "1"}, mem_available=8 << 30)
    assert opts.pooling == "rank"
    with pytest.raises(OptionError, match="cannot go with --reranking"):
        parse_options(["-m", str(reranker_path), "--reranking", "--pooling", "mean"], {}, mem_available=8 << 30)
    # A model without a classification head cannot rank: the load fails saying so.
    r = subprocess.run([sys.executable, "-m", "ember", "serve", "-m", str(smollm2_path), "--reranking", "--port", "0"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "classification head" in r.stderr, r.stderr[-500:]
