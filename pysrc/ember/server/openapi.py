"""The server's OpenAPI document, served at /openapi.json: every route the
app mounts, its request body's schema read from the wire type its handler
decodes (`ember.server.http.reads`), and its errors in its API's envelope.
Built from the app itself, so a route cannot be left out of it."""

from __future__ import annotations

import re
from typing import Any

import msgspec
from aiohttp import web

__all__ = ["document", "openapi"]

_ERROR = {
    "type": "object", "required": ["error"],
    "properties": {"error": {"type": "object", "required": ["code", "message", "type"], "properties": {
        "code": {"type": "integer"}, "message": {"type": "string"}, "type": {"type": "string"},
        "param": {"type": ["string", "null"]}}}},
}
_ANTHROPIC_ERROR = {
    "type": "object", "required": ["type", "error"],
    "properties": {"type": {"const": "error"}, "error": {"type": "object", "required": ["type", "message"],
                                                         "properties": {"type": {"type": "string"},
                                                                        "message": {"type": "string"}}}},
}
_OLLAMA_ERROR = {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}}


def _error_schema(path: str) -> str:
    if path == "/v1/messages" or path.startswith("/v1/messages/"):
        return "AnthropicError"
    return "OllamaError" if path.startswith("/api/") else "Error"


def document(app: web.Application) -> dict:
    from ember import __version__

    routes: list[tuple[str, str, Any]] = []
    for r in app.router.routes():
        info = r.resource.get_info() if r.resource is not None else {}
        path = info.get("path") or info.get("formatter")
        if path is None or r.method in ("HEAD", "OPTIONS"):
            continue
        methods = ("get", "post", "delete") if r.method == "*" else (r.method.lower(),)
        for m in methods:
            routes.append((m, path, getattr(r.handler, "request_type", None)))
    types = sorted({t for _, _, t in routes if t is not None}, key=lambda t: t.__name__)
    refs, components = msgspec.json.schema_components(types, ref_template="#/components/schemas/{name}")
    ref_of = dict(zip(types, refs))
    components.update(Error=_ERROR, AnthropicError=_ANTHROPIC_ERROR, OllamaError=_OLLAMA_ERROR)
    paths: dict[str, dict] = {}
    for method, path, body in routes:
        op: dict = {
            "operationId": re.sub(r"[^A-Za-z0-9]+", "_", f"{method}{path}").strip("_"),
            "responses": {
                "200": {"description": "the reply", "content": {
                    "application/json": {"schema": {}}, "text/event-stream": {"schema": {"type": "string"}},
                    "application/x-ndjson": {"schema": {"type": "string"}}, "text/plain": {"schema": {"type": "string"}}}},
                "default": {"description": "an error, in the API's envelope",
                            "content": {"application/json": {"schema": {
                                "$ref": f"#/components/schemas/{_error_schema(path)}"}}}},
            },
        }
        if path == "/" or path.startswith("/webui/"):  # the chat page and its files
            op["responses"]["200"]["content"].update({kind: {"schema": {"type": "string"}} for kind in (
                "text/html", "text/javascript", "text/css")})
        params = re.findall(r"{(\w+)}", path)
        if params:
            op["parameters"] = [{"name": p, "in": "path", "required": True, "schema": {"type": "string"}}
                                for p in params]
        if body is not None:
            op["requestBody"] = {"required": True, "content": {"application/json": {"schema": ref_of[body]}}}
        paths.setdefault(path, {})[method] = op
    doc = {"openapi": "3.1.0", "info": {"title": "ember", "version": __version__},
           "paths": paths, "components": {"schemas": components}}
    if prefix := app["state"].opts.api_prefix:
        doc["servers"] = [{"url": prefix}]  # every path above sits under --api-prefix's
    return doc


async def openapi(request: web.Request) -> web.Response:
    return web.Response(body=msgspec.json.encode(document(request.app)), content_type="application/json")
