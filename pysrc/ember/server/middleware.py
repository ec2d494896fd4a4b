"""The middleware every route passes: the key (before the route is even
looked up), the browser guards (Host and Origin), the phase of the load,
CORS, the error envelope of the path, and one log line per request."""

from __future__ import annotations

import asyncio
import time
import traceback

from aiohttp import web
from yarl import URL

from ember.chat.errors import ModelOutputError
from ember.chat.events import Stop
from ember.server.errors import ApiError, from_engine_error
from ember.server.generation import Generation
from ember.server.http import envelope_of, read_body
from ember.server.keys import SCOPES, refusal, scope_needed
from ember.server.sleep import wakes
from ember.server.state import ServerState, unavailable
from ember.server.webui import is_page_request

__all__ = ["allow_origin", "middleware"]


# Reachable without a key and before the model is ready: load balancers poll them.
_PUBLIC = frozenset({"/health", "/v1/health"})


_BEFORE_READY = _PUBLIC | {"/shutdown"}


def _presented_key(request: web.Request, keys: list[str]) -> str | None:
    """The server's key the request presents (a bearer token or Anthropic's
    x-api-key), or None."""
    h = request.headers.get("Authorization", "")
    if h[:7].lower() == "bearer " and h[7:].strip() in keys:
        return h[7:].strip()
    x = request.headers.get("x-api-key", "")
    return x if x and x in keys else None


def _stop_words(g: "Generation") -> str:
    c = g.completion
    if g.cancelled:
        kept = g.request.get("kept_stream")
        return "stopped (DELETE /v1/stream)" if kept is not None and kept.cancelled else "client gone"
    if g.cut_by_shutdown:
        return "cut by the shutdown"
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
            f"{drawn} drawn in {g_s:.2f}s ({rate(drawn, g_s)}), {_stop_words(g)}")


# A preflight is answered before the key is checked (browsers send it
# without one), and only for an origin the server allows.
_CORS_PREFLIGHT = {"Access-Control-Allow-Methods": "GET, POST, DELETE, OPTIONS",
                   "Access-Control-Allow-Headers":
                       "Authorization, Content-Type, x-api-key, anthropic-version, X-Conversation-Id"}


def _same_origin(origin: str, request: web.Request) -> bool:
    """A page served by this server itself (the chat page) calling it."""
    return origin in (f"http://{request.host}", f"https://{request.host}")


def _local_origin(origin: str) -> bool:
    """A page served from this machine: http(s) on localhost, 127.0.0.1 or [::1], any port."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(origin)
        parts.port  # a malformed port raises
    except ValueError:
        return False
    return (parts.scheme in ("http", "https") and parts.path == "" and parts.hostname in ("localhost", "127.0.0.1", "::1")
            and not parts.username)


def _cors(origin: str, opts) -> dict | None:
    """The CORS headers an allowed cross-origin `origin` gets, or None when
    it is not allowed. A page with the opaque origin "null" (a sandboxed
    frame, a file) is never trusted by name, and never with credentials."""
    allowed = opts.cors_origins
    if origin != "null" and (origin in allowed or ("localhost" in allowed and _local_origin(origin))):
        return {"Access-Control-Allow-Origin": origin, "Access-Control-Allow-Credentials": "true", "Vary": "Origin"}
    if "*" in opts.cors_origins:
        return {"Access-Control-Allow-Origin": "*"}
    return None


def _browser_guard(request: web.Request, state: ServerState) -> None:
    """Refuses what a web page the user visits could send: a request from
    an origin not allowed (a page may POST without a preflight), and,
    without a key, one whose Host is not this server's (DNS rebinding: a
    page's own name made to point at this machine)."""
    opts = state.opts
    origin = request.headers.get("Origin")
    if origin is not None and not _same_origin(origin, request) and _cors(origin, opts) is None:
        raise refusal("origin", 403, f"Origin {origin}: a web page of another origin may not call this server "
                      "(allow it with --cors-origin)")
    if not opts.api_keys and not _host_allowed(request.host, opts):
        raise refusal("host", 403, f"Host {request.host}: not an address of this server; without an API key only "
                      "localhost and the address it listens on are answered (DNS rebinding)")


def _host_allowed(host: str, opts) -> bool:
    import ipaddress

    if host.startswith("["):  # [v6]:port
        name = host[1:host.find("]")] if "]" in host else host
    else:
        name = host.split(":")[0] if host.count(":") == 1 else host  # name:port, or a bare v6 literal
    name = name.lower().rstrip(".")
    if name == "localhost" or name in (h.strip("[]").lower() for h in opts.hosts):
        return True
    try:
        ip = ipaddress.ip_address(name)
    except ValueError:
        return False
    if ip.is_loopback:
        return True
    # Bound to every address, the server cannot tell which of them it was
    # reached at: any address of this machine (an IP literal) is answered.
    return any(h in ("0.0.0.0", "::", "[::]") for h in opts.hosts)


async def allow_origin(request: web.Request, response: web.StreamResponse) -> None:
    origin = request.headers.get("Origin")
    if origin and not _same_origin(origin, request):
        headers = _cors(origin, request.app["state"].opts)
        if headers:
            response.headers.update(headers)


async def _outside_prefix(request: web.Request) -> web.StreamResponse:
    raise web.HTTPNotFound()


async def _under_prefix(request: web.Request, prefix: str):
    """The request as the routes see it, and its handler: under --api-prefix
    its path without the prefix, routed again (aiohttp routed the whole
    path), or a 404 for a path outside the prefix, as llama-server answers."""
    url = request.rel_url
    if not url.raw_path.startswith(prefix + "/"):
        return request, _outside_prefix
    # Built from its parts as aiohttp builds a request's: a rest starting "//" stays a path, not a host.
    rest = URL.build(path=url.raw_path[len(prefix):], query_string=url.raw_query_string, encoded=True)
    sub = request.clone(rel_url=rest)
    match = await request.app.router.resolve(sub)
    match.add_app(request.app)
    match.freeze()
    sub._match_info = match  # noqa: SLF001 - as aiohttp sets it on the request it routes
    sub["prefix"] = prefix
    return sub, match.handler


def _shown_path(request: web.Request) -> str:
    """The path as the client sent it, for logs and messages (under
    --api-prefix the routes see it without the prefix)."""
    return request.get("prefix", "") + request.path


@web.middleware
async def middleware(request: web.Request, handler):
    state: ServerState = request.app["state"]
    t0 = time.perf_counter()
    if state.opts.api_prefix:
        request, handler = await _under_prefix(request, state.opts.api_prefix)
    shape = envelope_of(request)
    preflight = request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers
    if preflight and handler is not _outside_prefix:
        try:
            _browser_guard(request, state)
            resp = web.Response(status=200, headers=_CORS_PREFLIGHT)  # as llama-server answers one
        except ApiError as e:
            state.refused(e.cause)  # type: ignore[attr-defined]
            # A preflight from an origin not allowed gets no CORS headers, which
            # is what a browser reads as the refusal (llama-server answers so);
            # the request itself, should the page send it anyway, gets the 403.
            resp = (web.Response(status=200, headers={"X-Ember-Refused": e.message})
                    if e.cause == "origin" else shape.response(e))  # type: ignore[attr-defined]
        _log_request(request, resp, t0, state)
        return resp
    resp = None
    try:
        resp = await _dispatch(request, handler, state)
    except ApiError as e:
        if (cause := getattr(e, "cause", None)) is not None:
            state.refused(cause)
        resp = shape.response(e)
    except web.HTTPException as e:
        resp = shape.response(_http_error(request, e))
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
            state.log(f"{request.method} {_shown_path(request)}: internal error\n{traceback.format_exc().rstrip()}")
        err = from_engine_error(e)
        stream = request.get("sse")
        if stream is not None and stream.prepared:
            # A second response cannot follow the first's headers: the stream ends with the error.
            await shape.in_stream(stream, err)
            resp = stream
        else:
            resp = shape.response(err)
    _log_request(request, resp, t0, state)
    return resp


def _log_request(request, resp, t0, state: ServerState) -> None:
    ms = (time.perf_counter() - t0) * 1e3
    if resp is None:
        status, n = "-", 0
    else:
        status = resp.status
        n = resp.body_length if resp.prepared else len(resp.body or b"") if isinstance(resp, web.Response) else 0
    line = f"{request.method} {_shown_path(request)} {status} {n} {ms:.0f}ms"
    g = request.get("generation")
    if g is not None:
        line += " " + _gen_log(g)
    state.log(line)


def _http_error(request: web.Request, e: web.HTTPException) -> ApiError:
    if e.status == 404:
        return ApiError(404, f"{request.method} {_shown_path(request)}: no such route")
    if e.status == 405:
        return ApiError(405, f"{request.method} {_shown_path(request)}: method not allowed",
                        headers={"Allow": e.headers.get("Allow", "")})
    if e.status == 413:
        return ApiError(413, "the request body is too large")
    return ApiError(e.status, e.reason or "error")


async def _dispatch(request: web.Request, handler, state: ServerState):
    if handler is _outside_prefix:  # nothing answers outside --api-prefix's path: no key or model is asked for
        return await handler(request)
    path = request.path
    keys = state.opts.api_keys
    key = _presented_key(request, keys) if keys else None
    # Whose prompts a slot's cache holds: with keys, each key's own (0: everyone's).
    request["owner"] = keys.index(key) + 1 if key is not None else 0
    if path in _PUBLIC:
        return await _routed(request, handler, state)
    if is_page_request(request):
        _browser_guard(request, state)
        return await handler(request)
    # The key before the route: without one, which routes exist is not told.
    if keys and key is None:
        raise refusal("key", 401, "Invalid API Key")
    _browser_guard(request, state)
    rule = state.opts.key_rules.get(key) if key is not None else None
    request["scopes"] = rule.scopes if rule is not None else frozenset(SCOPES)
    need = scope_needed(request.method, path)
    if need not in request["scopes"]:
        raise refusal("scope", 403, f"{request.method} {path} needs the {need} scope; this key's is "
                      f"{', '.join(sorted(request['scopes']))}", type="permission_error")
    if rule is None:
        return await _routed(request, handler, state)
    state.key_limits.enter(key)
    try:
        return await _routed(request, handler, state)
    finally:
        state.key_limits.leave(key)


async def _routed(request: web.Request, handler, state: ServerState):
    exc = request.match_info.http_exception
    if exc is not None:
        raise exc
    if (state.phase != "ready" or state.closing) and request.path not in _BEFORE_READY:
        raise unavailable(state)
    # Ollama's unload of a sleeping model needs no model: its body is looked at only then.
    body = await read_body(request) if state.asleep and request.path in ("/api/generate", "/api/chat") else None
    if state.phase != "ready" or state.closing or not wakes(request.method, request.path, body):
        return await handler(request)
    async with request.app["sleeper"].awake():
        return await handler(request)
