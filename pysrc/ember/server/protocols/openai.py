"""OpenAI's API over the engine: chat completions, text completions and the
model list, in the shapes the official clients parse (with llama-server's
`timings` beside them), streamed as server-sent events when asked."""

from __future__ import annotations

import copy
import json
import time
import uuid
from datetime import datetime, timezone
from typing import Any

import msgspec
from aiohttp import web

from ember.chat.events import Stop, chat_delta
from ember.model import Completion, Piece, PromptProgress
from ember.server import wire
from ember.server.chat_prompt import chat_prompt
from ember.server.errors import ApiError
from ember.server.generation import Choices, chosen_slot, piece_logprobs
from ember.server.http import finite, json_response, read_body, reads, sse_send
from ember.server.protocols.llama_server import final_body, insertion, progress_body
from ember.server.state import ServerState

__all__ = ["add_routes"]

#: OpenAI's finish_reason for each way a reply ends
FINISH = {Stop.END_TURN: "stop", Stop.STOP_SEQUENCE: "stop", Stop.LENGTH: "length", Stop.CONTEXT: "length",
          Stop.TOOL_CALLS: "tool_calls"}


def _usage(choices: Choices) -> dict:
    """The prompt once (it was read once), the drawn tokens of every choice."""
    first = choices.gens[0]
    n_p = len(first.prompt)
    n_g = sum(len(g.completion.tokens) if g.completion else g.n_drawn for g in choices.gens)
    return {"prompt_tokens": n_p, "completion_tokens": n_g, "total_tokens": n_p + n_g,
            "prompt_tokens_details": {"cached_tokens": first.n_cached}}


@reads(wire.ChatRequest)
async def chat_completions(request: web.Request) -> web.StreamResponse:
    state: ServerState = request.app["state"]
    model = state.model
    req = wire.decode(await read_body(request), wire.ChatRequest)
    req.refuse_unserved()
    req.refuse_completion_fields("logprobs and top_logprobs")
    n = wire.check_n(req.n)
    # The slot asked for reads the prompt and answers the first choice; the others answer from copies of it
    # (what each says depends on its seed, not its slot), as llama-server's answer in that slot one by one.
    slot = chosen_slot(request, req.id_slot, 1)
    wire.check_logprobs("top_logprobs", req.top_logprobs)
    if req.top_logprobs is not None and not req.logprobs:
        raise ApiError(400, "top_logprobs: requires logprobs to be true", param="top_logprobs")
    chat = req.chat()
    max_tokens = wire.reply_length(req, state.opts.n_predict)
    params = wire.sampling_options(req, model.n_vocab, state.opts.sampling, wire.text_tokens(model))
    if req.cache_prompt is not None:  # else the server's default (--no-cache-prompt)
        params.cache_prompt = req.cache_prompt
    k = req.top_logprobs or 0
    if req.logprobs:
        params.n_probs = max(1, k)  # the drawn token's own log-probability needs at least one
    prefill = req.prefill(state.opts.prefill_assistant)
    prompt, shaper = await chat_prompt(state, chat, params, add_generation_prompt=req.generation_prompt(prefill),
                                       prefill=prefill)
    choices = Choices(request, prompt, max_tokens, params, n, progress=req.stream and req.return_progress, slot=slot)
    # Each choice's reply is read by a shaper of its own, all of the same prompt.
    shapers = [shaper, *(copy.deepcopy(shaper) for _ in range(n - 1))]
    cid = f"chatcmpl-{uuid.uuid4().hex}"
    # Under way, the completion's thought may be ended by its id (chat_control).
    state.controls[cid] = (request.get("owner", 0), req.reasoning_control, choices.gens)
    try:
        return await _chat_reply(request, req, model, choices, shapers, cid, n, k, max_tokens)
    finally:
        state.controls.pop(cid, None)


async def _chat_reply(request: web.Request, req: wire.ChatRequest, model, choices: Choices, shapers: list, cid: str,
                      n: int, k: int, max_tokens: int) -> web.StreamResponse:
    """Chat completion `cid`'s reply, whole or streamed."""
    state: ServerState = request.app["state"]
    created = int(time.time())
    base = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": state.model_id(),
            "system_fingerprint": _fingerprint()}

    def deltas(events) -> list[dict]:
        return [d for d in map(chat_delta, events) if d is not None]

    if not req.stream:
        content: list[list[dict]] = [[] for _ in range(n)]
        async with choices:
            async for i, ev in choices.events():
                if isinstance(ev, Piece) and req.logprobs and ev.token is not None:
                    content[i].append(piece_logprobs(model, ev, k))
        for sh, g in zip(shapers, choices.gens):
            sh.read_whole(g.completion)
        return json_response(_verbose(state, req, choices, max_tokens) | {
            "id": cid, "object": "chat.completion", "created": created, "model": state.model_id(),
            "system_fingerprint": _fingerprint(),
            "choices": [{
                "index": i,
                "message": sh.message(),
                "logprobs": {"content": content[i]} if req.logprobs else None,
                "finish_reason": FINISH[sh.stop],
            } for i, sh in enumerate(shapers)],
            "usage": _usage(choices),
            "timings": choices.gens[0].timings(),
        })

    include_usage = bool(req.stream_options and req.stream_options.include_usage)

    def chunk(i: int, delta: dict, lp: list | None = None, finish: str | None = None, **extra) -> dict:
        if req.timings_per_token and "timings" not in extra:
            extra["timings"] = choices.gens[i].timings()
        return {**base, "choices": [{"index": i, "delta": delta, "logprobs": {"content": lp} if lp else None,
                                     "finish_reason": finish}], **extra}

    async def write(resp) -> None:
        roles_sent = False
        async for i, ev in choices.events():
            if isinstance(ev, PromptProgress):  # a chunk of no choice, as the usage chunk
                await sse_send(resp, _progress_chunk(base, ev, choices.gens[0], req.timings_per_token))
                continue
            if not roles_sent:  # each choice's role first, with no timings yet, as llama-server's stream starts
                roles_sent = True
                for j in range(n):
                    await sse_send(resp, {**base, "choices": [{"index": j, "delta": {"role": "assistant", "content": None},
                                                               "logprobs": None, "finish_reason": None}]})
            sh = shapers[i]
            if isinstance(ev, Piece):
                lp = [piece_logprobs(model, ev, k)] if req.logprobs and ev.token is not None else None
                out = deltas(sh.feed(ev.text))
                if lp and not out:
                    out = [{"content": ""}]
                for j, d in enumerate(out):
                    await sse_send(resp, chunk(i, d, lp if j == 0 else None))
            elif isinstance(ev, Completion):
                for d in deltas(sh.finish(ev)):
                    await sse_send(resp, chunk(i, d))
                await sse_send(resp, chunk(i, {}, finish=FINISH[sh.stop], timings=choices.gens[i].timings()))
        if include_usage:
            await sse_send(resp, {**base, "choices": [], "usage": _usage(choices),
                                  **({"timings": choices.gens[0].timings()} if req.timings_per_token else {})})
        await resp.write(b"data: [DONE]\n\n")
    return await choices.stream(request, write)


def _progress_chunk(base: dict, p: PromptProgress, gen, timings: bool) -> dict:
    """llama-server's prompt_progress, in a chunk of no choice."""
    out = {**base, "choices": [], "prompt_progress": progress_body(p)}
    if timings:
        out["timings"] = gen.timings()
    return out


@reads(wire.ChatRequest)
async def chat_input_tokens(request: web.Request) -> web.Response:
    """The prompt's length in tokens, as the reply would read it (llama-server's
    /chat/completions/input_tokens, in the shape of OpenAI's token count)."""
    state: ServerState = request.app["state"]
    req = wire.decode(await read_body(request), wire.ChatRequest)
    params = wire.sampling_options(req, state.model.n_vocab, state.opts.sampling, wire.text_tokens(state.model))
    prefill = req.prefill(state.opts.prefill_assistant)
    prompt, _ = await chat_prompt(state, req.chat(), params, add_generation_prompt=req.generation_prompt(prefill),
                                  prefill=prefill)
    return json_response({"object": "response.input_tokens", "input_tokens": len(prompt)})


def _completion_prompt(model, prompt) -> list[int]:
    if isinstance(prompt, str):
        return model.tokenize(prompt, add_special=True, parse_special=True)
    if len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
        if isinstance(prompt, str):
            return model.tokenize(prompt, add_special=True, parse_special=True)
    elif prompt and all(isinstance(x, (str, list)) for x in prompt):
        raise ApiError(400, "prompt: ember answers one prompt per request", param="prompt")
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in prompt):
        raise ApiError(400, "prompt: expected a string or a list of token ids", param="prompt")
    return list(prompt)


class _TextLogprobs:
    """OpenAI's legacy completion logprobs: parallel lists, offsets into the text."""

    def __init__(self, model, k: int, offset: int):
        self.model, self.k, self.offset = model, k, offset
        self.tokens: list[str] = []
        self.token_logprobs: list[float | None] = []
        self.top: list[dict] = []
        self.text_offset: list[int] = []

    def add(self, p: Piece) -> None:
        text = self.model.token_to_piece(p.token).decode("utf-8", "replace")
        self.tokens.append(text)
        self.token_logprobs.append(finite(p.logprob))
        top = {}
        for t, lp in (p.top or [])[: self.k]:
            top[self.model.token_to_piece(t).decode("utf-8", "replace")] = finite(lp)
        self.top.append(top)
        self.text_offset.append(self.offset)
        self.offset += len(text)

    def body(self, since: int = 0) -> dict:
        return {"tokens": self.tokens[since:], "token_logprobs": self.token_logprobs[since:],
                "top_logprobs": self.top[since:], "text_offset": self.text_offset[since:]}


@reads(wire.TextCompletionRequest)
async def completions(request: web.Request) -> web.StreamResponse:
    state: ServerState = request.app["state"]
    model = state.model
    req = wire.decode(await read_body(request), wire.TextCompletionRequest)
    n = wire.check_n(req.n)
    wire.check_text_completion(req)
    wire.check_logprobs("logprobs", req.logprobs)
    max_tokens = wire.reply_length(req, state.opts.n_predict)
    params = wire.sampling_options(req, model.n_vocab, state.opts.sampling, wire.text_tokens(model))
    params.grammar = wire.grammar_option(req)
    prompt = _completion_prompt(model, req.prompt)
    if req.suffix:
        # A text prompt is read as text, without the BOS its plain reading adds; token ids stand as they are.
        raw = req.prompt[0] if isinstance(req.prompt, list) and len(req.prompt) == 1 else req.prompt
        text = raw if isinstance(raw, str) else None
        before = prompt if text is None else model.tokenize(text, add_special=False, parse_special=False)
        prompt = insertion(state, before, req.suffix)
    if req.logprobs is not None:
        params.n_probs = max(1, req.logprobs)
    choices = Choices(request, prompt, max_tokens, params, n, progress=req.stream and req.return_progress)
    cid = f"cmpl-{uuid.uuid4().hex}"
    created = int(time.time())
    echo = ""
    if req.echo:
        echo = req.prompt if isinstance(req.prompt, str) else model.detokenize(prompt)
    lps = [_TextLogprobs(model, req.logprobs or 0, len(echo)) if req.logprobs is not None else None
           for _ in range(n)]
    base = {"id": cid, "object": "text_completion", "created": created, "model": state.model_id(),
            "system_fingerprint": _fingerprint()}

    if not req.stream:
        async with choices:
            async for i, ev in choices.events():
                if isinstance(ev, Piece) and lps[i] is not None and ev.token is not None:
                    lps[i].add(ev)
        return json_response(_verbose(state, req, choices, max_tokens) | {**base, "choices": [{
            "text": echo + g.completion.text, "index": i, "logprobs": lps[i].body() if lps[i] else None,
            "finish_reason": FINISH[Stop.of(g.completion)]} for i, g in enumerate(choices.gens)],
            "usage": _usage(choices), "timings": choices.gens[0].timings()})

    include_usage = bool(req.stream_options and req.stream_options.include_usage)

    def piece(i: int, text: str, logprobs=None, finish=None, **extra) -> dict:
        if req.timings_per_token and "timings" not in extra:
            extra["timings"] = choices.gens[i].timings()
        return {**base, "choices": [{"text": text, "index": i, "logprobs": logprobs, "finish_reason": finish}],
                **extra}

    async def write(resp) -> None:
        if echo:
            for i in range(n):
                await sse_send(resp, piece(i, echo))
        async for i, ev in choices.events():
            lp = lps[i]
            if isinstance(ev, PromptProgress):
                await sse_send(resp, _progress_chunk(base, ev, choices.gens[0], req.timings_per_token))
            elif isinstance(ev, Piece):
                seen = len(lp.tokens) if lp else 0
                if lp is not None and ev.token is not None:
                    lp.add(ev)
                if ev.text or (lp and len(lp.tokens) > seen):
                    await sse_send(resp, piece(i, ev.text, lp.body(seen) if lp else None))
            elif isinstance(ev, Completion):
                await sse_send(resp, piece(i, "", finish=FINISH[Stop.of(ev)], timings=choices.gens[i].timings()))
        if include_usage:
            await sse_send(resp, {**base, "choices": [], "usage": _usage(choices),
                                  **({"timings": choices.gens[0].timings()} if req.timings_per_token else {})})
        await resp.write(b"data: [DONE]\n\n")
    return await choices.stream(request, write)


def _model_entry(state: ServerState) -> dict:
    """The model as OpenAI's list shows it, with the fields Anthropic's
    clients read beside them (`type`, `display_name`, `created_at`)."""
    m = state.facts  # the same while the model sleeps
    mid = state.model_id()
    created = datetime.fromtimestamp(int(state.started), timezone.utc).isoformat().replace("+00:00", "Z")
    return {
        "id": mid, "object": "model", "created": int(state.started), "owned_by": "ember",
        "aliases": state.opts.aliases or [mid], "tags": state.opts.tags,
        "type": "model", "display_name": mid, "created_at": created,
        "meta": {"n_vocab": m.n_vocab, "n_ctx": m.n_ctx, "n_ctx_train": m.n_ctx_train,
                 "architecture": m.architecture},
    }


async def models(request: web.Request) -> web.Response:
    """The model list in OpenAI's shape, and the page's `has_more`,
    `first_id`, `last_id` Anthropic's clients read: both SDKs list models at
    this path."""
    entry = _model_entry(request.app["state"])
    return json_response({"object": "list", "data": [entry], "has_more": False, "first_id": entry["id"],
                          "last_id": entry["id"]})


async def model(request: web.Request) -> web.Response:
    """One model by any of its names (both SDKs' models.retrieve); another
    name is a 404, though a request naming it is answered by this model."""
    state: ServerState = request.app["state"]
    entry = _model_entry(state)
    name = request.match_info["model"]
    if name not in (entry["id"], *entry["aliases"]):
        raise ApiError(404, f"the model {name!r} is not served here; this server serves {entry['id']!r}",
                       type="not_found_error", param="model")
    return json_response(entry)


def _verbose(state: ServerState, req: wire.Sampling, choices: Choices, max_tokens: int) -> dict:
    """llama-server's `__verbose`: the first choice as its /completion reports
    it, with the prompt as the model read it (asked by the request's
    `verbose`, or for every request by -v)."""
    if not (state.opts.verbose if req.verbose is None else req.verbose):
        return {}
    g = choices.gens[0]
    return {"__verbose": final_body(state, g, g.completion, content=g.completion.text,
                                    prompt_text=state.model.detokenize(g.prompt, special=True), n_predict=max_tokens,
                                    stream=req.stream)}


def _fingerprint() -> str:
    from ember import __version__

    return f"ember-{__version__}"


class ControlRequest(msgspec.Struct, forbid_unknown_fields=False):
    # both checked by hand, to name what is wrong
    id: Any = None
    action: Any = None
    # where llama-server routes among models; one is served here
    model: str | None = None


@reads(ControlRequest)
async def chat_control(request: web.Request) -> web.Response:
    """llama-server's `POST /v1/chat/completions/control`: `reasoning_end`
    ends the thought of the chat completion `id` under way (one sent with
    `reasoning_control: true`), its close written after the next token, so
    the model goes on to its answer. `success` says whether it was done."""
    state: ServerState = request.app["state"]
    req = wire.decode(await read_body(request), ControlRequest)
    if not isinstance(req.id, str) or not req.id:
        raise ApiError(400, "id: required, the id of a chat completion under way", param="id")
    if req.action != "reasoning_end":
        raise ApiError(400, f"action: expected reasoning_end, got {json.dumps(req.action)[:40]}", param="action")
    owner, armed, gens = state.controls.get(req.id, (None, False, []))
    if owner != request.get("owner", 0):
        return json_response({"success": False, "message": "no active completion for this id"})
    if not armed:
        return json_response({"success": False, "message": "reasoning control not enabled for this completion "
                                                           "(send reasoning_control: true with it)"})
    jobs = [g.job for g in gens if g.job is not None]
    engine = state.engine
    ended = await engine.call(lambda: [engine.end_thought(job) for job in jobs])
    if not any(ended):
        return json_response({"success": False, "message": "no thought under way to end in this completion"})
    return json_response({"success": True})


def add_routes(app: web.Application) -> None:
    for prefix in ("/v1", ""):
        app.router.add_post(f"{prefix}/chat/completions", chat_completions)
        app.router.add_post(f"{prefix}/chat/completions/control", chat_control)
        app.router.add_post(f"{prefix}/chat/completions/input_tokens", chat_input_tokens)
        app.router.add_get(f"{prefix}/models", models)
        app.router.add_get(f"{prefix}/models/{{model:.+}}", model)
    app.router.add_post("/v1/completions", completions)
