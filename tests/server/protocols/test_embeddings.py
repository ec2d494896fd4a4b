"""Embeddings (`ember.server.protocols.embeddings`, over `ember.Model.embed`):
the final hidden states pooled and normalized as llama.cpp does it, held
against llama.cpp's own embeddings of the same file (recorded from its
llama-server in tests/fixtures/embeddings), then served over OpenAI's
/v1/embeddings and llama-server's /embedding."""

from __future__ import annotations

import base64
import gzip
import json

import numpy as np
import pytest

from ember.errors import InvalidRequestError
from ember.server.cli import OptionError, parse_options
from paths import FIXTURES
from server_process import ServerProcess, error_of, http

openai = pytest.importorskip("openai")

REFERENCE = json.loads((FIXTURES / "embeddings" / "smollm2_llamacpp.json").read_text())
TEXTS = REFERENCE["texts"]


def cosine(a, b) -> float:
    return float(np.dot(a, b) / np.linalg.norm(a) / np.linalg.norm(b))


@pytest.mark.parametrize("pooling", ["mean", "last", "cls"])
def test_embeddings_match_llama_cpp(smollm2, pooling):
    refs = [np.array(v, dtype=np.float32) for v in REFERENCE["pooling"][pooling]]
    for i, text in enumerate(TEXTS):
        got = smollm2.embed(text, pooling=pooling)
        assert got.shape == refs[i].shape
        # llama.cpp computes in its own kernels (and rounds activations its own way).
        assert cosine(got, refs[i]) > 0.999, (pooling, text)
        assert np.abs(got - refs[i]).max() < 0.02
        # And nearer llama.cpp's embedding of this text than of the other.
        assert cosine(got, refs[i]) > cosine(got, refs[1 - i])


def test_pooling_reads_the_hidden_states(smollm2):
    ids = smollm2.tokenize("Pooling over these positions.")
    rows = smollm2.hidden_states(ids)
    assert rows.shape == (len(ids), smollm2.n_embd)
    assert np.array_equal(smollm2.embed(ids, pooling="none"), rows)
    for pooling, raw in [("mean", rows.mean(axis=0)), ("cls", rows[0]), ("last", rows[-1])]:
        assert np.allclose(smollm2.embed(ids, pooling=pooling, normalize=-1), raw, atol=1e-6)
        assert np.allclose(smollm2.embed(ids, pooling=pooling), raw / np.linalg.norm(raw), atol=1e-6)


def test_normalizations_are_llama_cpps(smollm2):
    ids = smollm2.tokenize("Norms of one kind and another.")
    raw = smollm2.embed(ids, pooling="mean", normalize=-1).astype(np.float64)
    assert np.isclose(np.abs(smollm2.embed(ids, pooling="mean", normalize=0)).max(), 32760.0, rtol=1e-5)
    assert np.isclose(np.abs(smollm2.embed(ids, pooling="mean", normalize=1)).sum(), 1.0, rtol=1e-5)
    assert np.isclose(np.linalg.norm(smollm2.embed(ids, pooling="mean", normalize=2)), 1.0, rtol=1e-5)
    p3 = smollm2.embed(ids, pooling="mean", normalize=3).astype(np.float64)
    assert np.isclose((np.abs(p3) ** 3).sum(), 1.0, rtol=1e-4)
    # A large p approaches the max norm, without overflowing on the way.
    assert np.isclose(np.abs(smollm2.embed(ids, pooling="mean", normalize=10_000)).max(), 1.0, rtol=1e-2)
    assert cosine(p3, raw) > 0.99999  # every norm only scales


def test_bad_pooling_is_refused_by_name(smollm2):
    with pytest.raises(InvalidRequestError, match="pooling"):
        smollm2.embed("x", pooling="max")
    with pytest.raises(InvalidRequestError, match="embd_normalize"):
        smollm2.embed("x", pooling="mean", normalize=-5)
    assert smollm2.pooling_type == "none"  # the file says nothing: as llama.cpp reads it


# -- served --------------------------------------------------------------------

@pytest.fixture(scope="module")
def server(smollm2_path):
    with ServerProcess(smollm2_path, "--embeddings", "--pooling", "mean", "-np", "2") as s:
        yield s


def test_the_openai_client_gets_the_models_embeddings(server, smollm2):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    r = client.embeddings.create(model="any", input=TEXTS, encoding_format="float")
    assert [d.index for d in r.data] == [0, 1]
    for text, d in zip(TEXTS, r.data):
        assert np.array_equal(np.array(d.embedding, dtype=np.float32), smollm2.embed(text, pooling="mean"))
    n = sum(len(smollm2.tokenize(t, add_special=True, parse_special=True)) for t in TEXTS)
    assert r.usage.prompt_tokens == r.usage.total_tokens == n
    # The client's default asks for base64: the same floats, packed.
    packed = client.embeddings.create(model="any", input=TEXTS[0])
    assert np.array_equal(np.array(packed.data[0].embedding, dtype=np.float32), smollm2.embed(TEXTS[0], pooling="mean"))


def test_token_ids_and_base64_on_the_wire(server, smollm2):
    ids = smollm2.tokenize(TEXTS[1], add_special=True, parse_special=True)
    status, _, raw = http(server.url + "/v1/embeddings", {"input": ids, "encoding_format": "base64"})
    assert status == 200, raw
    data = json.loads(raw)["data"]
    v = np.frombuffer(base64.b64decode(data[0]["embedding"]), dtype="<f4")
    assert np.array_equal(v, smollm2.embed(TEXTS[1], pooling="mean"))


def test_llama_servers_own_route_and_shape(server, smollm2):
    status, _, raw = http(server.url + "/embedding", {"content": TEXTS[0]})
    assert status == 200, raw
    body = json.loads(raw)
    assert body[0]["index"] == 0 and len(body[0]["embedding"]) == 1
    assert np.array_equal(np.array(body[0]["embedding"][0], dtype=np.float32), smollm2.embed(TEXTS[0], pooling="mean"))
    status, _, raw = http(server.url + "/embeddings", {"content": TEXTS, "embd_normalize": -1})
    raw_vectors = json.loads(raw)
    assert len(raw_vectors) == 2
    assert np.allclose(raw_vectors[1]["embedding"][0], smollm2.embed(TEXTS[1], pooling="mean", normalize=-1))


@pytest.mark.parametrize("route,body,field", [
    ("/v1/embeddings", {}, "input"),
    ("/v1/embeddings", {"input": []}, "input"),
    ("/v1/embeddings", {"input": [[]]}, "input[0]"),
    ("/v1/embeddings", {"input": [1, 99_999_999]}, "input[0]"),
    ("/v1/embeddings", {"input": [{"text": "x"}]}, "input[0]"),
    ("/v1/embeddings", {"input": "x", "encoding_format": "hex"}, "encoding_format"),
    ("/v1/embeddings", {"input": "x", "dimensions": 0}, "dimensions"),
    ("/v1/embeddings", {"input": "x", "dimensions": 100_000}, "dimensions"),
    ("/embedding", {"content": "x", "embd_normalize": -7}, "embd_normalize"),
    ("/embedding", {}, "content"),
    ("/v1/embeddings", {"input": ["a"] * 2049}, "input"),
])
def test_bad_embedding_requests_are_400s(server, route, body, field):
    e = error_of(http(server.url + route, body), 400)
    assert e["message"].startswith(field), e


def test_an_input_longer_than_a_slot_is_refused(server):
    e = error_of(http(server.url + "/v1/embeddings", {"input": [1] * 5000}), 400)
    assert e["type"] == "exceed_context_size_error"


def test_embeddings_need_the_flag_and_none_pooling_only_serves_embedding(smollm2_path, smollm2):
    with ServerProcess(smollm2_path) as s:
        e = error_of(http(s.url + "/v1/embeddings", {"input": "x"}), 501)
        assert "--embeddings" in e["message"]
        status, _, raw = http(s.url + "/api/embed", {"input": "x"})  # Ollama's route too
        assert status == 501 and "--embeddings" in json.loads(raw)["error"]
        status, _, _ = http(s.url + "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                            "max_tokens": 1})
        assert status == 200
    with ServerProcess(smollm2_path, "--embeddings") as s:  # the file says nothing: none
        e = error_of(http(s.url + "/v1/embeddings", {"input": "x"}), 400)
        assert "--pooling" in e["message"]
        status, _, raw = http(s.url + "/embedding", {"content": TEXTS[0]})
        rows = json.loads(raw)[0]["embedding"]
        ids = smollm2.tokenize(TEXTS[0], add_special=True, parse_special=True)
        assert np.array_equal(np.array(rows, dtype=np.float32), smollm2.hidden_states(ids))


def test_pooling_flags_are_checked(smollm2_path):
    opts, lines = parse_options(["-m", str(smollm2_path), "--embeddings", "--pooling", "last"], {},
                                mem_available=8 << 30)
    assert opts.embeddings and opts.pooling == "last"
    assert any("embeddings: at /v1/embeddings" in line for line in lines)
    opts, _ = parse_options(["-m", str(smollm2_path)], {"LLAMA_ARG_EMBEDDINGS": "1", "LLAMA_ARG_POOLING": "cls"},
                            mem_available=8 << 30)
    assert opts.embeddings and opts.pooling == "cls"
    for argv, needle in [(["--embeddings", "--pooling", "max"], "pooling"), (["--pooling", "mean"], "--embeddings")]:
        with pytest.raises(OptionError, match=needle):
            parse_options(["-m", str(smollm2_path), *argv], {}, mem_available=8 << 30)


def test_dimensions_shorten_and_renormalise(server, smollm2):
    """OpenAI's `dimensions`: the first N components, unit length again (or
    normalized as `embd_normalize` asks on llama-server's route)."""
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    full = np.array(client.embeddings.create(model="m", input=TEXTS[0]).data[0].embedding)
    short = np.array(client.embeddings.create(model="m", input=TEXTS[0], dimensions=64).data[0].embedding)
    assert short.shape == (64,) and np.isclose(np.linalg.norm(short), 1.0, rtol=1e-5)
    assert np.allclose(short, full[:64] / np.linalg.norm(full[:64]), atol=1e-6)
    status, _, raw = http(server.url + "/embedding", {"content": TEXTS[0], "dimensions": 32, "embd_normalize": 1})
    v = np.array(json.loads(raw)[0]["embedding"][0])
    assert status == 200 and v.shape == (32,) and np.isclose(np.abs(v).sum(), 1.0, rtol=1e-5)


def test_the_documented_2048_inputs_fit_in_one_request(server):
    # 2,048 inputs of a sentence each, the last one empty: the body is read whole and every input
    # checked (a 400 naming the last, not a 413), without the cost of 2,047 embeddings.
    inputs = [f"Sentence number {i} is a sentence of several words, as inputs often are." for i in range(2047)]
    body = json.dumps({"input": [*inputs, ""]}).encode()
    assert len(body) > 64 * 1024 + 16 * 2048, "larger than the generating routes' cap at this context"
    e = error_of(http(server.url + "/v1/embeddings", raw=body), 400)
    assert e["message"].startswith("input[2047]"), e
    some = http(server.url + "/v1/embeddings", {"input": inputs[:40]})
    assert some[0] == 200 and len(json.loads(some[2])["data"]) == 40
    # Past the cap: a body that inflates beyond it is refused without being read whole.
    bomb = gzip.compress(b'{"input": "' + b"x" * (9 * 2**20) + b'"}')
    status, _, out = http(server.url + "/v1/embeddings", raw=bomb, headers={"Content-Encoding": "gzip"})
    assert status == 413 and b"8454144 bytes" in out, out


def test_the_servers_normalization_is_every_requests_default(smollm2_path, smollm2):
    with ServerProcess(smollm2_path, "--embeddings", "--pooling", "mean", "--embd-normalize", "1") as s:
        taxicab = smollm2.embed(TEXTS[0], pooling="mean", normalize=1)
        for route, body in (("/v1/embeddings", {"input": TEXTS[0]}), ("/embedding", {"content": TEXTS[0]})):
            status, _, raw = http(s.url + route, body)
            assert status == 200, raw
            out = json.loads(raw)
            v = out["data"][0]["embedding"] if route == "/v1/embeddings" else out[0]["embedding"][0]
            assert np.allclose(v, taxicab), route
        # A request's own wins.
        status, _, raw = http(s.url + "/v1/embeddings", {"input": TEXTS[0], "embd_normalize": 2})
        assert np.allclose(json.loads(raw)["data"][0]["embedding"], smollm2.embed(TEXTS[0], pooling="mean"))
