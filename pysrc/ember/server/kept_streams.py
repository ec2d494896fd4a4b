"""Resumable streams, as llama-server keeps them. A streamed reply whose
request carries `X-Conversation-Id` is kept as it is sent (the bytes of its
server-sent events) and goes on when its client leaves, so a client that
comes back (a page reloaded mid-reply) reads it again from any byte offset
and follows it live: `GET /v1/stream?conv_id=ID&from=N`.
`POST /v1/streams/lookup` says which of the ids a client names have a
stream kept, and `DELETE /v1/stream?conv_id=ID` stops one (its generation
cancelled) and forgets it.

One stream an id: a new request under an id stops the stream before it.
Each keeps its last 4 MiB (a reader behind that is told its offset is lost);
a finished one is kept five minutes, and at most 32 finished ones are kept,
the oldest going first. With API keys a stream is its key's: another key is
told it does not exist."""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict

import msgspec
from aiohttp import web

from ember.server import wire
from ember.server.errors import ApiError
from ember.server.http import SSE_HEADERS, json_response, read_body, reads

__all__ = ["HEADER", "KeptStream", "KeptStreams", "add_routes", "begin_kept", "end_kept", "kept_response"]

#: The request header that asks for a streamed reply to be kept.
HEADER = "X-Conversation-Id"
#: Most bytes of a stream kept (its tail); llama-server keeps as many.
MAX_BYTES = 4 * 2**20
#: How long a finished stream is kept, and how many finished ones at most.
TTL_SECONDS = 300
MAX_FINISHED = 32


class OffsetLost(Exception):
    """The bytes from the asked offset on are no longer all kept."""


class KeptStream:
    def __init__(self, conv_id: str, owner: int, max_bytes: int = MAX_BYTES):
        self.conv_id = conv_id
        self.owner = owner
        self.max_bytes = max_bytes
        self.started_at = int(time.time())
        #: wall-clock seconds it finished at (0 while it runs), and the monotonic ones its keeping counts from
        self.completed_at = 0
        self.finished_mono: float | None = None
        #: stopped by DELETE or by a newer stream under its id: its generation is abandoned
        self.cancelled = False
        self._buffer = bytearray()
        self._dropped = 0
        self._changed = asyncio.Event()

    @property
    def done(self) -> bool:
        return self.finished_mono is not None

    @property
    def total_bytes(self) -> int:
        return self._dropped + len(self._buffer)

    @property
    def dropped(self) -> int:
        return self._dropped

    def append(self, data: bytes) -> None:
        if self.done or not data:
            return
        self._buffer += data
        over = len(self._buffer) - self.max_bytes
        if over > 0:
            del self._buffer[:over]
            self._dropped += over
        self._wake()

    def finish(self) -> None:
        if not self.done:
            self.finished_mono = time.monotonic()
            self.completed_at = int(time.time())
            self._wake()

    def cancel(self) -> None:
        self.cancelled = True
        self.finish()

    def _wake(self) -> None:
        # Readers wait on the event they saw; a fresh one is for the next change.
        self._changed.set()
        self._changed = asyncio.Event()

    async def read_from(self, offset: int):
        """The bytes from `offset` on, as they come, until the stream ends."""
        while True:
            if offset < self._dropped:
                raise OffsetLost()
            changed = self._changed
            if offset < self.total_bytes:
                chunk = bytes(self._buffer[offset - self._dropped:])
                offset += len(chunk)
                yield chunk
                continue
            if self.done:
                return
            await changed.wait()

    def describe(self) -> dict:
        return {"conversation_id": self.conv_id, "is_done": self.done, "total_bytes": self.total_bytes,
                "started_at": self.started_at, "completed_at": self.completed_at}


class KeptStreams:
    """The streams kept, by (owner, conversation id)."""

    def __init__(self, max_finished: int = MAX_FINISHED, ttl: float = TTL_SECONDS, max_bytes: int = MAX_BYTES):
        self.max_finished = max_finished
        self.ttl = ttl
        self.max_bytes = max_bytes
        self._items: OrderedDict[tuple[int, str], KeptStream] = OrderedDict()

    def start(self, conv_id: str, owner: int) -> KeptStream:
        """A new stream under `conv_id`, the one it had before stopped."""
        self.stop(conv_id, owner)
        kept = KeptStream(conv_id, owner, self.max_bytes)
        self._items[(owner, conv_id)] = kept
        self._forget_old()
        return kept

    def get(self, conv_id: str, owner: int) -> KeptStream | None:
        self._forget_old()
        return self._items.get((owner, conv_id))

    def lookup(self, ids: list[str], owner: int) -> list[KeptStream]:
        """The streams kept under each of `ids`, or under `ID::model` (as
        llama-server's router names one stream a model)."""
        self._forget_old()
        out = []
        for rid in ids:
            out += [s for (o, cid), s in self._items.items()
                    if o == owner and (cid == rid or cid.startswith(rid + "::"))]
        return out

    def stop(self, conv_id: str, owner: int) -> None:
        kept = self._items.pop((owner, conv_id), None)
        if kept is not None:
            kept.cancel()

    def forget(self, kept: KeptStream) -> None:
        """Drops `kept` without stopping anything (its request never streamed)."""
        if self._items.get((kept.owner, kept.conv_id)) is kept:
            del self._items[(kept.owner, kept.conv_id)]

    def _forget_old(self) -> None:
        now = time.monotonic()
        finished = [k for k, s in self._items.items() if s.done]
        for k in finished:
            if now - self._items[k].finished_mono >= self.ttl:
                del self._items[k]
        finished = [k for k in finished if k in self._items]
        # Oldest first: the order they were started in.
        for k in finished[:max(0, len(finished) - self.max_finished)]:
            del self._items[k]


class KeptStreamResponse(web.StreamResponse):
    """A server-sent-events reply whose bytes are also kept: once its client
    is gone the bytes go on into the kept stream only."""

    def __init__(self, kept: KeptStream, **kwargs):
        super().__init__(**kwargs)
        self.kept = kept
        self.client_gone = False

    async def write(self, data) -> None:
        self.kept.append(bytes(data))
        if not self.client_gone:
            try:
                await super().write(data)
            except (ConnectionError, RuntimeError):
                self.client_gone = True

    async def write_eof(self, data: bytes = b"") -> None:
        self.kept.append(bytes(data))
        self.kept.finish()
        try:
            await super().write_eof(b"" if self.client_gone else data)
        except (ConnectionError, RuntimeError):
            self.client_gone = True


def kept_response(request: web.Request) -> KeptStreamResponse | None:
    """The stream response of a generating route whose request asked for its
    reply to be kept (`begin_kept` ran), else None."""
    kept = request.get("kept_stream")
    return None if kept is None else KeptStreamResponse(kept, headers=SSE_HEADERS)


def begin_kept(request: web.Request) -> KeptStream | None:
    """Starts keeping the streamed reply `request` is about to get, when it
    carries `X-Conversation-Id`."""
    conv_id = request.headers.get(HEADER, "")
    if not conv_id:
        return None
    kept = request.app["state"].kept_streams.start(conv_id, request.get("owner", 0))
    request["kept_stream"] = kept
    return kept


def end_kept(request: web.Request) -> None:
    """Ends the kept stream of `request`'s reply, however the reply ended: one
    refused before it streamed is forgotten (there is nothing to read again)."""
    kept = request.get("kept_stream")
    if kept is not None:
        if "sse" not in request:
            request.app["state"].kept_streams.forget(kept)
        kept.finish()


# -- the routes ---------------------------------------------------------------------

def _conv_id(request: web.Request) -> str:
    conv_id = request.query.get("conv_id", "")
    if not conv_id:
        raise ApiError(400, f"conv_id: required (the {HEADER} the stream was started under)", param="conv_id")
    return conv_id


async def replay(request: web.Request) -> web.StreamResponse:
    """`GET /v1/stream?conv_id=ID&from=N`: the kept bytes from offset N
    (0 by default), then the rest as it comes, until the stream ends."""
    conv_id = _conv_id(request)
    raw = request.query.get("from", "0")
    if not raw.isdigit():
        raise ApiError(400, f"from: expected a byte offset (a whole number), got {raw[:40]!r}", param="from")
    offset = int(raw)
    kept = request.app["state"].kept_streams.get(conv_id, request.get("owner", 0))
    if kept is None:
        raise ApiError(404, f"conv_id: no stream is kept under {conv_id[:80]!r} (never started, stopped, or "
                       "expired)", type="not_found_error", param="conv_id")
    if offset < kept.dropped:
        raise ApiError(400, f"from: the stream's first {kept.dropped} bytes are no longer kept (it keeps its last "
                       f"{kept.max_bytes}); start again from {kept.dropped} or later", param="from")
    if offset > kept.total_bytes:
        raise ApiError(400, f"from: past the stream's {kept.total_bytes} bytes sent so far", param="from")
    resp = web.StreamResponse(headers=SSE_HEADERS)
    await resp.prepare(request)
    try:
        async for chunk in kept.read_from(offset):
            await resp.write(chunk)
        await resp.write_eof()
    except OffsetLost:
        pass  # the reader fell more than the kept bytes behind: the stream ends short, as on llama-server
    except (ConnectionError, RuntimeError):
        pass
    return resp


async def stop(request: web.Request) -> web.Response:
    """`DELETE /v1/stream?conv_id=ID`: the stream stopped (its generation
    cancelled) and forgotten; 204 whether or not one was kept."""
    request.app["state"].kept_streams.stop(_conv_id(request), request.get("owner", 0))
    return web.Response(status=204)


class LookupBody(msgspec.Struct, forbid_unknown_fields=False):
    conversation_ids: list[str] = []


@reads(LookupBody)
async def lookup(request: web.Request) -> web.Response:
    """`POST /v1/streams/lookup`: the kept streams of the ids named (only
    those: the server lists no id it was not asked about)."""
    body = wire.decode(await read_body(request), LookupBody)
    found = request.app["state"].kept_streams.lookup([i for i in body.conversation_ids if i],
                                                     request.get("owner", 0))
    return json_response([s.describe() for s in found])


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/stream", replay)
    app.router.add_delete("/v1/stream", stop)
    app.router.add_post("/v1/streams/lookup", lookup)
