"""The HTTP application `ember serve` runs: loading the model behind a listening
socket, the middleware every route passes (auth, CORS, body cap, error envelope,
one log line per request), and the generation plumbing every API's routes share."""

from __future__ import annotations

import asyncio
import ipaddress
import math
import sys
import threading
import time
import traceback
import warnings
from dataclasses import dataclass, field
from typing import Callable

import msgspec
from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError

from ember.engine import CHUNK_TARGET_S
from ember.model import Completion
from ember.server.errors import (ApiError, anthropic_error_body, error_body, error_response, exceed_context,
                                 from_engine_error)
from ember.server.options import ServerOptions

__all__ = ["create_app", "ServerState", "Generation", "read_body", "json_response"]

# Anthropic's Messages routes and Ollama's answer errors in their own envelopes.
ANTHROPIC_PREFIX = "/v1/messages"
OLLAMA_PREFIX = "/api/"


def _envelope(path: str) -> str:
    if path == ANTHROPIC_PREFIX or path.startswith(ANTHROPIC_PREFIX + "/"):
        return "anthropic"
    return "ollama" if path.startswith(OLLAMA_PREFIX) else "llama"

# Reachable without a key and before the model is ready: load balancers poll them.
_PUBLIC = frozenset({"/health", "/v1/health"})
_BEFORE_READY = _PUBLIC | {"/shutdown"}


@dataclass
class Metrics:
    prompt_tokens: int = 0
    prompt_seconds: float = 0.0
    predicted_tokens: int = 0
    predicted_seconds: float = 0.0
    requests: int = 0


@dataclass
class ServerState:
    opts: ServerOptions
    log: Callable[[str], None]
    model: object = None
    engine: object = None
    phase: str = "loading"  # "loading" | "ready" | "failed"
    load_error: str | None = None
    template: str | None = None
    started: float = field(default_factory=time.time)
    metrics: Metrics = field(default_factory=Metrics)
    closing: bool = False
    #: the tool-call framing of each chat template in use, found once
    framings: dict = field(default_factory=dict)
    #: the model as Ollama's routes describe it (entry, file metadata), read once
    ollama_model: tuple | None = None
    #: embedding passes run one at a time (each beside the engine's passes)
    embed_lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def body_limit(self) -> int:
        if self.opts.body_limit is not None:
            return self.opts.body_limit
        # Room for a prompt that fills the context, at a generous 16 bytes a token, plus the envelope.
        n_ctx = self.model.n_ctx if self.model is not None else (self.opts.ctx_size or 8192)
        return 64 * 1024 + 16 * n_ctx

    @property
    def slot_ctx(self) -> int:
        """Positions one request may fill: the context cut among the slots."""
        return self.engine.slot_ctx if self.engine is not None else self.model.n_ctx

    def model_id(self) -> str:
        if self.opts.alias:
            return self.opts.alias
        if self.model is not None:
            return self.model.name
        return _stem(self.opts.model or "ember")


def _stem(path: str) -> str:
    from pathlib import Path

    return Path(path).stem


def json_response(obj, status: int = 200, headers: dict | None = None) -> web.Response:
    return web.Response(status=status, body=msgspec.json.encode(obj), content_type="application/json", headers=headers)


async def read_body(request: web.Request) -> bytes:
    """The body, decompressed by aiohttp's parser, refused past the cap without reading further."""
    limit = request.app["state"].body_limit()
    too_big = ApiError(413, f"the request body exceeds the limit of {limit} bytes")
    if request.content_length is not None and request.content_length > limit:
        raise too_big
    buf = bytearray()
    try:
        async for chunk in request.content.iter_any():
            buf += chunk
            if len(buf) > limit:
                raise too_big
    except RequestPayloadError as e:
        # A body that does not decode as its Content-Encoding says, or stops
        # short. Marked read to its end: aiohttp would otherwise drain it
        # after the reply, meet the same error and log it as unhandled.
        request.content.feed_eof()
        raise ApiError(400, f"the request body cannot be read: {' '.join(str(e).split())}") from None
    return bytes(buf)


def _is_loopback(remote: str | None) -> bool:
    if not remote:
        return False
    try:
        return ipaddress.ip_address(remote.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def _auth_ok(request: web.Request, keys: list[str]) -> bool:
    h = request.headers.get("Authorization", "")
    if h[:7].lower() == "bearer " and h[7:].strip() in keys:
        return True
    return request.headers.get("x-api-key", "") in keys and request.headers.get("x-api-key", "") != ""


def _stop_words(c: Completion | None, cancelled: bool) -> str:
    if cancelled:
        return "client gone"
    if c is None:
        return "failed"
    if c.stop_string is not None:
        return f"stop string {c.stop_string!r}"
    return {"stop": "end of generation", "length": "max tokens", "context": "context full"}.get(c.finish_reason, c.finish_reason)


def _gen_log(g: "Generation") -> str:
    c = g.completion
    n_prompt = len(g.prompt)
    drawn = len(c.tokens) if c is not None else g.n_drawn
    p_s = (c.prompt_ms / 1e3) if c is not None else 0.0
    g_s = (c.gen_ms / 1e3) if c is not None else time.perf_counter() - g.t0
    rate = lambda n, s: f"{n / s:.0f}/s" if s > 0 else "-"
    n_read = n_prompt - g.n_cached
    job = g.job
    where = ""
    if job is not None and job.slot is not None:
        where = f"slot {job.slot}{' after waiting for one' if job.waited else ''}, "
    resume = f" [{job.resume}]" if job is not None and job.resume else ""
    return (f"{where}prompt {n_prompt} ({g.n_cached} cached{resume}) in {p_s:.2f}s ({rate(n_read, p_s)}), "
            f"{drawn} drawn in {g_s:.2f}s ({rate(drawn, g_s)}), {_stop_words(c, g.cancelled)}")


# CORS as llama-server answers it by default: any origin, with credentials
# (the page's Origin echoed back), these methods and any header. A preflight
# is answered before the key is checked: browsers send it without one.
_CORS_PREFLIGHT = {"Access-Control-Allow-Credentials": "true", "Access-Control-Allow-Methods": "GET, POST, DELETE, OPTIONS",
                   "Access-Control-Allow-Headers": "*"}


async def _allow_origin(request: web.Request, response: web.StreamResponse) -> None:
    origin = request.headers.get("Origin")
    if origin:
        response.headers["Access-Control-Allow-Origin"] = origin


@web.middleware
async def _middleware(request: web.Request, handler):
    state: ServerState = request.app["state"]
    t0 = time.perf_counter()
    if request.method == "OPTIONS":
        resp = web.Response(status=200, headers=_CORS_PREFLIGHT)
        _log_request(request, resp, t0, state)
        return resp
    resp = None
    envelope = _envelope(request.path)
    try:
        resp = await _dispatch(request, handler, state)
    except ApiError as e:
        resp = error_response(e, envelope=envelope)
    except web.HTTPException as e:
        resp = error_response(_http_error(request, e), envelope=envelope)
    except asyncio.CancelledError:
        _log_request(request, request.get("sse"), t0, state)
        raise
    except ConnectionError:
        # The client left. A reply handed back to aiohttp that cannot be
        # written is dropped quietly; an exception would be logged as a
        # server error with its traceback.
        resp = request.get("sse")
        _log_request(request, resp, t0, state)
        return resp if resp is not None else web.Response(status=499)
    except Exception as e:
        state.log(f"{request.method} {request.path}: internal error\n{traceback.format_exc().rstrip()}")
        err = from_engine_error(e)
        stream = request.get("sse")
        if stream is not None and stream.prepared:
            # A second response cannot follow the first's headers: the stream ends with the error.
            await stream_error(stream, err, envelope)
            resp = stream
        else:
            resp = error_response(err, envelope=envelope)
    _log_request(request, resp, t0, state)
    return resp


def _shared_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _log_request(request, resp, t0, state: ServerState) -> None:
    ms = (time.perf_counter() - t0) * 1e3
    if resp is None:
        status, n = "-", 0
    else:
        status = resp.status
        n = resp.body_length if resp.prepared else len(resp.body or b"") if isinstance(resp, web.Response) else 0
    line = f"{request.method} {request.path} {status} {n} {ms:.0f}ms"
    g = request.get("generation")
    if g is not None:
        line += " " + _gen_log(g)
    state.log(line)


def _http_error(request: web.Request, e: web.HTTPException) -> ApiError:
    if e.status == 404:
        return ApiError(404, f"{request.method} {request.path}: no such route")
    if e.status == 405:
        return ApiError(405, f"{request.method} {request.path}: method not allowed", headers={"Allow": e.headers.get("Allow", "")})
    if e.status == 413:
        return ApiError(413, "the request body is too large")
    return ApiError(e.status, e.reason or "error")


async def _dispatch(request: web.Request, handler, state: ServerState):
    exc = request.match_info.http_exception
    if exc is not None:
        raise exc
    path = request.path
    if state.opts.api_keys and path not in _PUBLIC and not _auth_ok(request, state.opts.api_keys):
        raise ApiError(401, "Invalid API Key")
    if state.phase != "ready" and path not in _BEFORE_READY:
        raise _unavailable(state)
    return await handler(request)


def _unavailable(state: ServerState) -> ApiError:
    if state.phase == "failed":
        return ApiError(503, f"the model failed to load: {state.load_error}")
    if state.closing:
        return ApiError(503, "the server is shutting down")
    return ApiError(503, "Loading model")


async def health(request: web.Request) -> web.Response:
    state: ServerState = request.app["state"]
    if state.phase != "ready" or state.closing:
        raise _unavailable(state)
    return json_response({"status": "ok"})


async def shutdown(request: web.Request) -> web.Response:
    if not _is_loopback(request.remote):
        raise ApiError(403, "shutdown is accepted only from this machine (a loopback address)")
    if request.headers.get("Origin"):
        # A web page's request: a browser on this machine is loopback too, and any page could send it.
        raise ApiError(403, "shutdown is not accepted from a web page (the request carries an Origin)")
    stop = request.app.get("request_shutdown")
    if stop is None:
        raise ApiError(501, "this server was started without a way to shut it down")
    stop(f"POST /shutdown from {request.remote}")
    return json_response({"status": "shutting down"})


# -- generation plumbing -----------------------------------------------------

class ClientGone(Exception):
    """The peer closed the connection: the job was cancelled."""


class Generation:
    """One request's job in the engine, seen by its handler: prompt checks,
    submission, events with the client watched, and the stats the log line and
    /metrics read. Use as ``async with``: leaving early cancels the job."""

    def __init__(self, request: web.Request, prompt: list[int], max_tokens: int, options: dict,
                 slot: int | None = None):
        from ember.engine import GenerationRequest

        self.request = request
        self.state: ServerState = request.app["state"]
        model = self.state.model
        if not prompt:
            raise ApiError(400, "prompt: empty", param="prompt")
        n_ctx = self.state.slot_ctx
        if len(prompt) >= n_ctx:
            raise exceed_context(len(prompt), n_ctx)
        bad = next((t for t in prompt if not 0 <= t < model.n_vocab), None)
        if bad is not None:
            raise ApiError(400, f"prompt: token id {bad} is outside the vocabulary (0..{model.n_vocab - 1})", param="prompt")
        if max_tokens < 0:  # -1: until the context is full, which the engine reports as "context"
            max_tokens = n_ctx
        next_text = options.pop("checkpoint_next_text", None)
        if next_text is not None:
            # The chat layer's next turn, rendered: where its tokens leave
            # this prompt's is where the slot keeps a checkpoint.
            parting = _shared_prefix(prompt, model.chat_text_ids(next_text))
            if parting > 0:
                options["checkpoint_hints"] = [parting]
        self.prompt = prompt
        self.max_tokens = max_tokens
        self.options = options
        self.completion: Completion | None = None
        self.cancelled = False
        self.n_drawn = 0
        self.t0 = time.perf_counter()
        self._req = GenerationRequest(prompt, max_tokens, options, slot)
        self.job = None
        self._watch: asyncio.Task | None = None
        self._stream = None
        self._first = None

    async def __aenter__(self) -> "Generation":
        try:
            self.job = self.state.engine.submit(self._req)
        except Exception as e:
            raise from_engine_error(e)
        self.request["generation"] = self
        self._watch = asyncio.get_running_loop().create_task(self._watch_client())
        return self

    async def __aexit__(self, et, ev, tb) -> None:
        if self._watch is not None:
            self._watch.cancel()
        if self.completion is None:
            self.cancelled = et is None or issubclass(et, (ClientGone, asyncio.CancelledError, ConnectionError))
            self.job.cancel()
        else:
            m = self.state.metrics
            m.requests += 1
            m.prompt_tokens += self.completion.n_prompt
            m.prompt_seconds += self.completion.prompt_ms / 1e3
            m.predicted_tokens += len(self.completion.tokens)
            m.predicted_seconds += self.completion.gen_ms / 1e3
        if isinstance(ev, ClientGone):
            raise ConnectionResetError("client gone") from None

    async def _watch_client(self) -> None:
        # aiohttp need not cancel a handler whose peer left; a queued job would then
        # wait for the model, so the connection is watched while nothing is written.
        while True:
            await asyncio.sleep(0.2)
            t = self.request.transport
            if t is None or t.is_closing():
                self.job.abandon(ClientGone())
                return

    async def whole(self) -> Completion:
        """Runs the job to its end and returns its completion, for a reply
        answered whole (its pieces are in the completion's text)."""
        async with self:
            async for _ in self.events():
                pass
        return self.completion

    async def first_event(self) -> None:
        """Waits for the job's first event (it comes once the prompt is read):
        a stream starts only after, so a request the engine refuses is still
        answered with a status and its error envelope, not a stream event."""
        self._stream = self._events()
        self._first = await anext(self._stream)

    async def events(self):
        """The job's pieces and completion; engine errors raised as ApiErrors."""
        stream = self._stream or self._events()
        if self._first is not None:
            first, self._first = self._first, None
            yield first
        async for ev in stream:
            yield ev

    async def _events(self):
        try:
            async for ev in self.job.events():
                if isinstance(ev, Completion):
                    self.completion = ev
                else:
                    if ev.token is not None:
                        self.n_drawn += 1
                yield ev
        except ClientGone:
            raise
        except Exception as e:
            raise from_engine_error(e, n_prompt=len(self.prompt), n_ctx=self.state.slot_ctx)

    @property
    def n_cached(self) -> int:
        return self.completion.n_cached if self.completion else 0

    def timings(self) -> dict:
        # As llama-server: prompt_n counts the prompt tokens read, cache_n those reused.
        c = self.completion
        n_p, n_g = len(self.prompt) - self.n_cached, len(c.tokens) if c else self.n_drawn
        p_ms, g_ms = (c.prompt_ms, c.gen_ms) if c else (0.0, 0.0)
        return {
            "cache_n": self.n_cached,
            "prompt_n": n_p,
            "prompt_ms": p_ms,
            "prompt_per_token_ms": p_ms / n_p if n_p else 0.0,
            "prompt_per_second": n_p * 1e3 / p_ms if p_ms > 0 else 0.0,
            "predicted_n": n_g,
            "predicted_ms": g_ms,
            "predicted_per_token_ms": g_ms / n_g if n_g else 0.0,
            "predicted_per_second": n_g * 1e3 / g_ms if g_ms > 0 else 0.0,
        }


async def sse_start(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                       "X-Accel-Buffering": "no"})
    await resp.prepare(request)
    request["sse"] = resp
    return resp


async def sse_send(resp: web.StreamResponse, obj, event: str | None = None) -> None:
    data = obj if isinstance(obj, bytes) else msgspec.json.encode(obj)
    head = b"event: " + event.encode() + b"\n" if event else b""
    await resp.write(head + b"data: " + data + b"\n\n")


async def stream_error(resp: web.StreamResponse, err: ApiError, envelope: str = "llama") -> None:
    """`err` inside a stream already under way: its headers are gone, so the
    error travels as the stream's next item, in the envelope its clients
    parse (an `error` event on Anthropic's routes, a line on Ollama's)."""
    try:
        if envelope == "anthropic":
            await sse_send(resp, anthropic_error_body(err), event="error")
        elif envelope == "ollama":
            await resp.write(msgspec.json.encode({"error": err.message}) + b"\n")
        else:
            await sse_send(resp, error_body(err))
    except (ConnectionError, RuntimeError):
        pass


def finite(x: float | None) -> float | None:
    """JSON has no infinities: a -inf log-probability travels as the lowest float."""
    if x is None or math.isfinite(x):
        return x
    return -3.4028234663852886e38 if x < 0 else 3.4028234663852886e38


# -- the app -----------------------------------------------------------------

def _load(state: ServerState, loop: asyncio.AbstractEventLoop, app: web.Application) -> None:
    try:
        from ember.engine import Engine
        from ember.model import Model

        opts = state.opts
        template = None
        if opts.chat_template_file:
            with open(opts.chat_template_file, encoding="utf-8") as f:
                template = f.read()
        model = Model(opts.model, n_ctx=opts.ctx_size, threads=opts.threads, kv_type=opts.kv_type)
        from ember.engine import measure_chunk

        from ember.engine import Checkpoints
        from ember.server.cli import _mem_available

        host = opts.cache_ram_mib * 2**20 if opts.cache_ram_mib >= 0 else 2**62
        checkpoints = Checkpoints(opts.ctx_checkpoints, opts.checkpoint_interval, opts.checkpoint_min_step,
                                  _mem_available() or 0)
        engine = Engine(model, queue_depth=opts.queue_depth, slots=opts.parallel, chunk=measure_chunk(model),
                        host_cache_bytes=host, checkpoints=checkpoints)
        engine.start()
        _say_checkpoints(state, engine)
    except BaseException as e:  # noqa: BLE001 - any failure must reach the runner, not kill a thread silently
        msg = f"{type(e).__name__}: {e}" if not str(e) else str(e)
        _post(loop, _loaded, app, None, None, None, msg)
        return
    if not _post(loop, _loaded, app, model, engine, template, None):
        engine.close()  # the server stopped while the model loaded: nobody will use it


def _say_checkpoints(state: ServerState, engine) -> None:
    """The start line of a hybrid model's checkpoints: their size, how many,
    where they are taken, and why fewer than asked when memory would not
    hold them."""
    each = engine.batcher.checkpoint_bytes
    if not each:
        return
    c, asked = engine.checkpoints, state.opts.ctx_checkpoints
    size = f"{_bytes(each)} each (a slot's recurrent states)"
    if c.count == 0:
        why = f": {engine.checkpoints_cut}" if engine.checkpoints_cut else " (--ctx-checkpoints 0)"
        state.log(f"ember: checkpoints: none{why}; a prompt that parts from what its slot holds is read from the start")
        return
    where = "where a prompt parts from what its slot held, where the next chat turn will part"
    if c.interval:
        where += f", and every {c.interval} positions of a long prompt"
        if c.min_step:
            where += f" (at least {c.min_step} from any other)"
    total = _bytes(c.reserved(each, engine.n_slots))
    cut = f", not the {asked} asked: {engine.checkpoints_cut}" if engine.checkpoints_cut else ""
    state.log(f"ember: checkpoints: up to {c.count} per slot{cut}; {size}, {total} for every slot, counted "
              f"in the host prompt cache; taken {where}")


def _bytes(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


def _post(loop: asyncio.AbstractEventLoop, fn, *args) -> bool:
    """Runs `fn(*args)` on the loop; False when the loop has already closed."""
    try:
        loop.call_soon_threadsafe(fn, *args)
        return True
    except RuntimeError:
        return False


def _loaded(app: web.Application, model, engine, template, error: str | None) -> None:
    state: ServerState = app["state"]
    if error is not None:
        # The runner says it once it sees the event, and exits non-zero.
        state.phase, state.load_error = "failed", error
        app["load_failed"].set()
        return
    state.model, state.engine, state.template = model, engine, template
    # The runner reads them from the app once the load is done; aiohttp frowns on
    # changing a started app, but these keys are set exactly once, by design.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        app["model"], app["engine"] = model, engine
    state.phase = "ready"
    slots = f"{engine.n_slots} slots of {engine.slot_ctx} positions" if engine.n_slots > 1 else f"context {engine.slot_ctx}"
    state.log(f"ember: model {state.model_id()} loaded ({slots}; prompts read {engine.chunk} tokens per pass, "
              f"so a pass beside other conversations stays near {CHUNK_TARGET_S * 1e3:.0f} ms)")
    app["ready"].set()
    if state.closing:
        engine.close(0)


async def _on_startup(app: web.Application) -> None:
    loop = asyncio.get_running_loop()
    # Not a daemon, for the reason the engine thread is not one: exit waits
    # for the load to return rather than killing it inside the model.
    t = threading.Thread(target=_load, args=(app["state"], loop, app), name="ember-load", daemon=False)
    t.start()


async def _on_cleanup(app: web.Application) -> None:
    state: ServerState = app["state"]
    state.closing = True
    if state.engine is not None:
        await asyncio.get_running_loop().run_in_executor(None, state.engine.close, 5.0)


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def create_app(opts: ServerOptions, *, log: Callable[[str], None] | None = None) -> web.Application:
    from ember.server import (anthropic_routes, embedding_routes, llama_routes, ollama_routes, openai_routes,
                              responses_routes)

    # The body cap is enforced while reading (read_body), so aiohttp's own is only a backstop.
    app = web.Application(middlewares=[_middleware], client_max_size=2**40)
    app["state"] = ServerState(opts=opts, log=log or _stderr)
    app["opts"] = opts
    app["model"] = None
    app["engine"] = None
    app["ready"] = asyncio.Event()
    app["load_failed"] = asyncio.Event()
    app.router.add_get("/health", health)
    app.router.add_get("/v1/health", health)
    app.router.add_post("/shutdown", shutdown)
    openai_routes.add_routes(app)
    anthropic_routes.add_routes(app)
    responses_routes.add_routes(app)
    embedding_routes.add_routes(app)
    ollama_routes.add_routes(app)
    llama_routes.add_routes(app)
    app.on_response_prepare.append(_allow_origin)
    app.on_startup.append(_on_startup)
    app.on_cleanup.append(_on_cleanup)
    return app
