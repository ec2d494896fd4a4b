"""HTTP pieces every route uses: JSON replies, the capped body read,
server-sent events, and the envelope an API's errors travel in, whole or
inside a stream already under way."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import msgspec
from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError

from ember.server.errors import ApiError, error_body

__all__ = ["DEFAULT_ENVELOPE", "Envelope", "envelope_of", "finite", "json_response", "read_body", "sse_send", "sse_start"]


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
        return web.Response(status=err.status, body=msgspec.json.encode(self.body(err)),
                            content_type="application/json", headers=err.headers)

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
