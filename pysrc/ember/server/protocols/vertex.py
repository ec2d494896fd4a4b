"""Vertex AI's prediction protocol, as llama-server serves it where the
environment says the server runs in Vertex AI (`AIP_MODE=PREDICTION`):
`POST` to `AIP_PREDICT_ROUTE` (default `/predict`) a body of `instances`,
each a request to one of the server's own routes named by its
`@requestFormat` (the route's path, or its camelCase name:
`chatCompletions` for `/v1/chat/completions`, `applyTemplate` for
`/apply-template`); the answer is their replies in order, as
`predictions`, a failed one as its error object. Streaming is not served
there (an instance's `stream` is set false). `AIP_HEALTH_ROUTE` answers as
`/health`, and `AIP_HTTP_PORT` is the port (`ember.server.cli`)."""

from __future__ import annotations

import asyncio
import json
import os
import re
from typing import Mapping

from aiohttp import web

from ember.server.errors import ApiError, error_body, from_engine_error
from ember.server.http import json_response, read_body
from ember.server.keys import scope_needed

__all__ = ["add_routes", "gcp_routes"]

#: Instances one prediction may carry (llama-server's bound).
MAX_INSTANCES = 128


def gcp_routes(environ: Mapping[str, str]) -> tuple[str, str | None] | None:
    """(predict route, health route or None) where the environment asks for
    Vertex AI's protocol, else None."""
    if environ.get("AIP_MODE") != "PREDICTION":
        return None
    return environ.get("AIP_PREDICT_ROUTE") or "/predict", environ.get("AIP_HEALTH_ROUTE") or None


def request_format(path: str) -> str:
    """A route's camelCase name, as llama-server derives it: no /v1 prefix,
    each part after a slash, dash or underscore capitalised, path
    parameters left out (`/v1/chat/completions` -> `chatCompletions`)."""
    s = path[3:] if path.startswith("/v1") and len(path) > 3 else path
    s = s.lstrip("/").split("{", 1)[0]
    words = [w for w in re.split(r"[/_-]", s) if w]
    return "".join([words[0]] + [w[:1].upper() + w[1:] for w in words[1:]]) if words else ""


def _posts(app: web.Application) -> dict[str, str]:
    """Every POST route of plain path by its camelCase name (the first
    registered wins, as llama-server's), and by its path."""
    out: dict[str, str] = {}
    for route in app.router.routes():
        info = route.resource.get_info() if route.resource is not None else {}
        path = info.get("path")
        if route.method == "POST" and path:
            out.setdefault(request_format(path), path)
            out.setdefault(path, path)
    return out


async def predict(request: web.Request) -> web.Response:
    raw = await read_body(request)
    try:
        data = json.loads(raw)
    except ValueError as e:
        raise ApiError(400, f"the body is not JSON: {e}") from None
    if not isinstance(data, dict):
        raise ApiError(400, "the body must be a JSON object")
    instances = data.get("instances")
    if not isinstance(instances, list):
        raise ApiError(400, "instances: required, an array of requests", param="instances")
    if len(instances) > MAX_INSTANCES:
        raise ApiError(400, f"instances: at most {MAX_INSTANCES} a prediction, got {len(instances)}",
                       param="instances")
    routes = _posts(request.app)
    own = {"/predict", request.path}
    # Side by side, as separate requests would be: each takes a slot, the rest wait.
    predictions = await asyncio.gather(*(_one(request, routes, own, i, x) for i, x in enumerate(instances)))
    return json_response({"predictions": list(predictions)})


async def _one(request: web.Request, routes: dict[str, str], own: set[str], i: int, instance) -> object:
    """One instance's reply, or its error object."""
    where = f"instances[{i}]"
    try:
        if not isinstance(instance, dict):
            raise ApiError(400, f"{where}: each instance must be a JSON object", param=where)
        fmt = instance.get("@requestFormat")
        if not isinstance(fmt, str):
            raise ApiError(400, f"{where}.@requestFormat: required, the route's name or path", param=where)
        path = routes.get(fmt)
        if path is None or path in own:
            raise ApiError(400, f"{where}.@requestFormat: no route {fmt!r} to answer it", param=where)
        if scope_needed("POST", path) not in request.get("scopes", (scope_needed("POST", path),)):
            raise ApiError(403, f"{where}: {path} needs the {scope_needed('POST', path)} scope", param=where,
                           type="permission_error")
        payload = {k: v for k, v in instance.items() if k != "@requestFormat"}
        if "stream" in payload:
            payload["stream"] = False  # a prediction is answered whole
        app = request.app
        sub = request.clone(method="POST", rel_url=path)
        # Routed as aiohttp routes a request: the clone is the instance's route's, not /predict's.
        match = await app.router.resolve(sub)
        match.add_app(app)
        match.freeze()
        sub._match_info = match  # noqa: SLF001
        sub["body"] = json.dumps(payload).encode()
        for key in ("owner", "scopes"):
            if key in request:
                sub[key] = request[key]
        resp = await match.handler(sub)
    except ApiError as e:
        return error_body(e)
    except Exception as e:  # noqa: BLE001 - one instance's failure is its prediction, as the middleware words it
        return error_body(from_engine_error(e))
    body = getattr(resp, "body", None)
    if not body:
        return None
    try:
        return json.loads(body)
    except ValueError:
        return body.decode("utf-8", "replace")


def add_routes(app: web.Application, environ: Mapping[str, str] | None = None) -> None:
    routes = gcp_routes(os.environ if environ is None else environ)
    if routes is None:
        return
    predict_route, health_route = routes
    taken = {route.resource.get_info().get("path") for route in app.router.routes() if route.resource is not None}
    if predict_route in taken:
        raise ValueError(f"AIP_PREDICT_ROUTE={predict_route} is one of the server's own routes")
    app.router.add_post(predict_route, predict)
    if health_route:
        from ember.server.protocols.llama_server import health

        app.router.add_get(health_route, health)
