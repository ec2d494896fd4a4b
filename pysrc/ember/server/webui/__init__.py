"""The chat page at `/`, served from the package itself: no build step and
no CDN (its two libraries, marked and DOMPurify, are vendored with their
licences). It talks to `/v1/chat/completions` as any client does.

`GET /` answers by what the request accepts. One that takes HTML (a
browser's text/html, or curl's and most libraries' */*) gets the page, as
from llama-server; one that asks for JSON or text only, or names nothing (as
Ollama's clients probe the root), gets Ollama's "is running" line.
`--no-webui` answers the first kind 404, as llama-server does, and the
second kind still gets the line; `--path DIR` serves the user's own files
instead of the page, as llama-server's does.

The page and its files are public (the page is where a user enters the API
key), and so are a --path folder's files that exist; any other path is the
key's first.
"""

from __future__ import annotations

import mimetypes
import os
from pathlib import Path

from aiohttp import web

__all__ = ["add_routes", "is_page_request"]

HERE = Path(__file__).parent
#: The page's files by their path under /webui/; nothing else is served from here.
ASSETS = {name: HERE / name for name in ("app.js", "style.css", "vendor/marked.min.js", "vendor/purify.js",
                                         "vendor/marked.LICENSE", "vendor/purify.LICENSE",
                                         "vendor/purify.Apache-2.0.txt")}
#: The page runs only its own scripts and talks only to this server.
_POLICY = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
           "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
_TYPES = {".js": "text/javascript", ".css": "text/css", ".html": "text/html", ".LICENSE": "text/plain",
          ".txt": "text/plain"}


def _wants_html(request: web.Request) -> bool:
    accept = request.headers.get("Accept", "")
    return "text/html" in accept or "*/*" in accept


def _own_file(root: str, path: str) -> Path | None:
    """The regular file `path` names inside `root`, or None. A name that
    leaves the folder (`..`, a link pointing out) is not served."""
    rel = path.lstrip("/") or "index.html"
    if "\0" in rel or any(part == "" or part.startswith(".") for part in rel.split("/")):
        return None  # no folders' listings, no dot names (.., .git, .env)
    base = os.path.realpath(root)
    full = os.path.realpath(os.path.join(base, rel))
    if os.path.commonpath([base, full]) != base or not os.path.isfile(full):
        return None
    return Path(full)


def is_page_request(request: web.Request) -> bool:
    """Whether the request is for the page or a file served beside it
    (answered without a key, and before the model is ready)."""
    if request.method not in ("GET", "HEAD"):
        return False
    opts = request.app["state"].opts
    path = request.path
    if opts.static_path is not None:
        return _own_file(opts.static_path, path) is not None
    if not opts.webui:
        return False
    return (path == "/" and _wants_html(request)) or path.removeprefix("/webui/") in ASSETS


def _file_response(path: Path, *, page: bool = False, api_prefix: str = "") -> web.Response:
    kind = _TYPES.get(path.suffix) or mimetypes.guess_type(path.name)[0] or "application/octet-stream"
    headers = {"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"}
    body = path.read_bytes()
    if page:
        headers["Content-Security-Policy"] = _POLICY
        headers["Referrer-Policy"] = "no-referrer"
        # The page's links and its script's requests go under --api-prefix's path.
        body = body.replace(b"{{api_prefix}}", api_prefix.encode())
    return web.Response(body=body, content_type=kind,
                        charset="utf-8" if kind.startswith("text/") else None, headers=headers)


async def root(request: web.Request) -> web.Response:
    opts = request.app["state"].opts
    if opts.static_path is not None:
        found = _own_file(opts.static_path, "/")
        if found is not None:
            return _file_response(found)
    elif _wants_html(request):
        if not opts.webui:
            raise web.HTTPNotFound(text="no page here (--no-webui)")
        return _file_response(HERE / "index.html", page=True, api_prefix=opts.api_prefix)
    # Ollama's clients probe the root for this line.
    return web.Response(text="Ollama is running (ember)", content_type="text/plain")


async def asset(request: web.Request) -> web.Response:
    path = ASSETS.get(request.match_info["name"])
    if path is None:
        raise web.HTTPNotFound()
    return _file_response(path)


async def static_file(request: web.Request) -> web.Response:
    found = _own_file(request.app["state"].opts.static_path, request.path)
    if found is None:
        raise web.HTTPNotFound()
    return _file_response(found)


def add_routes(app: web.Application) -> None:
    app.router.add_get("/", root)
    opts = app["state"].opts
    if opts.webui and opts.static_path is None:
        app.router.add_get("/webui/{name:.+}", asset)


def add_static_routes(app: web.Application) -> None:
    """--path's files at any other path: registered after every API's
    routes, so it never hides one."""
    if app["state"].opts.static_path is not None:
        app.router.add_get("/{path:.+}", static_file)
