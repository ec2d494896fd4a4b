"""HTTP pieces every route uses: JSON replies, the capped body read, and
server-sent events (with an error inside a stream already under way)."""

from __future__ import annotations

import math

import msgspec
from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError

from ember.server.errors import ApiError, anthropic_error_body, error_body

__all__ = ["finite", "json_response", "read_body", "sse_send", "sse_start", "stream_error"]


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
