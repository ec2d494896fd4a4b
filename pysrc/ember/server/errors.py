"""The one exception type the handlers raise (`ApiError`: a status, a
message, the field at fault), the engine's errors mapped onto it, and
llama-server's body for it, `{"error": {"code", "message", "type"}}` with
OpenAI's `param`, which every API answers in unless it has an envelope of
its own (`ember.server.http.Envelope`)."""

from __future__ import annotations

from ember.errors import ContextFullError, EmberError, InvalidRequestError

__all__ = ["ApiError", "error_body", "from_engine_error", "exceed_context"]

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    500: "server_error",
    501: "not_supported_error",
    503: "unavailable_error",
}


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str | None = None,
        param: str | None = None,
        extra: dict | None = None,
        headers: dict | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type or _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
        self.param = param
        self.extra = extra or {}
        self.headers = headers or {}


def error_body(err: ApiError) -> dict:
    e: dict = {"code": err.status, "message": err.message, "type": err.type}
    if err.param is not None:
        e["param"] = err.param
    e.update(err.extra)
    return {"error": e}


def exceed_context(n_prompt: int, n_ctx: int) -> ApiError:
    # llama-server's wording and fields, so clients written against it can react (trim, retry).
    return ApiError(
        400,
        f"the request exceeds the available context size ({n_prompt} prompt tokens, context {n_ctx}), try increasing it",
        type="exceed_context_size_error",
        extra={"n_prompt_tokens": n_prompt, "n_ctx": n_ctx},
    )


def from_engine_error(e: BaseException, *, n_prompt: int = 0, n_ctx: int = 0) -> ApiError:
    # Imported here: the engine module pulls in the model, which the error module must not need.
    from ember.engine import EngineOverloaded, EngineStopped
    from ember.structured import GrammarError

    if isinstance(e, ApiError):
        return e
    if isinstance(e, ContextFullError):
        return exceed_context(n_prompt, n_ctx) if n_prompt else ApiError(400, str(e), type="exceed_context_size_error")
    if isinstance(e, InvalidRequestError):
        msg = str(e)
        if isinstance(e, GrammarError) and not msg.startswith(("grammar:", "json_schema:", "response_format:")):
            # Met while generating: the grammar the request's grammar, schema or tools compiled to.
            msg = f"grammar: {msg}"
        param = msg.split(":", 1)[0] if ":" in msg and " " not in msg.split(":", 1)[0] else None
        return ApiError(400, msg, param=param)
    if isinstance(e, EngineOverloaded):
        return ApiError(503, f"server busy: {e}", headers={"Retry-After": "1"})
    if isinstance(e, EngineStopped):
        return ApiError(503, str(e) or "the server is shutting down")
    if isinstance(e, EmberError):
        return ApiError(500, str(e) or type(e).__name__)
    return ApiError(500, f"internal error: {type(e).__name__}: {e}")
