"""The HTTP application `ember serve` runs, composed: the middleware, the
server's life (lifecycle.py) and the routes of every API (protocols/).
Everything the routes share lives in the modules below them: state.py,
http.py, generation.py, errors.py."""

from __future__ import annotations

import asyncio
import sys
from typing import Callable

from aiohttp import web

from ember.server import webui
from ember.server.protocols import PROTOCOLS
from ember.server.lifecycle import load_engine, on_cleanup, on_startup, publish, shutdown
from ember.server.middleware import allow_origin, middleware
from ember.server.openapi import openapi
from ember.server.options import ServerOptions
from ember.server.sleep import Sleeper
from ember.server.state import ServerState

__all__ = ["create_app"]


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def create_app(opts: ServerOptions, *, log: Callable[[str], None] | None = None) -> web.Application:
    # The body cap is enforced while reading (read_body), so aiohttp's own is only a backstop.
    app = web.Application(middlewares=[middleware], client_max_size=2**40)
    app["state"] = ServerState(opts=opts, log=log or _stderr)
    app["opts"] = opts
    app["model"] = None
    app["engine"] = None
    # Ollama's keep_alive may set an idle time where the flag set none.
    app["sleeper"] = Sleeper(app, opts.sleep_idle_seconds if opts.sleep_idle_seconds > 0 else None,
                             load=load_engine, publish=publish)
    app["ready"] = asyncio.Event()
    app["load_failed"] = asyncio.Event()
    app.router.add_post("/shutdown", shutdown)
    app.router.add_get("/openapi.json", openapi)
    webui.add_routes(app)
    for protocol in PROTOCOLS:
        protocol.add_routes(app)
    webui.add_static_routes(app)
    app["envelopes"] = [(prefix, env) for p in PROTOCOLS for prefix, env in getattr(p, "ENVELOPES", {}).items()]
    app.on_response_prepare.append(allow_origin)
    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    return app
