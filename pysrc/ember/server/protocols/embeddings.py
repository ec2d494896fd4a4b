"""Embeddings, as llama-server serves them with `--embeddings`: OpenAI's
`POST /v1/embeddings` and llama-server's own `POST /embedding` (also
`/embeddings`).

An embedding is the model's final hidden states (after the output norm)
pooled over the input's positions as `--pooling` (or the file) says, and
normalized as `embd_normalize` says (euclidean by default). Each input is read
in a session of its own, beside the slots' passes: the worker pool takes one
operation at a time, so the two interleave without sharing any state."""

from __future__ import annotations

import base64
from typing import Any, Union

import msgspec
from aiohttp import web

from ember.errors import EmberError, InvalidRequestError
from ember.server import wire
from ember.server.errors import ApiError, exceed_context, from_engine_error
from ember.server.http import json_response, read_body, reads
from ember.server.state import ServerState

__all__ = ["add_routes"]


class EmbeddingsRequest(msgspec.Struct, forbid_unknown_fields=False):
    # A string, token ids, or a list of either (checked by hand: msgspec takes one array type per union).
    input: Union[str, list[Any], None] = None
    # llama-server's own field for the same, on /embedding.
    content: Union[str, list[Any], None] = None
    model: str | None = None
    encoding_format: str = "float"
    dimensions: int | None = None
    # None: the server's (--embd-normalize, default 2: euclidean)
    embd_normalize: int | None = None


def _inputs(model, raw, field: str) -> list[list[int]]:
    """Token ids of each input: a string, token ids, or a list of either."""
    if isinstance(raw, str):
        raw = [raw]
    elif raw and all(isinstance(x, int) and not isinstance(x, bool) for x in raw):
        raw = [raw]
    if not raw:
        raise ApiError(400, f"{field}: at least one input is required", param=field)
    out = []
    for i, x in enumerate(raw):
        if isinstance(x, str):
            ids = model.tokenize(x, add_special=True, parse_special=True)
        elif isinstance(x, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in x):
            ids = list(x)
            bad = next((t for t in ids if not 0 <= t < model.n_vocab), None)
            if bad is not None:
                raise ApiError(400, f"{field}[{i}]: token id {bad} is outside the vocabulary (0..{model.n_vocab - 1})",
                               param=field)
        else:
            raise ApiError(400, f"{field}[{i}]: expected a string or a list of token ids", param=field)
        if not ids:
            raise ApiError(400, f"{field}[{i}]: empty", param=field)
        out.append(ids)
    return out


def pooling_of(state: ServerState) -> str:
    """How this server pools: --pooling, else what the model file says."""
    return state.opts.pooling or state.model.pooling_type


def require_embeddings(state: ServerState) -> None:
    """Refuses a request for vectors where the server makes none."""
    if not state.opts.embeddings:
        raise ApiError(501, "this server does not serve embeddings: start it with --embeddings",
                       type="not_supported_error")
    if pooling_of(state) == "rank":
        raise ApiError(400, "this server ranks (its pooling is rank): a reranker's pooled outputs are scores, not "
                       "embeddings; POST /rerank")


async def _embed(request: web.Request, openai: bool) -> tuple[EmbeddingsRequest, list[list[int]], list]:
    state: ServerState = request.app["state"]
    require_embeddings(state)
    req = wire.decode(await read_body(request), EmbeddingsRequest)
    field = "input" if req.input is not None or openai else "content"
    raw = req.input if req.input is not None else req.content
    if raw is None:
        raise ApiError(400, f"{field}: required", param=field)
    if isinstance(raw, list) and len(raw) > MAX_INPUTS and not all(isinstance(x, int) for x in raw):
        raise ApiError(400, f"{field}: at most {MAX_INPUTS} inputs a request, got {len(raw)}", param=field)
    pooling = pooling_of(state)
    if openai and pooling == "none":
        raise ApiError(400, "pooling none gives a vector per token, which /v1/embeddings cannot answer: start the "
                       "server with --pooling mean, cls or last, or ask /embedding", param="input")
    if req.encoding_format not in ("float", "base64"):
        raise ApiError(400, f"encoding_format: expected float or base64, got {req.encoding_format!r}",
                       param="encoding_format")
    n_embd = state.model.n_embd
    if req.dimensions is not None and not 1 <= req.dimensions <= n_embd:
        raise ApiError(400, f"dimensions: must be between 1 and this model's {n_embd}, got {req.dimensions}",
                       param="dimensions")
    if req.embd_normalize is None:
        req.embd_normalize = state.opts.embd_normalize
    elif req.embd_normalize < -1:
        raise ApiError(400, f"embd_normalize: expected -1, 0, 1, 2 or a larger p, got {req.embd_normalize}",
                       param="embd_normalize")
    inputs = _inputs(state.model, raw, field)
    for ids in inputs:
        if len(ids) > state.slot_ctx:
            raise exceed_context(len(ids), state.slot_ctx)
    vectors = await embed_each(request, inputs, pooling, req.embd_normalize)
    if req.dimensions is not None and req.dimensions < n_embd:
        vectors = [shortened(v, req.dimensions, req.embd_normalize) for v in vectors]
    return req, inputs, vectors


def shortened(v, dimensions: int, normalize: int):
    """`v`'s first `dimensions` components, normalized again as before (the
    shortening OpenAI's `dimensions` asks for); each row of a per-token
    array alike."""
    import numpy as np

    from ember.model import _normalized

    cut = np.asarray(v)[..., :dimensions].astype(np.float64)
    rows = [_normalized(r, normalize) for r in cut] if cut.ndim == 2 else _normalized(cut, normalize)
    return np.asarray(rows, dtype=np.float32)


#: Inputs one request may hold, as OpenAI's API allows (the body cap,
#: `ServerState.body_limit`, leaves room for them).
MAX_INPUTS = 2048


async def embed_each(request: web.Request, inputs: list[list[int]], pooling: str, normalize: int = 2) -> list:
    """Each input's embedding (see `_on_engine`)."""
    model = request.app["state"].model
    return await _on_engine(request, inputs, lambda ids: model.embed(ids, pooling=pooling, normalize=normalize))


async def _on_engine(request: web.Request, items: list, work) -> list:
    """`work(item)` of each item, computed by the engine between its passes
    (it is the model's one owner); a client that leaves stops the rest."""
    state: ServerState = request.app["state"]
    out = []
    for at in range(0, len(items), _PER_CALL):
        if request.transport is None or request.transport.is_closing():
            raise ConnectionResetError("client gone")
        batch = items[at:at + _PER_CALL]
        try:
            out += await state.engine.call(lambda batch=batch: [work(item) for item in batch])
        except InvalidRequestError as e:
            raise ApiError(400, str(e)) from None
        except EmberError as e:
            raise from_engine_error(e) from None
    return out


#: Inputs read in one call on the engine thread: the call waits for a
#: pass to end, so one each would cost a pass's wait per input, and more
#: would hold other conversations' next tokens back longer.
_PER_CALL = 16


@reads(EmbeddingsRequest)
async def openai_embeddings(request: web.Request) -> web.Response:
    state: ServerState = request.app["state"]
    req, inputs, vectors = await _embed(request, openai=True)

    def encoded(v):
        if req.encoding_format == "base64":
            return base64.b64encode(v.astype("<f4").tobytes()).decode()
        return v.tolist()

    n = sum(len(ids) for ids in inputs)
    return json_response({
        "object": "list", "model": req.model or state.model_id(),
        "data": [{"object": "embedding", "index": i, "embedding": encoded(v)} for i, v in enumerate(vectors)],
        "usage": {"prompt_tokens": n, "total_tokens": n},
    })


@reads(EmbeddingsRequest)
async def llama_embedding(request: web.Request) -> web.Response:
    # llama-server's shape: per input, a list of vectors (one per token without pooling, else the one pooled).
    _, _, vectors = await _embed(request, openai=False)
    return json_response([{"index": i, "embedding": v.tolist() if v.ndim == 2 else [v.tolist()]}
                          for i, v in enumerate(vectors)])


# -- reranking ---------------------------------------------------------------------

class RerankRequest(msgspec.Struct, forbid_unknown_fields=False):
    # Both checked by hand, to say what is wrong by name.
    query: Any = None
    # Jina's and Cohere's name for the texts ranked, or TEI's (whose answer is TEI's bare list)
    documents: Any = None
    texts: Any = None
    top_n: int | None = None
    # each result carries its text: TEI's return_text, or Jina's and Cohere's return_documents
    return_text: bool = False
    return_documents: bool = False
    model: str | None = None


def _documents(req: RerankRequest) -> tuple[str, list[str]]:
    if req.documents is not None and req.texts is not None:
        raise ApiError(400, "documents: send documents (Jina's and Cohere's form) or texts (TEI's), not both",
                       param="documents")
    field = "texts" if req.texts is not None else "documents"
    docs = req.texts if req.texts is not None else req.documents
    if not isinstance(docs, list) or not docs:
        raise ApiError(400, f"{field}: expected a non-empty list of strings", param=field)
    if len(docs) > MAX_INPUTS:
        raise ApiError(400, f"{field}: at most {MAX_INPUTS} a request, got {len(docs)}", param=field)
    bad = next((i for i, d in enumerate(docs) if not isinstance(d, str)), None)
    if bad is not None:
        raise ApiError(400, f"{field}[{bad}]: expected a string (this server ranks text)", param=field)
    return field, docs


@reads(RerankRequest)
async def rerank(request: web.Request) -> web.Response:
    """llama-server's `/rerank` (also `/reranking`, `/v1/rerank`,
    `/v1/reranking`): each document's relevance to the query, by a reranker
    model's score of the pair, best first; Jina's and Cohere's answer, or
    TEI's when the documents come as `texts`."""
    state: ServerState = request.app["state"]
    if not state.opts.embeddings or pooling_of(state) != "rank":
        raise ApiError(501, "this server does not rerank: start it with --reranking and a reranker model",
                       type="not_supported_error")
    req = wire.decode(await read_body(request), RerankRequest)
    if not isinstance(req.query, str):
        raise ApiError(400, "query: required, a string" if req.query is None else "query: expected a string",
                       param="query")
    field, docs = _documents(req)
    if req.top_n is not None and req.top_n < 1:
        raise ApiError(400, f"top_n: must be at least 1, got {req.top_n}", param="top_n")
    model = state.model
    prompts = [model.rerank_prompt(req.query, d) for d in docs]
    for ids in prompts:
        if len(ids) > state.slot_ctx:
            raise exceed_context(len(ids), state.slot_ctx)
    scores = await rank_each(request, prompts)
    order = sorted(range(len(docs)), key=lambda i: -scores[i])[:req.top_n]
    if field == "texts":
        return json_response([{"index": i, "score": scores[i], **({"text": docs[i]} if req.return_text else {})}
                              for i in order])
    n = sum(len(ids) for ids in prompts)
    return json_response({
        "model": req.model or state.model_id(), "object": "list", "usage": {"prompt_tokens": n, "total_tokens": n},
        "results": [{"index": i, "relevance_score": scores[i],
                     **({"document": {"text": docs[i]}} if req.return_documents else {})} for i in order],
    })


async def rank_each(request: web.Request, prompts: list[list[int]]) -> list[float]:
    """Each prompt's score, its first label's (see `_on_engine`)."""
    model = request.app["state"].model
    return await _on_engine(request, prompts, lambda ids: model.rank(ids)[0])


def add_routes(app: web.Application) -> None:
    for path in ("/rerank", "/reranking", "/v1/rerank", "/v1/reranking"):
        app.router.add_post(path, rerank)
    app.router.add_post("/v1/embeddings", openai_embeddings)
    app.router.add_post("/embedding", llama_embedding)
    app.router.add_post("/embeddings", llama_embedding)
