"""Ollama's API over the engine, for the clients and tools written against
it: `/api/chat`, `/api/generate`, `/api/embed` (and the older
`/api/embeddings`), `/api/tags`, `/api/show`, `/api/ps`, `/api/version`, and
`GET /` answering that the server runs.

Replies stream as newline-delimited JSON unless `"stream": false` (Ollama
streams by default); durations are nanoseconds; `options` carries the
sampling settings under Ollama's names. A chat is the same conversation as on
the other chat routes, through the same template, grammars and reply shaper:
a thought comes back in `thinking`, calls in `tool_calls` with their
arguments as objects. ember serves the one model it loaded, whatever name a
request gives; the routes that manage models (pull, create, delete...) answer
that they are not served."""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import time
from datetime import datetime, timezone
from typing import Any, Union

import msgspec
from aiohttp import web

from ember import __version__
from ember.chat.events import TextDelta, ThoughtDelta
from ember.chat.output import ChatShaper
from ember.chat.request import AnswerFormat, ChatRequest
from ember.model import Completion, Piece
from ember.sampling import SamplingParams
from ember.server import wire
from ember.server.chat_prompt import Origin, chat_prompt, located, message_locator
from ember.server.errors import ApiError
from ember.server.generation import Generation, piece_logprobs
from ember.server.http import Envelope, json_response, read_body, reads
from ember.server.protocols.embeddings import MAX_INPUTS, embed_each, pooling_of, require_embeddings
from ember.server.protocols.llama_server import insertion
from ember.server.sleep import keep_alive_seconds, lets_go
from ember.server.state import ServerState

__all__ = ["ENVELOPES", "add_routes"]

#: Errors on Ollama's routes: `{"error": message}`, whole or as a stream's line.
ENVELOPES = {"/api/": Envelope(lambda e: {"error": e.message}, lines=True)}


# -- requests -------------------------------------------------------------------

class Options(msgspec.Struct, forbid_unknown_fields=False):
    """Ollama's `options`, those that shape a reply. Of the load settings it
    also takes, `num_ctx` bounds the request's context (see `_context`); the
    others (num_gpu, num_thread, use_mmap...) change only the speed, and are
    ember's start-time flags."""

    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    typical_p: float | None = None
    repeat_penalty: float | None = None
    repeat_last_n: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    stop: Union[str, list[str], None] = None
    num_predict: int | None = None
    num_ctx: int | None = None
    mirostat: int | None = None
    # Older Ollama's samplers (today's drops them): read so that a request turning one on is refused.
    tfs_z: float | None = None
    penalize_newline: bool | None = None


class Message(msgspec.Struct, forbid_unknown_fields=False):
    role: str
    content: str = ""
    thinking: str | None = None
    images: list[Any] | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_name: str | None = None
    # the id of the call a tool message answers (newer Ollama's; its calls carry ids)
    tool_call_id: str | None = None


class _Common(msgspec.Struct, forbid_unknown_fields=False):
    model: str | None = None
    format: Any = None
    options: Options | None = None
    stream: bool = True
    think: Union[bool, str, None] = None
    keep_alive: Any = None
    # ember's extensions, as on its other routes: a GBNF grammar or (llama-server's)
    # a JSON Schema the reply is held to
    grammar: Any = None
    json_schema: Any = None
    # Each token's log-probability, and its top_logprobs likeliest rivals', beside the reply's text
    logprobs: bool = False
    top_logprobs: int | None = None


class ChatBody(_Common):
    messages: list[Message] = []
    tools: list[dict[str, Any]] | None = None
    # ember's extension: OpenAI's tool_choice ("required" or a named function forces a call)
    tool_choice: Any = None


class GenerateBody(_Common):
    prompt: str = ""
    system: str | None = None
    template: str | None = None
    suffix: str | None = None
    raw: bool = False
    context: list[int] | None = None
    images: list[Any] | None = None


class EmbedBody(msgspec.Struct, forbid_unknown_fields=False):
    model: str | None = None
    input: Union[str, list[str], None] = None
    # the older /api/embeddings
    prompt: str | None = None
    truncate: bool = True
    dimensions: int | None = None
    options: Options | None = None
    keep_alive: Any = None


class ModelBody(msgspec.Struct, forbid_unknown_fields=False):
    model: str | None = None
    name: str | None = None


# -- into the chat request ----------------------------------------------------------

_OPTIONS = ("temperature", "top_k", "top_p", "min_p", "typical_p", "repeat_penalty", "repeat_last_n",
            "presence_penalty", "frequency_penalty", "seed", "stop", "mirostat")


#: The option names a body might carry at its top level (and OpenAI's name
#: for the reply's length), where Ollama itself drops them without a word: a
#: client asking `"temperature": 0` there would get sampled replies it did
#: not ask for, so ember refuses them by name, saying where each belongs.
_PLACES = {**{k: f"options.{k}" for k in (*_OPTIONS, "num_predict")}, "max_tokens": "options.num_predict"}
_Misplaced = msgspec.defstruct("_Misplaced", [(k, Any, msgspec.UNSET) for k in _PLACES])


def _decode(raw: bytes, type):
    body = wire.decode(raw, type)
    misplaced = msgspec.json.decode(raw, type=_Misplaced)
    for k in misplaced.__struct_fields__:
        if getattr(misplaced, k) is not msgspec.UNSET:
            raise ApiError(400, f"{k}: Ollama's routes read it from options; send {_PLACES[k]}", param=k)
    wire.check_logprobs("top_logprobs", body.top_logprobs)
    if body.top_logprobs and not body.logprobs:
        raise ApiError(400, "top_logprobs: requires logprobs to be true", param="top_logprobs")
    return body


def _keep_alive(request: web.Request, value) -> float | None | bool:
    """Applies a request's keep_alive, as Ollama does: how long the model
    stays loaded after it (None: for good; False: the request said nothing,
    and the server's own idle time holds again)."""
    try:
        seconds = keep_alive_seconds(value)
    except ValueError as e:
        raise ApiError(400, f"keep_alive: {e}", param="keep_alive") from None
    request.app["sleeper"].keep_alive(seconds)
    return seconds


def _fields(loc: tuple) -> tuple:
    """The sampling fields as Ollama nests them."""
    return ("options", *loc) if loc and loc[0] in _OPTIONS else loc


def _context(options: Options | None) -> tuple[str, int] | None:
    """The context a request asks for with `num_ctx`, which Ollama reloads a
    model to give. A smaller one than a slot's is honoured (the prompt must
    fit it, the reply ends where it is full); a larger one gets a slot's, as
    Ollama gives a model's trained context to a request for more."""
    n = options.num_ctx if options is not None else None
    if n is None:
        return None
    if n < 1:
        raise ApiError(400, f"options.num_ctx: must be at least 1, got {n}", param="options.num_ctx")
    return "options.num_ctx", n


def _sampling(state: ServerState, body: _Common) -> SamplingParams:
    o = body.options or Options()
    if o.tfs_z not in (None, 1, 1.0):
        raise ApiError(400, "options.tfs_z: tail-free sampling is not supported", param="options.tfs_z")
    if o.penalize_newline is False:
        raise ApiError(400, "options.penalize_newline: the penalties here weigh a newline as any other token",
                       param="options.penalize_newline")
    try:
        sent = wire.Sampling(**{k: getattr(o, k) for k in _OPTIONS})
        params = wire.sampling_options(sent, state.model.n_vocab, state.opts.sampling)
    except ApiError as e:
        raise located(e, _fields) from None
    if body.logprobs:
        params.n_probs = max(1, body.top_logprobs or 0)  # the drawn token's own needs at least one
    return params


def _answer(body: _Common) -> AnswerFormat | None:
    fmt, asked = body.format, []
    if fmt == "json":
        asked.append(("format", {"json_object": True}))
    elif isinstance(fmt, dict):
        asked.append(("format", {"json_schema": fmt}))
    elif fmt not in (None, ""):
        raise ApiError(400, f'format: expected "json" or a JSON Schema object, got {json.dumps(fmt)[:40]}',
                       param="format")
    return wire.answer_format(asked + wire.extension_answers(body))


def _think(body: _Common) -> dict:
    """The chat request's reasoning fields for `think`."""
    if isinstance(body.think, bool):
        return {"chat_template_kwargs": {"enable_thinking": body.think}}
    if isinstance(body.think, str):
        if body.think not in ("low", "medium", "high"):
            raise ApiError(400, f"think: expected true, false, low, medium or high, got {body.think!r}", param="think")
        return {"reasoning_effort": body.think}
    return {}


def _max_tokens(state: ServerState, body: _Common) -> int:
    n = body.options.num_predict if body.options is not None else None
    # -1: until the turn ends, -2: until the context is full; both end at the context here.
    return wire.max_tokens("options.num_predict", -1 if n == -2 else n, state.opts.n_predict)


def _chat_messages(body: ChatBody) -> list[dict]:
    """The conversation as the chat template reads it. A tool message answers
    the call of the turn before whose id it gives; without one (older Ollama's
    calls carry no ids, its tool messages name the tool) the first call still
    waiting for a result (of that tool, when named)."""
    if not body.messages:
        raise ApiError(400, "messages: at least one message is required", param="messages")
    out: list[dict] = []
    waiting: list[tuple[str, str]] = []  # (call id, tool name) not yet answered
    for i, m in enumerate(body.messages):
        where = f"messages[{i}]"
        if m.role not in ("system", "user", "assistant", "tool"):
            raise ApiError(400, f"{where}.role: expected system, user, assistant or tool, got {m.role!r}",
                           param=f"{where}.role")
        if m.images:
            raise ApiError(400, f"{where}.images: this server reads text only", param=f"{where}.images")
        msg: dict = {"role": m.role, "content": m.content}
        if m.thinking:
            msg["reasoning_content"] = m.thinking
        if m.tool_calls:
            if m.role != "assistant":
                raise ApiError(400, f"{where}.tool_calls: only assistant messages carry tool calls",
                               param=f"{where}.tool_calls")
            calls, waiting = [], []
            for k, tc in enumerate(m.tool_calls):
                fn = tc.get("function")
                if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                    raise ApiError(400, f"{where}.tool_calls[{k}].function: expected an object with a name",
                                   param=f"{where}.tool_calls")
                args = fn.get("arguments", {})
                cid = tc.get("id") if isinstance(tc.get("id"), str) and tc.get("id") else f"call_{i}_{k}"
                calls.append({"id": cid, "type": "function", "function": {
                    "name": fn["name"], "arguments": args if isinstance(args, str) else json.dumps(args)}})
                waiting.append((cid, fn["name"]))
            msg["tool_calls"] = calls
        if m.role == "tool":
            if m.tool_call_id is not None:
                match = next((w for w in waiting if w[0] == m.tool_call_id), None)
                if match is None:
                    raise ApiError(400, f"{where}.tool_call_id: no call of the assistant message before waits for a "
                                   f"result under id {m.tool_call_id!r}", param=f"{where}.tool_call_id")
                if m.tool_name not in (None, match[1]):
                    raise ApiError(400, f"{where}.tool_name: call {m.tool_call_id!r} is of {match[1]!r}, not "
                                   f"{m.tool_name!r}", param=f"{where}.tool_name")
            else:
                match = next((w for w in waiting if m.tool_name in (None, w[1])), None)
            if match is None:
                raise ApiError(400, f"{where}: a tool message answers a call of the assistant message before it, "
                               "and none is waiting" + (f" for {m.tool_name!r}" if m.tool_name else ""),
                               param=where)
            waiting.remove(match)
            msg["tool_call_id"] = match[0]
        out.append(msg)
    return out


async def _prompt(state: ServerState, body: _Common, messages: list[dict], tools=None, tool_choice=None,
            after: list[int] | None = None) -> tuple[list[int], ChatShaper, SamplingParams]:
    """The prompt's ids (after `after`, an earlier reply's context, when
    given), the reply's shaper and the generation's options."""
    params = _sampling(state, body)
    chat = ChatRequest(messages=messages, tools=tools, tool_choice=tool_choice, answer=_answer(body), **_think(body))
    # Ollama's messages are the chat messages one for one: only a call's arguments sit elsewhere.
    origins = [Origin(("messages", i), args_field=("function", "arguments"),
                      calls=[("messages", i, "tool_calls", k) for k in range(len(m.get("tool_calls", [])))])
               for i, m in enumerate(messages)]
    prompt, shaper = await chat_prompt(state, chat, params, locate=message_locator(origins, _fields), after=after)
    return prompt, shaper, params


# -- replies --------------------------------------------------------------------------

def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _stats(gen: Generation, c: Completion, t0: float) -> dict:
    ns = lambda ms: int(ms * 1e6)  # noqa: E731
    return {"total_duration": int((time.perf_counter() - t0) * 1e9), "load_duration": 0,
            "prompt_eval_count": len(gen.prompt), "prompt_eval_duration": ns(c.prompt_ms),
            "eval_count": len(c.tokens), "eval_duration": ns(c.gen_ms)}


def _done_reason(shaper: ChatShaper) -> str:
    return "length" if shaper.stop.cut else "stop"


def _calls(shaper: ChatShaper) -> list[dict]:
    """The reply's calls as Ollama writes them: arguments as objects."""
    out = []
    for k, call in enumerate(shaper.tools.calls if shaper.called else []):
        try:
            args = json.loads(call.arguments or "{}")
        except ValueError as e:
            raise ApiError(500, f"the model's tool call {call.name} has arguments that are not JSON: {e}") from None
        out.append({"id": call.id, "function": {"index": k, "name": call.name, "arguments": args}})
    return out


class _Lines:
    """A newline-delimited JSON stream, started with its first line."""

    def __init__(self, request: web.Request):
        self.request, self.resp = request, None

    async def send(self, obj: dict) -> None:
        if self.resp is None:
            self.resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
            await self.resp.prepare(self.request)
            self.request["sse"] = self.resp
        await self.resp.write(msgspec.json.encode(obj) + b"\n")

    async def error(self, e: ApiError) -> None:
        await ENVELOPES["/api/"].in_stream(self.resp, e)

    async def end(self) -> web.StreamResponse:
        await self.resp.write_eof()
        return self.resp


async def _run(request: web.Request, gen: Generation, shaper: ChatShaper, body: _Common, chunk,
               last) -> web.StreamResponse:
    """Drives a generation: `chunk(events)` is the streamed object for the
    reply's new text (None when it has none), `last(c)` the final one; with
    `logprobs`, each object carries its tokens' (a token whose text the
    shaper still holds travels with the next object sent). Ollama streams
    lines of JSON, not server-sent events, so it keeps this driver of its own
    beside `Generation.stream`."""
    model, k = request.app["state"].model, body.top_logprobs or 0
    held: list[dict] = []

    def hold(ev) -> None:
        if body.logprobs and isinstance(ev, Piece) and ev.token is not None:
            held.append(piece_logprobs(model, ev, k))

    def with_logprobs(obj: dict) -> dict:
        if body.logprobs:
            obj["logprobs"] = held[:]
            held.clear()
        return obj

    if not body.stream:
        async with gen:
            async for ev in gen.events():
                hold(ev)
        shaper.read_whole(gen.completion)
        return json_response(with_logprobs(last(gen.completion, whole=True)))
    out = _Lines(request)
    async with gen:
        await gen.first_event()
        try:
            async for ev in gen.events():
                hold(ev)
                events = shaper.feed(ev.text) if isinstance(ev, Piece) else shaper.finish(ev)
                obj = chunk(events)
                if obj is not None:
                    await out.send(with_logprobs(obj))
                if isinstance(ev, Completion):
                    await out.send(with_logprobs(last(ev, whole=False)))
        except ApiError as e:
            if out.resp is None:
                raise  # nothing sent yet: the error still has its status
            await out.error(e)
    return await out.end()


def _text_of(events: list, kind: type) -> str:
    return "".join(ev.text for ev in events if isinstance(ev, kind))


@reads(ChatBody)
async def chat(request: web.Request) -> web.StreamResponse:
    state: ServerState = request.app["state"]
    body = _decode(await read_body(request), ChatBody)
    keep = _keep_alive(request, body.keep_alive)
    if not body.messages:
        # Ollama's way of loading a model (no messages: the model is ready), or with keep_alive 0 of
        # letting it go, as on /api/generate.
        reason = "unload" if lets_go(keep) else "load"
        return json_response({"model": body.model or state.model_id(), "created_at": _now(),
                              "message": {"role": "assistant", "content": ""}, "done": True, "done_reason": reason})
    max_tokens = _max_tokens(state, body)
    prompt, shaper, params = await _prompt(state, body, _chat_messages(body), body.tools, body.tool_choice)
    gen = Generation(request, prompt, max_tokens, params, context=_context(body.options))
    t0, name = time.perf_counter(), body.model or state.model_id()

    def chunk(events):
        content, thinking = _text_of(events, TextDelta), _text_of(events, ThoughtDelta)
        if not content and not thinking:
            return None
        msg = {"role": "assistant", "content": content}
        if thinking:
            msg["thinking"] = thinking
        return {"model": name, "created_at": _now(), "message": msg, "done": False}

    def last(c: Completion, whole: bool):
        msg: dict = {"role": "assistant", "content": "".join(shaper.content) if whole else ""}
        if whole and shaper.thought:
            msg["thinking"] = "".join(shaper.thought)
        if shaper.called:
            # Calls travel whole, in the last object, as Ollama sends a call once it is parsed.
            msg["tool_calls"] = _calls(shaper)
        return {"model": name, "created_at": _now(), "message": msg, "done": True, "done_reason": _done_reason(shaper),
                **_stats(gen, c, t0)}

    return await _run(request, gen, shaper, body, chunk, last)


@reads(GenerateBody)
async def generate(request: web.Request) -> web.StreamResponse:
    state: ServerState = request.app["state"]
    model = state.model
    body = _decode(await read_body(request), GenerateBody)
    keep = _keep_alive(request, body.keep_alive)
    name = body.model or state.model_id()
    if body.template:
        raise ApiError(400, "template: Go templates are not read here; the model's own chat template is used",
                       param="template")
    if body.suffix:
        # An insertion, in the model's fill-in-the-middle tokens (as Ollama's code models' templates
        # write it), in place of the chat template: nothing of a turn's may go with it.
        for field in ("raw", "system"):
            if getattr(body, field):
                raise ApiError(400, f"{field}: cannot go with suffix, whose insertion is written in the model's "
                               "fill-in-the-middle tokens", param=field)
    if body.images:
        raise ApiError(400, "images: this server reads text only", param="images")
    if not body.prompt and not body.context and not body.suffix:
        # Ollama's way of loading a model (nothing to generate, the model is ready), or with
        # keep_alive 0 of letting it go (it goes once this request is over).
        reason = "unload" if lets_go(keep) else "load"
        return json_response({"model": name, "created_at": _now(), "response": "", "done": True, "done_reason": reason})
    max_tokens = _max_tokens(state, body)
    bad = next((t for t in body.context or [] if not 0 <= t < model.n_vocab), None)
    if bad is not None:
        raise ApiError(400, f"context: token id {bad} is outside the vocabulary (0..{model.n_vocab - 1})",
                       param="context")
    if body.raw or body.suffix:
        params = _sampling(state, body)
        _think(body)  # checked, though a raw prompt has no template to pass it to
        answer = _answer(body)
        params.grammar = answer.grammar if answer is not None else None
        if body.suffix:
            before = model.tokenize(body.prompt, add_special=False, parse_special=False)
            prompt = list(body.context or []) + insertion(state, before, body.suffix)
        else:
            prompt = list(body.context or []) + model.tokenize(body.prompt, add_special=not body.context,
                                                               parse_special=True)
        shaper = ChatShaper()
    else:
        messages = ([{"role": "system", "content": body.system}] if body.system else []) + [
            {"role": "user", "content": body.prompt}]
        prompt, shaper, params = await _prompt(state, body, messages, after=body.context)
    gen = Generation(request, prompt, max_tokens, params, context=_context(body.options))
    t0 = time.perf_counter()

    def chunk(events):
        response, thinking = _text_of(events, TextDelta), _text_of(events, ThoughtDelta)
        if not response and not thinking:
            return None
        out = {"model": name, "created_at": _now(), "response": response, "done": False}
        if thinking:
            out["thinking"] = thinking
        return out

    def last(c: Completion, whole: bool):
        out = {"model": name, "created_at": _now(), "response": "".join(shaper.content) if whole else "",
               "done": True, "done_reason": _done_reason(shaper), "context": gen.prompt + c.tokens, **_stats(gen, c, t0)}
        if whole and shaper.thought:
            out["thinking"] = "".join(shaper.thought)
        return out

    return await _run(request, gen, shaper, body, chunk, last)


async def _vectors(request: web.Request, texts: list[str], field: str, body: EmbedBody, normalize: int = 2) -> list:
    """(tokens read, vector) of each text. A text longer than a slot (or than
    the context `options.num_ctx` asks for, when smaller) is cut to fit when
    `truncate` (Ollama's default), else refused."""
    state: ServerState = request.app["state"]
    asked = _context(body.options)
    n_ctx = min(state.slot_ctx, asked[1]) if asked else state.slot_ctx
    require_embeddings(state)
    pooling = pooling_of(state)
    if pooling == "none":
        pooling = "mean"  # Ollama answers one vector per input: its own models pool by mean
    if len(texts) > MAX_INPUTS:
        raise ApiError(400, f"{field}: at most {MAX_INPUTS} inputs a request, got {len(texts)}", param=field)
    inputs = []
    for i, text in enumerate(texts):
        ids = state.model.tokenize(text, add_special=True, parse_special=True)
        if not ids:
            raise ApiError(400, f"{field}[{i}]: empty", param=field)
        if len(ids) > n_ctx:
            if not body.truncate:
                raise ApiError(400, f"{field}[{i}]: {len(ids)} tokens, more than the context's {n_ctx} "
                               "(truncate is false)", param=field)
            ids = ids[:n_ctx]
        inputs.append(ids)
    vectors = await embed_each(request, inputs, pooling, normalize)
    return [(len(ids), v) for ids, v in zip(inputs, vectors)]


@reads(EmbedBody)
async def embed(request: web.Request) -> web.Response:
    state: ServerState = request.app["state"]
    body = wire.decode(await read_body(request), EmbedBody)
    _keep_alive(request, body.keep_alive)
    if body.input is None:
        raise ApiError(400, "input: required", param="input")
    texts = [body.input] if isinstance(body.input, str) else body.input
    if not texts:
        raise ApiError(400, "input: at least one input is required", param="input")
    if body.dimensions is not None and body.dimensions != state.model.n_embd:
        raise ApiError(400, f"dimensions: this model's embeddings have {state.model.n_embd}", param="dimensions")
    t0 = time.perf_counter()
    done = await _vectors(request, texts, "input", body)
    return json_response({"model": body.model or state.model_id(), "embeddings": [v.tolist() for _, v in done],
                          "total_duration": int((time.perf_counter() - t0) * 1e9), "load_duration": 0,
                          "prompt_eval_count": sum(n for n, _ in done)})


@reads(EmbedBody)
async def embeddings(request: web.Request) -> web.Response:
    body = wire.decode(await read_body(request), EmbedBody)
    if body.prompt is None:
        raise ApiError(400, "prompt: required", param="prompt")
    if not body.prompt:
        return json_response({"embedding": []})  # as Ollama answers an empty prompt
    # Ollama's older route answers the vector as pooled, not normalized.
    (_, v), = await _vectors(request, [body.prompt], "prompt", body, normalize=-1)
    return json_response({"embedding": v.tolist()})


# -- the model, described as Ollama describes its own ---------------------------------------

_FILE_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K", 11: "Q3_K_S",
               12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K",
               25: "IQ4_NL", 30: "IQ4_XS", 32: "BF16"}


def _describe(state: ServerState) -> tuple[dict, dict]:
    """The /api/tags entry of the loaded model and its file's metadata, read once."""
    if state.ollama_model is not None:
        return state.ollama_model
    from ember import _native

    path = state.facts.path
    info = _native.inspect(path)
    meta = info["metadata"]
    n_params = sum(math.prod(dims) for _, _, dims, _ in info["tensors"])
    size = info["file_size"]
    st = os.stat(path)
    # Names this file as it is now (a changed file gets another), without reading its gigabytes.
    digest = hashlib.sha256(f"{os.path.abspath(path)}:{size}:{st.st_mtime_ns}".encode()).hexdigest()
    arch = state.facts.architecture
    scale, unit = (1e9, "B") if n_params >= 1e9 else (1e6, "M")
    params = f"{n_params / scale:.1f}{unit}" if n_params < 10 * scale else f"{n_params / scale:.0f}{unit}"
    # Ollama's names are lowercase words joined by dashes, with a tag.
    name = re.sub(r"[^a-z0-9._:-]+", "-", state.model_id().lower()).strip("-") or "model"
    name = name if ":" in name else f"{name}:latest"
    entry = {
        "name": name, "model": name, "size": size, "digest": digest,
        "modified_at": datetime.fromtimestamp(st.st_mtime, timezone.utc).isoformat().replace("+00:00", "Z"),
        "details": {"parent_model": "", "format": "gguf", "family": arch, "families": [arch],
                    "parameter_size": params,
                    "quantization_level": _FILE_TYPES.get(meta.get("general.file_type"), "unknown")},
    }
    state.ollama_model = (entry, meta)
    return state.ollama_model


async def tags(request: web.Request) -> web.Response:
    entry, _ = _describe(request.app["state"])
    return json_response({"models": [entry]})


async def ps(request: web.Request) -> web.Response:
    state: ServerState = request.app["state"]
    entry, _ = _describe(state)
    if state.asleep:
        return json_response({"models": []})  # as Ollama lists no model it has let go
    sleeper = request.app["sleeper"]
    # When the model goes, as Ollama says it: the idle time from the last request that needed it.
    expires = ("9999-12-31T23:59:59Z" if sleeper.idle_seconds is None else
               datetime.fromtimestamp(sleeper.goes_at(), timezone.utc).isoformat().replace("+00:00", "Z"))
    return json_response({"models": [{**entry, "expires_at": expires, "size_vram": 0,
                                      "context_length": state.slot_ctx}]})


@reads(ModelBody)
async def show(request: web.Request) -> web.Response:
    state: ServerState = request.app["state"]
    wire.decode(await read_body(request), ModelBody)
    entry, meta = _describe(state)
    info = {k: v for k, v in meta.items() if not k.startswith("tokenizer.ggml.") and k != "tokenizer.chat_template"}
    caps = ["completion", "tools", "embedding"]
    return json_response({
        "modelfile": f"FROM {state.model.path}\n", "parameters": "", "template": state.model.chat_template or "",
        "details": entry["details"], "model_info": info, "capabilities": caps, "modified_at": entry["modified_at"],
    })


async def version(request: web.Request) -> web.Response:
    return json_response({"version": __version__})


async def not_served(request: web.Request) -> web.Response:
    raise ApiError(501, f"{request.path}: ember serves the model it was started with; models are not managed here",
                   type="not_supported_error")


def add_routes(app: web.Application) -> None:
    app.router.add_post("/api/chat", chat)
    app.router.add_post("/api/generate", generate)
    app.router.add_post("/api/embed", embed)
    app.router.add_post("/api/embeddings", embeddings)
    app.router.add_get("/api/tags", tags)
    app.router.add_get("/api/ps", ps)
    app.router.add_post("/api/show", show)
    app.router.add_get("/api/version", version)
    for path in ("/api/pull", "/api/push", "/api/create", "/api/copy", "/api/delete", "/api/blobs/{digest}"):
        app.router.add_route("*", path, not_served)
