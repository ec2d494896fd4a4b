"""The connections the server holds, bounded: a request's head (its line and
headers) must arrive within `head_timeout` of the connection opening or of
the last request ending, an idle kept-alive connection closes after it, at
most `max_connections` are open at once (past them a new one is answered
503 and closed), and what aiohttp's parser refuses (a malformed request) is
one log line and a JSON error instead of a traceback and plain text. The
body's own bound is `ember.server.http.read_body`'s."""

from __future__ import annotations

import asyncio
from typing import Callable

import msgspec
from aiohttp import web, web_protocol, web_runner, web_server

from ember.server.errors import ApiError, error_body

__all__ = ["GuardedRunner"]


class _GuardedServer(web_server.Server):
    """aiohttp's protocol factory, making `_GuardedHandler`s."""

    head_timeout: float = 30.0
    max_connections: int = 256
    log: Callable[[str], None] = staticmethod(lambda line: None)

    def __call__(self) -> web_protocol.RequestHandler:
        return _GuardedHandler(self, loop=self._loop, **self._kwargs)


class _GuardedHandler(web_protocol.RequestHandler):
    __slots__ = ("_head_timer",)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._head_timer = None
        super().connection_made(transport)
        mgr: _GuardedServer = self._manager  # type: ignore[assignment]
        if len(mgr._connections) > mgr.max_connections:
            mgr.log(f"connection refused: {mgr.max_connections} are open already (--max-connections)")
            body = msgspec.json.encode(error_body(ApiError(
                503, f"the server holds {mgr.max_connections} connections already; retry later")))
            transport.write(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
                            b"Connection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            transport.close()
            return
        self._arm()

    def data_received(self, data: bytes) -> None:
        before = self._request_count
        super().data_received(data)
        if self._request_count > before:
            self._disarm()  # a whole head arrived: the handler, and the body's bound, take over
        elif data and self._head_timer is None and not self._messages and not self._request_in_progress:
            self._arm()  # the next request's head has begun on a kept-alive connection

    def connection_lost(self, exc: BaseException | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        mgr: _GuardedServer = self._manager  # type: ignore[assignment]
        self._head_timer = self._loop.call_later(mgr.head_timeout, self._head_late)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_late(self) -> None:
        self._head_timer = None
        if self.transport is None:
            return
        mgr: _GuardedServer = self._manager  # type: ignore[assignment]
        peer = self.transport.get_extra_info("peername")
        mgr.log(f"connection from {peer[0] if peer else '?'} closed: no whole request within "
                f"{mgr.head_timeout:g} s (--timeout)")
        transport = self.transport
        self.force_close()
        transport.close()

    def handle_error(self, request, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        # What aiohttp's parser refuses (a bad request line, a header past its
        # bounds) or a handler that escaped the middleware: one line, and a
        # body in llama-server's envelope.
        mgr: _GuardedServer = self._manager  # type: ignore[assignment]
        what = " ".join(str(message or exc or "error").split())[:200]
        mgr.log(f"{request.method} {request.path} {status}: malformed request: {what}" if status < 500 else
                f"{request.method} {request.path} {status}: {type(exc).__name__ if exc else 'error'}: {what}")
        if request.writer is not None and request.writer.output_size > 0:
            raise ConnectionError("the response was under way")
        resp = web.Response(status=status, content_type="application/json",
                            body=msgspec.json.encode(error_body(ApiError(status, f"malformed request: {what}"
                                                                         if status < 500 else "internal error"))))
        resp.force_close()
        return resp


class GuardedRunner(web_runner.AppRunner):
    """An AppRunner whose connections are `_GuardedHandler`s (see the module)."""

    def __init__(self, app: web.Application, *, head_timeout: float, max_connections: int,
                 log: Callable[[str], None], **kwargs):
        # aiohttp closes a connection whose request is not whole after its
        # keep-alive timeout too: a second later, as the backstop of ours.
        super().__init__(app, keepalive_timeout=head_timeout + 1, **kwargs)
        self._guard = (head_timeout, max_connections, log)

    async def _make_server(self) -> web_server.Server:
        server = await super()._make_server()
        server.__class__ = _GuardedServer
        server.head_timeout, server.max_connections, server.log = self._guard  # type: ignore[attr-defined]
        return server
