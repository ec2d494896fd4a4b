"""llama-server's own API over the engine: /completion, /infill, /tokenize, /detokenize,
/apply-template, /props, /metrics and /slots, with its field names and stop types, so
tools written for llama-server talk to ember unchanged."""

from __future__ import annotations

import asyncio
import json
import math
import time
from typing import Any

from aiohttp import web

from ember.chat.events import Stop
from ember.errors import EmberError
from ember.model import Completion, Piece, PromptProgress
from ember.sampling import SamplingParams
from ember.server import kept_streams, wire
from ember.server.chat_prompt import chat_text
from ember.server.errors import ApiError, from_engine_error
from ember.server.generation import Generation, Prompts, chosen_slot
from ember.server.http import finite, json_response, read_body, reads, sse_send
from ember.server.slot_files import check_name, read_slot_file, write_slot_file
from ember.server.state import ServerState, unavailable

__all__ = ["add_routes", "final_body", "progress_body"]

def _settings(state: ServerState, n_predict: int, params: SamplingParams, stream: bool) -> dict:
    """The generation's settings as llama-server reports them."""
    s = params.settings()
    s.update({
        "n_predict": n_predict, "seed": -1 if params.seed is None else params.seed, "stream": stream,
        # As llama-server lists them (a bias of -inf as null), ignore_eos as the end tokens' bans it stands for.
        "logit_bias": [{"bias": None if b == -math.inf else finite(b), "token": t} for t, b in params.logit_bias.items()]
        + ([{"bias": None, "token": t} for t in state.facts.eog_ids if t not in params.logit_bias]
           if params.ignore_eos else []),
        "n_keep": 0, "n_discard": 0, "min_keep": 0, "model": state.model_id(),
    })
    return s


def _probs(model, p: Piece, k: int, post_sampling: bool = False) -> dict:
    """One draw's probabilities as llama-server reports them: the model's as
    log-probabilities, or those after the samplers as probabilities."""
    def entry(t: int, lp: float | None) -> dict:
        raw = model.token_to_piece(t)
        value = {"prob": math.exp(lp) if lp is not None else 0.0} if post_sampling else {"logprob": finite(lp)}
        return {"id": t, "token": raw.decode("utf-8", "replace"), **value, "bytes": list(raw)}

    e = entry(p.token, p.logprob)
    e["top_probs" if post_sampling else "top_logprobs"] = [entry(t, lp) for t, lp in (p.top or [])[:k]]
    return e


#: llama-server's stop_type for each way a completion ends
STOP_TYPE = {Stop.END_TURN: "eos", Stop.TOOL_CALLS: "eos", Stop.STOP_SEQUENCE: "word", Stop.LENGTH: "limit",
             Stop.CONTEXT: "limit"}


def _stop_type(c: Completion) -> str:
    return STOP_TYPE[Stop.of(c)]


def progress_body(p: PromptProgress) -> dict:
    """llama-server's prompt_progress object."""
    return {"total": p.total, "cache": p.cache, "processed": p.processed, "time_ms": p.time_ms}


def final_body(state: ServerState, gen: Generation, c: Completion, *, content: str, prompt_text: str,
               n_predict: int, stream: bool, return_tokens: bool = False) -> dict:
    """A finished completion as llama-server's /completion reports it (also
    the `__verbose` object of its OpenAI routes)."""
    return {
        "index": 0, "content": content, "tokens": c.tokens if return_tokens else [], "id_slot": gen.job.slot,
        "stop": True, "model": state.model_id(), "tokens_predicted": len(c.tokens),
        "tokens_evaluated": len(gen.prompt), "generation_settings": _settings(state, n_predict, gen.params, stream),
        "prompt": prompt_text, "has_new_line": "\n" in c.text, "truncated": False,
        # As llama-server counts them: the last token drawn is not in the cache.
        "stop_type": _stop_type(c), "stopping_word": c.stop_string or "",
        "tokens_cached": len(gen.prompt) + max(0, len(c.tokens) - 1),
        "timings": gen.timings(),
    }


@reads(wire.LlamaCompletionRequest)
async def completion(request: web.Request) -> web.StreamResponse:
    state: ServerState = request.app["state"]
    req = wire.decode(await read_body(request), wire.LlamaCompletionRequest)
    return await _complete(request, req, lambda _n_predict: completion_prompts(
        state.model, req.prompt, limit=state.facts.n_slots + state.opts.queue_depth))


@reads(wire.InfillRequest)
async def infill(request: web.Request) -> web.StreamResponse:
    """llama-server's /infill: the code between a prefix and a suffix, in
    the model's fill-in-the-middle format, answered as /completion answers."""
    state: ServerState = request.app["state"]
    model = state.model
    missing = missing_fim(model)
    if missing:
        raise ApiError(501, f"infill is not supported by this model: its vocabulary has no fill-in-the-middle "
                       f"{', '.join(missing)} token")
    req = wire.decode(await read_body(request), wire.InfillRequest)
    for name in ("input_prefix", "input_suffix"):
        if getattr(req, name) is None:
            raise ApiError(400, f"{name}: required", param=name)
    if not isinstance(req.prompt, str):
        raise ApiError(400, "prompt: /infill takes a string (the start of the middle)", param="prompt")

    def prompts(n_predict: int) -> tuple[list[list[int]], list[str | None]]:
        ids = infill_prompt(model, req, batch=state.opts.n_batch, n_predict=n_predict, n_ctx=state.slot_ctx,
                            spm=state.opts.spm_infill)
        return [ids], [None]

    return await _complete(request, req, prompts)


def infill_prompt(model, req: "wire.InfillRequest", *, batch: int, n_predict: int, n_ctx: int,
                  spm: bool) -> list[int]:
    """The tokens llama-server's format_prompt_infill builds: the extra
    chunks (under the repository-level markers where the vocabulary has
    them), then FIM_PRE prefix prompt FIM_SUF suffix FIM_MID, or with `spm`
    the suffix's part first. As there, the prefix keeps its last three
    quarters of a batch, the suffix its first quarter less the prompt, and
    the extra chunks their last tokens that leave room for the batch and
    twice the reply."""
    fim = model._native.fim_ids

    def tokens(value, where: str) -> list[int]:
        ids, _ = _subprompt(model, value, where, add_special=False, parse_special=False)
        return ids

    prefix = tokens(req.input_prefix, "input_prefix")
    suffix = tokens(req.input_suffix, "input_suffix")
    prompt = model.tokenize(req.prompt, add_special=False, parse_special=True) if req.prompt else []
    extra: list[int] = []
    if "rep" in fim:
        extra += [fim["rep"], *model.tokenize("myproject\n", add_special=False, parse_special=False)]
    for chunk in req.input_extra or []:
        if "sep" in fim:
            extra += [fim["sep"], *model.tokenize(chunk.filename + "\n", add_special=False, parse_special=False)]
        else:
            extra += model.tokenize(_CHUNK_SEPARATOR, add_special=False, parse_special=False)
        extra += model.tokenize(chunk.text, add_special=False, parse_special=False)
    if "sep" in fim:
        extra += [fim["sep"], *model.tokenize("filename\n", add_special=False, parse_special=False)]
    n_prefix = min(len(prefix), 3 * (batch // 4))
    n_suffix = min(len(suffix), max(0, batch // 4 - (2 + len(prompt))))
    n_extra = min(max(0, n_ctx - batch - 2 * max(n_predict, 0)), len(extra))
    return extra[len(extra) - n_extra:] + fim_tokens(model, prefix[len(prefix) - n_prefix:] + prompt,
                                                      suffix[:n_suffix], spm)


def missing_fim(model) -> list[str]:
    """The fill-in-the-middle tokens a model needs for an insertion and its vocabulary lacks."""
    return [name for name in ("pre", "suf", "mid") if name not in model._native.fim_ids]


def fim_tokens(model, before: list[int], after: list[int], spm: bool) -> list[int]:
    """The insertion between `before` and `after` in the model's
    fill-in-the-middle tokens: FIM_PRE before FIM_SUF after FIM_MID, or with
    `spm` the part after first; the BOS ahead where the model adds one."""
    fim = model._native.fim_ids
    head, tail = [fim["pre"], *before], [fim["suf"], *after]
    first, second = (tail, head) if spm else (head, tail)
    bos = [model._native.bos_id] if model._native.add_bos else []
    return bos + first + second + [fim["mid"]]


def insertion(state: ServerState, before: list[int], suffix: str) -> list[int]:
    """OpenAI's and Ollama's insert mode: the completion between `before`
    and `suffix` (read as text), written as /infill writes it without extra
    files; a 400 naming `suffix` where the vocabulary cannot write it."""
    model = state.model
    missing = missing_fim(model)
    if missing:
        raise ApiError(400, f"suffix: this model does not support insert: its vocabulary has no fill-in-the-middle "
                       f"{', '.join(missing)} token", param="suffix")
    return fim_tokens(model, before, model.tokenize(suffix, add_special=False, parse_special=False),
                      state.opts.spm_infill)


#: llama-server's line between extra chunks where the vocabulary has no file separator.
_CHUNK_SEPARATOR = "\n\n--- snippet ---\n\n"


async def _complete(request: web.Request, req: "wire.LlamaCompletionRequest", make_prompts) -> web.StreamResponse:
    """/completion's answer to `req`, its prompts from `make_prompts(n_predict)`."""
    state: ServerState = request.app["state"]
    model = state.model
    n_predict = wire.reply_length(req, state.opts.n_predict)
    name, n_probs = wire.first_set(req, "n_probs", "logprobs")
    wire.check_logprobs(name, n_probs or 0)
    req.n_probs = n_probs or 0
    name, n_cmpl = wire.first_set(req, "n_cmpl", "n")
    n_slots = state.engine.n_slots
    if n_cmpl is not None and not 1 <= n_cmpl <= n_slots:
        raise ApiError(400, f"{name}: must be between 1 and the slots ({n_slots}), got {n_cmpl}", param=name)
    params = wire.sampling_options(req, model.n_vocab, state.opts.sampling, wire.text_tokens(model))
    params.grammar = wire.grammar_option(req)
    if req.n_probs:
        params.n_probs = req.n_probs
        params.post_sampling_probs = req.post_sampling_probs
    if req.cache_prompt is not None:  # else the server's default (--no-cache-prompt)
        params.cache_prompt = req.cache_prompt
    prompts, texts = make_prompts(n_predict)
    if n_cmpl is not None and n_cmpl > 1:
        # Each prompt's completions side by side, as llama-server answers them.
        if len(prompts) * n_cmpl > state.facts.n_slots + state.opts.queue_depth:
            raise ApiError(400, f"{name}: {len(prompts)} prompts of {n_cmpl} completions each; at most "
                           f"{state.facts.n_slots + state.opts.queue_depth} at once (the slots and the queue)",
                           param=name)
        prompts = [p for p in prompts for _ in range(n_cmpl)]
        texts = [t for t in texts for _ in range(n_cmpl)]
    slot = chosen_slot(request, req.id_slot, len(prompts))
    gens = [Generation(request, p, n_predict, _copy_of(params, i % (n_cmpl or 1)), slot=slot,
                       progress=req.stream and req.return_progress) for i, p in enumerate(prompts)]
    texts = [t if t is not None else model.detokenize(p) for p, t in zip(prompts, texts)]
    many = len(prompts) > 1  # answered as a list, each with its index (one prompt: the object alone)

    def final(i: int, c: Completion, content: str, probs: list | None) -> dict:
        body = final_body(state, gens[i], c, content=content, prompt_text=texts[i], n_predict=n_predict,
                          stream=req.stream, return_tokens=req.return_tokens)
        body["index"] = i
        if probs is not None:
            body["completion_probabilities"] = probs
        return body if req.response_fields is None else fields_at(body, req.response_fields)

    batch = Prompts(gens)
    if not req.stream:
        probs: list[list | None] = [[] if req.n_probs else None for _ in gens]
        async with batch:
            async for i, ev in batch.events():
                if isinstance(ev, Piece) and probs[i] is not None and ev.token is not None:
                    probs[i].append(_probs(model, ev, req.n_probs, req.post_sampling_probs))
        bodies = [final(i, g.completion, g.completion.text, probs[i]) for i, g in enumerate(gens)]
        return json_response(bodies if many else bodies[0])

    def partial(i: int, text: str, tokens: list[int]) -> dict:
        g = gens[i]
        chunk = {"index": i, "content": text, "tokens": tokens, "stop": False, "id_slot": g.job.slot,
                 "tokens_predicted": g.n_drawn, "tokens_evaluated": len(g.prompt)}
        if req.timings_per_token:
            chunk["timings"] = g.timings()
        return chunk

    async def write(resp) -> None:
        async for i, ev in batch.events():
            if isinstance(ev, PromptProgress):
                await sse_send(resp, {**partial(i, "", []), "prompt_progress": progress_body(ev)})
            elif isinstance(ev, Piece):
                if not ev.text and not (req.n_probs and ev.token is not None):
                    continue
                chunk = partial(i, ev.text, [ev.token] if req.return_tokens and ev.token is not None else [])
                if req.n_probs and ev.token is not None:
                    chunk["completion_probabilities"] = [_probs(model, ev, req.n_probs, req.post_sampling_probs)]
                await sse_send(resp, chunk)
            elif isinstance(ev, Completion):
                await sse_send(resp, final(i, ev, "", None))
    return await batch.stream(request, write)


def _copy_of(params: SamplingParams, k: int) -> SamplingParams:
    """A prompt's k-th completion's options: a seed the request fixed moves
    on by k, as OpenAI's `n` choices' seeds do, so the copies differ."""
    p = params.copy()
    if k and p.seed is not None:
        p.seed = (p.seed + k) % 2**64
    return p


def fields_at(body: dict, paths: list[str]) -> dict:
    """llama-server's `response_fields`: each path ("timings/predicted_n")
    that leads to a value, with that value under the path as it was written;
    a path that leads nowhere is left out."""
    out = {}
    for path in paths:
        v: Any = body
        for key in path.split("/"):
            if not isinstance(v, dict) or key not in v:
                break
            v = v[key]
        else:
            out[path] = v
    return out


def completion_prompts(model, raw, limit: int) -> tuple[list[list[int]], list[str | None]]:
    """The prompts of a /completion request, as llama-server reads `prompt`:
    a string; token ids; ids and strings mixed in one sequence (each string
    tokenized in its place, the first with the BOS); {"prompt_string": ...};
    or a list of those, each a prompt of its own. With each, its text where
    it was one string (None: detokenized for the reply)."""
    if isinstance(raw, list) and raw and not any(_is_id(x) for x in raw):
        if len(raw) > limit:
            raise ApiError(400, f"prompt: {len(raw)} prompts; at most {limit} at once (the slots and the queue)",
                           param="prompt")
        pairs = [_subprompt(model, p, f"prompt[{i}]") for i, p in enumerate(raw)]
    else:
        pairs = [_subprompt(model, raw, "prompt")]
    return [p for p, _ in pairs], [t for _, t in pairs]


def _is_id(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _subprompt(model, p, where: str, add_special: bool = True,
               parse_special: bool = True) -> tuple[list[int], str | None]:
    if isinstance(p, str):
        return model.tokenize(p, add_special=add_special, parse_special=parse_special), p
    if isinstance(p, dict):
        if "multimodal_data" in p:
            raise ApiError(400, f"{where}.multimodal_data: ember's models read text only", param=where)
        if "prompt_string" not in p:
            raise ApiError(400, f"{where}: an object prompt needs \"prompt_string\"", param=where)
        return _subprompt(model, p["prompt_string"], f"{where}.prompt_string", add_special, parse_special)
    if isinstance(p, list) and all(_is_id(x) or isinstance(x, str) for x in p):
        ids: list[int] = []
        for k, x in enumerate(p):
            ids += (model.tokenize(x, add_special=add_special and k == 0, parse_special=parse_special)
                    if isinstance(x, str) else [x])
        return ids, None
    raise ApiError(400, f"{where}: expected a string, token ids, strings and token ids in one list, "
                   "{\"prompt_string\": ...}, or a list of those", param=where)


@reads(wire.TokenizeRequest)
async def tokenize(request: web.Request) -> web.Response:
    model = request.app["state"].model
    req = wire.decode(await read_body(request), wire.TokenizeRequest)
    ids = model.tokenize(req.content, add_special=req.add_special, parse_special=req.parse_special)
    if not req.with_pieces:
        return json_response({"tokens": ids})
    out = []
    for t in ids:
        raw = model.token_to_piece(t, True)
        try:
            piece: str | list[int] = raw.decode("utf-8")
        except UnicodeDecodeError:
            piece = list(raw)  # a fragment of a character: the bytes, as llama-server sends them
        out.append({"id": t, "piece": piece})
    return json_response({"tokens": out})


@reads(wire.DetokenizeRequest)
async def detokenize(request: web.Request) -> web.Response:
    model = request.app["state"].model
    req = wire.decode(await read_body(request), wire.DetokenizeRequest)
    for i, t in enumerate(req.tokens):
        if not 0 <= t < model.n_vocab:
            raise ApiError(400, f"tokens[{i}]: token id {t} is outside the vocabulary (0..{model.n_vocab - 1})",
                           param=f"tokens[{i}]")
    return json_response({"content": model.detokenize(req.tokens)})


@reads(wire.ApplyTemplateRequest)
async def apply_template(request: web.Request) -> web.Response:
    state: ServerState = request.app["state"]
    req = wire.decode(await read_body(request), wire.ApplyTemplateRequest)
    # The prompt a chat request with this body would read: the same checks, tools and thought handling.
    wire.sampling_options(req, state.model.n_vocab, state.opts.sampling, wire.text_tokens(state.model))
    prefill = req.prefill(state.opts.prefill_assistant)
    return json_response({"prompt": await chat_text(state, req.chat(), req.generation_prompt(prefill), prefill)})


async def props(request: web.Request) -> web.Response:
    from ember import __version__

    state: ServerState = request.app["state"]
    # What the last load recorded: the same answer while the model sleeps.
    facts = state.facts
    engine = state.engine
    return json_response({
        "default_generation_settings": {
            "id": 0, "id_task": -1, "n_ctx": state.slot_ctx, "speculative": False,
            "is_processing": bool(engine is not None and engine.busy),
            "params": _settings(state, state.opts.n_predict, state.opts.sampling, False), "prompt": "",
        },
        "total_slots": state.facts.n_slots,
        "model_path": facts.path,
        "model_alias": state.model_id(),
        "chat_template": state.template if state.template is not None else facts.chat_template,
        "bos_token": facts.bos,
        "eos_token": facts.eos,
        "modalities": {"vision": False, "audio": False},
        "build_info": f"ember {__version__}",
        # The device, and the bytes it held there at the last load, or the CPU and why.
        "device": facts.device,
        "is_sleeping": state.asleep,
    })


async def metrics(request: web.Request) -> web.Response:
    state: ServerState = request.app["state"]
    if not state.opts.metrics:
        raise ApiError(501, "This server does not support metrics endpoint. Start it with `--metrics`",
                       type="not_supported_error")
    s = state.metrics
    # Asleep, what the engine said as it slept (a server that slept counts on from it).
    snap = request.app["sleeper"].snapshot(await state.engine.call(state.engine.snapshot)
                                           if state.engine is not None else None)
    rows = [
        ("prompt_tokens_total", "counter", "Number of prompt tokens processed.", s.prompt_tokens),
        ("prompt_tokens_cached_total", "counter", "Number of prompt tokens found in the cache, not processed.",
         s.prompt_tokens_cached),
        ("prompt_seconds_total", "counter", "Prompt process time", s.prompt_seconds),
        ("tokens_predicted_total", "counter", "Number of generation tokens processed.", s.predicted_tokens),
        ("tokens_predicted_seconds_total", "counter", "Predict process time", s.predicted_seconds),
        ("prompt_tokens_seconds", "gauge", "Average prompt throughput in tokens/s.",
         s.prompt_tokens / s.prompt_seconds if s.prompt_seconds else 0.0),
        ("predicted_tokens_seconds", "gauge", "Average generation throughput in tokens/s.",
         s.predicted_tokens / s.predicted_seconds if s.predicted_seconds else 0.0),
        ("requests_processing", "gauge", "Number of requests processing.", snap["busy"]),
        ("requests_deferred", "gauge", "Number of requests deferred.", snap["waiting"]),
        ("n_decode_total", "counter", "Total number of forward passes.", snap["passes"]),
        ("n_tokens_max", "counter", "Largest number of tokens one forward pass read.", snap["tokens_max"]),
        ("n_busy_slots_per_decode", "gauge", "Average number of busy slots per forward pass.",
         snap["slot_passes"] / snap["passes"] if snap["passes"] else 0.0),
        # Always 0: ember drafts no tokens (it has no speculative decoding); kept so dashboards find them.
        ("spec_decode_num_draft_tokens_total", "counter", "Tokens drafted (no speculative decoding: 0).", 0),
        ("spec_decode_num_accepted_tokens_total", "counter", "Drafted tokens accepted (no speculative decoding: 0).",
         0),
        ("spec_decode_num_drafts_total", "counter", "Drafts made (no speculative decoding: 0).", 0),
        ("kv_cache_tokens", "gauge", "KV-cache tokens.", snap["kv_tokens"]),
        ("kv_cache_usage_ratio", "gauge", "KV-cache usage. 1 means 100 percent usage.",
         snap["kv_tokens"] / state.facts.n_ctx if state.facts is not None else 0.0),
    ]
    lines = []
    for name, kind, help_, value in rows:
        lines += [f"# HELP llamacpp:{name} {help_}", f"# TYPE llamacpp:{name} {kind}", f"llamacpp:{name} {value}"]
    lines += ["# HELP ember:requests_refused_total Requests refused before their route, by cause.",
              "# TYPE ember:requests_refused_total counter"]
    for cause in ("key", "scope", "inflight", "rate", "host", "origin"):
        lines.append(f'ember:requests_refused_total{{cause="{cause}"}} {s.refusals.get(cause, 0)}')
    return web.Response(body=("\n".join(lines) + "\n").encode(),
                        headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8",
                                 "Process-Start-Time-Unix": str(int(state.started))})


async def health(request: web.Request) -> web.Response:
    """llama-server's /health: 503 "loading model" until the model is in,
    "ok" then; the slots' counts with `include_slots` or `fail_on_no_slot`
    (503 when every slot is busy), and their states with `include_slots`."""
    state: ServerState = request.app["state"]
    if state.phase != "ready" or state.closing:
        # Both shapes clients read: the README's status word and the error envelope of the other routes.
        e = unavailable(state)
        error = {"code": e.status, "message": e.message, "type": e.type}
        if state.phase == "failed":
            return json_response({"status": "error", "error": {**error, "code": 500}}, status=500)
        status = "shutting down" if state.closing else "loading model"
        return json_response({"status": status, "error": error}, status=503)
    query = request.query
    if "include_slots" not in query and "fail_on_no_slot" not in query:
        return json_response({"status": "ok"})
    engine = state.engine
    n_slots = state.facts.n_slots
    busy = engine.n_busy if engine is not None else 0  # asleep, every slot is free
    body: dict = {"status": "ok" if busy < n_slots else "no slot available",
                  "slots_idle": n_slots - busy, "slots_processing": busy}
    if "include_slots" in query and state.opts.slots_endpoint:
        body["slots"] = await slots_report(state) if engine is not None else [
            {"id": i, "id_task": -1, "n_ctx": state.slot_ctx, "speculative": False, "is_processing": False,
             "n_cached_tokens": 0, "prompt": ""} for i in range(n_slots)]
    return json_response(body, status=503 if busy >= n_slots and "fail_on_no_slot" in query else 200)


async def slots(request: web.Request) -> web.Response:
    """Each slot's state, as llama-server's GET /slots lists it."""
    state: ServerState = request.app["state"]
    if not state.opts.slots_endpoint:
        raise ApiError(501, "This server does not support slots endpoint (it was started with --no-slots)",
                       type="not_supported_error")
    return json_response(await slots_report(state))


async def slots_report(state: ServerState) -> list[dict]:
    """Each slot's state; never the prompt text (another client's conversation)."""
    engine = state.engine
    out = []
    each = engine.checkpoint_bytes
    snap = await engine.call(engine.snapshot)
    for i, held in enumerate(snap["slots"]):
        slot = {
            "id": i, "id_task": -1, "n_ctx": engine.slot_ctx, "speculative": False,
            # No "params": llama-server gives a slot's request's, and a slot here keeps no request's.
            "is_processing": held["busy"], "n_cached_tokens": held["cached"], "prompt": "",
        }
        if each:  # a hybrid's recurrent state, and the copies of it the slot keeps
            cks = held["checkpoints"]
            slot["recurrent_state_bytes"] = each
            slot["checkpoints"] = {"max": engine.checkpoints.count, "bytes": each * len(cks),
                                   "held": [{"pos": p, "taken": why} for p, why in cks]}
        out.append(slot)
    return out


async def _on_slot(engine, fn, *args):
    """Runs a slot operation on the engine thread, between passes (the engine
    is the model's one owner); its refusals (a busy slot, a state of another
    model) are the client's 400s, not internal errors."""
    try:
        return await engine.call(fn, *args)
    except EmberError as e:
        raise from_engine_error(e) from None


async def slot_action(request: web.Request) -> web.Response:
    """POST /slots/{id}?action=save|restore|erase, llama-server's shapes: a
    slot's cache and tokens to and from a file in --slot-save-path."""
    state: ServerState = request.app["state"]
    engine = state.engine
    raw_id = request.match_info["id_slot"]
    if not (raw_id.isascii() and raw_id.isdigit()) or int(raw_id) >= engine.n_slots:
        raise ApiError(400, f"id_slot: no slot {raw_id!r} (there are {engine.n_slots})", param="id_slot")
    slot = int(raw_id)
    action = request.query.get("action")
    loop = asyncio.get_running_loop()
    t0 = time.perf_counter()
    if action == "erase":
        n = await _on_slot(engine, engine.batcher.erase_slot, slot)
        return json_response({"id_slot": slot, "n_erased": n})
    if action not in ("save", "restore"):
        raise ApiError(400, f"action: expected save, restore or erase, got {action!r}", param="action")
    if state.opts.slot_save_path is None:
        raise ApiError(501, "slot save and restore need --slot-save-path", type="not_supported_error")
    try:
        body = json.loads(await read_body(request) or b"{}")
    except (ValueError, RecursionError):
        raise ApiError(400, "the body is not JSON") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the body is not a JSON object")
    filename = check_name(body.get("filename"))
    folder = state.opts.slot_save_path
    if action == "save":
        overwrite = body.get("overwrite", False)
        if not isinstance(overwrite, bool):
            raise ApiError(400, "overwrite: expected true or false", param="overwrite")
        data, n = await _on_slot(engine, engine.batcher.save_slot, slot)
        await loop.run_in_executor(None, write_slot_file, folder, filename, data, overwrite)
        return json_response({"id_slot": slot, "filename": filename, "n_saved": n, "n_written": len(data),
                              "timings": {"save_ms": (time.perf_counter() - t0) * 1e3}})
    data = await loop.run_in_executor(None, read_slot_file, folder, filename)
    n = await _on_slot(engine, engine.batcher.restore_slot, slot, data, request.get("owner", 0))
    return json_response({"id_slot": slot, "filename": filename, "n_restored": n, "n_read": len(data),
                          "timings": {"restore_ms": (time.perf_counter() - t0) * 1e3}})


def add_routes(app: web.Application) -> None:
    kept_streams.add_routes(app)
    app.router.add_get("/slots", slots)
    app.router.add_get("/health", health)
    app.router.add_get("/v1/health", health)
    app.router.add_post("/slots/{id_slot}", slot_action)
    app.router.add_post("/completion", completion)
    app.router.add_post("/completions", completion)
    app.router.add_post("/infill", infill)
    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/detokenize", detokenize)
    app.router.add_post("/apply-template", apply_template)
    app.router.add_get("/props", props)
    app.router.add_get("/metrics", metrics)
