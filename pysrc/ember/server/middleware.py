"""The middleware every route passes: the key, the phase of the load, CORS,
the error envelope of the path, and one log line per request."""

from __future__ import annotations

import asyncio
import time
import traceback

from aiohttp import web

from ember.chat.errors import ModelOutputError
from ember.chat.events import Stop
from ember.model import Completion
from ember.server.errors import ApiError, error_response, from_engine_error
from ember.server.generation import Generation
from ember.server.http import stream_error
from ember.server.state import ServerState, envelope, unavailable

__all__ = ["allow_origin", "middleware"]


# Reachable without a key and before the model is ready: load balancers poll them.
_PUBLIC = frozenset({"/health", "/v1/health"})


_BEFORE_READY = _PUBLIC | {"/shutdown"}


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
    stop = Stop.of(c)
    if stop is Stop.STOP_SEQUENCE:
        return f"stop string {c.stop_string!r}"
    return _ENDED[stop]


#: How the log line says a generation ended.
_ENDED = {Stop.END_TURN: "end of generation", Stop.TOOL_CALLS: "end of generation", Stop.LENGTH: "max tokens",
          Stop.CONTEXT: "context full"}


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


async def allow_origin(request: web.Request, response: web.StreamResponse) -> None:
    origin = request.headers.get("Origin")
    if origin:
        response.headers["Access-Control-Allow-Origin"] = origin


@web.middleware
async def middleware(request: web.Request, handler):
    state: ServerState = request.app["state"]
    t0 = time.perf_counter()
    if request.method == "OPTIONS":
        resp = web.Response(status=200, headers=_CORS_PREFLIGHT)
        _log_request(request, resp, t0, state)
        return resp
    resp = None
    shape = envelope(request.path)
    try:
        resp = await _dispatch(request, handler, state)
    except ApiError as e:
        resp = error_response(e, envelope=shape)
    except web.HTTPException as e:
        resp = error_response(_http_error(request, e), envelope=shape)
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
        if not isinstance(e, ModelOutputError):  # the model's doing, not a bug: no traceback
            state.log(f"{request.method} {request.path}: internal error\n{traceback.format_exc().rstrip()}")
        err = from_engine_error(e)
        stream = request.get("sse")
        if stream is not None and stream.prepared:
            # A second response cannot follow the first's headers: the stream ends with the error.
            await stream_error(stream, err, shape)
            resp = stream
        else:
            resp = error_response(err, envelope=shape)
    _log_request(request, resp, t0, state)
    return resp


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
        raise unavailable(state)
    return await handler(request)
