"""HTTP pieces every route uses: JSON replies, the capped body read,
server-sent events, and the envelope an API's errors travel in, whole or
inside a stream already under way."""

from __future__ import annotations

import asyncio
import math
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import msgspec
from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError

from ember.server.errors import ApiError, error_body

__all__ = ["DEFAULT_ENVELOPE", "RUNNER_OPTIONS", "SSE_HEADERS", "reads", "Envelope", "envelope_of", "finite",
           "json_response", "read_body", "sse_send", "sse_start"]


def reads(body_type: type):
    """Marks a handler with the type its request body decodes to: the
    server's OpenAPI document (`ember.server.openapi`) is read from these."""

    def mark(handler):
        handler.request_type = body_type
        return handler

    return mark


#: How the server's runner must read requests for `read_body` (see there).
RUNNER_OPTIONS = {"auto_decompress": False}


def json_response(obj, status: int = 200, headers: dict | None = None) -> web.Response:
    return web.Response(status=status, body=msgspec.json.encode(obj), content_type="application/json", headers=headers)


#: zlib's window bits for the encodings a body may come in: gzip's header and
#: trailer, and HTTP's deflate (zlib-wrapped; a raw deflate stream is tried too).
_ENCODINGS = {"gzip": (31,), "x-gzip": (31,), "deflate": (15, -15)}


async def read_body(request: web.Request) -> bytes:
    """The body, decoded as its Content-Encoding says, refused past the cap
    (compressed or not) without reading or inflating further. The server
    runs its parser with `auto_decompress` off (`RUNNER_OPTIONS`) so that a
    stream cut before its end is seen: aiohttp's own inflating lets a gzip
    body without its trailer through. Read once: a second call (a route
    after the middleware looked) gets the same bytes."""
    if (kept := request.get("body")) is not None:
        return kept
    request["body"] = body = await _read_body(request)
    return body


async def _read_body(request: web.Request) -> bytes:
    limit = request.app["state"].body_limit(request.path)
    too_big = ApiError(413, f"the request body exceeds the limit of {limit} bytes")
    if request.content_length is not None and request.content_length > limit:
        raise too_big
    encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding not in ("identity", "", *_ENCODINGS):
        raise ApiError(415, f"Content-Encoding {encoding!r} is not supported (gzip or deflate)")
    buf = bytearray()
    opts = request.app["state"].opts
    deadline = asyncio.get_running_loop().time() + opts.timeout
    try:
        while True:
            left = deadline - asyncio.get_running_loop().time()
            try:
                chunk = await asyncio.wait_for(request.content.readany(), max(left, 0.001))
            except asyncio.TimeoutError:
                raise ApiError(408, f"the request body did not arrive within {opts.timeout} s (--timeout)",
                               headers={"Connection": "close"}) from None
            if not chunk:
                break
            buf += chunk
            if len(buf) > limit:
                raise too_big
    except RequestPayloadError as e:
        # A body that stops short of its length. Marked read to its end:
        # aiohttp would otherwise drain it after the reply, meet the same
        # error and log it as unhandled.
        request.content.feed_eof()
        raise ApiError(400, f"the request body cannot be read: {' '.join(str(e).split())}") from None
    if encoding in _ENCODINGS:
        return _inflated(bytes(buf), encoding, limit, too_big)
    return bytes(buf)


def _inflated(raw: bytes, encoding: str, limit: int, too_big: ApiError) -> bytes:
    for wbits in _ENCODINGS[encoding]:
        d = zlib.decompressobj(wbits)
        try:
            out = d.decompress(raw, limit + 1)
        except zlib.error as e:
            why = f"not {encoding} ({e})"
            continue
        if len(out) > limit or d.unconsumed_tail:
            raise too_big
        if not d.eof:
            raise ApiError(400, f"the request body cannot be read: its {encoding} stream ends before its end "
                           "(a cut body, or one missing its trailer)")
        if d.unused_data:
            raise ApiError(400, f"the request body cannot be read: bytes follow its {encoding} stream")
        return out
    raise ApiError(400, f"the request body cannot be read: {why}")


#: A server-sent-events reply's headers.
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


async def sse_start(request: web.Request, resp: web.StreamResponse | None = None) -> web.StreamResponse:
    """Starts `request`'s stream: `resp` (one made with `SSE_HEADERS`), else a plain one."""
    resp = resp or web.StreamResponse(headers=SSE_HEADERS)
    await resp.prepare(request)
    request["sse"] = resp
    return resp


async def sse_send(resp: web.StreamResponse, obj, event: str | None = None) -> None:
    data = obj if isinstance(obj, bytes) else msgspec.json.encode(obj)
    head = b"event: " + event.encode() + b"\n" if event else b""
    await resp.write(head + b"data: " + data + b"\n\n")


@dataclass(frozen=True)
class Envelope:
    """How an API's clients read an error: the body of a refused request,
    and the item that carries one inside a stream already under way (whose
    headers are gone)."""

    body: Callable[[ApiError], dict] = error_body
    #: the server-sent event an error travels as in a stream (None: a plain data event)
    stream_event: str | None = None
    #: the API streams lines of JSON, not server-sent events
    lines: bool = False

    def response(self, err: ApiError) -> web.Response:
        resp = web.Response(status=err.status, body=msgspec.json.encode(self.body(err)),
                            content_type="application/json", headers=err.headers)
        if err.headers.get("Connection") == "close":
            resp.force_close()  # the rest of the request is not waited for
        return resp

    async def in_stream(self, resp: web.StreamResponse, err: ApiError) -> None:
        try:
            if self.lines:
                await resp.write(msgspec.json.encode(self.body(err)) + b"\n")
            else:
                await sse_send(resp, self.body(err), event=self.stream_event)
        except (ConnectionError, RuntimeError):
            pass


#: llama-server's, which OpenAI's clients read too: every path no API claims.
DEFAULT_ENVELOPE = Envelope()


def envelope_of(request: web.Request) -> Envelope:
    """The envelope of the API whose paths `request`'s is under (the app's
    table, from each protocol's `ENVELOPES`)."""
    path = request.path
    for prefix, env in request.app.get("envelopes", ()):
        if path == prefix.rstrip("/") or path.startswith(prefix if prefix.endswith("/") else prefix + "/"):
            return env
    return DEFAULT_ENVELOPE


def finite(x: float | None) -> float | None:
    """JSON has no infinities: a -inf log-probability travels as the lowest float."""
    if x is None or math.isfinite(x):
        return x
    return -3.4028234663852886e38 if x < 0 else 3.4028234663852886e38
