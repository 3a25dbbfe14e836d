"""Errors as each API spells them, and the exception handlers that produce them.

Each router declares the dialect its routes speak (`route_class(Dialect.X)`), and an
error answers in the dialect of the route that served the request: Anthropic's
`{"type": "error", "error": {"type", "message"}, "request_id"}` (and 529 where the
others say 503), OpenAI's `{"error": {"message", "type", "code", "param"}}` (also
llama-server's routes, as llama-server answers), or Ollama's `{"error": "message"}`
(Ollama's routes and the operations ones). A refusal before routing (the middleware's
401 / 403 / 413) speaks the dialect of the route that would have served it; a path no
route serves, that of the API whose URL space holds it. No traceback ever reaches a
client: an unexpected exception is logged and answered with a generic 500.
"""

from __future__ import annotations

import enum
import functools
import logging
import re
import uuid
from collections.abc import Iterable
from typing import Any, ClassVar

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import BaseRoute, Match
from starlette.types import Scope

from inferenceos.errors import (
    EngineBusyError,
    GenerationError,
    GGUFFormatError,
    InferenceOSError,
    ModelLoadError,
    ModelNotFoundError,
    StorageError,
    WorkerDiedError,
)
from inferenceos.registry.manager import ModelBusyError

log = logging.getLogger("inferenceos.server")


class Dialect(enum.Enum):
    """The error shape an API answers in (llama-server's routes answer OpenAI's)."""

    OPENAI = "openai"  # {"error": {"message", "type", "code", "param"}}
    ANTHROPIC = "anthropic"  # {"type": "error", "error": {"type", "message"}}, 529 for 503
    OLLAMA = "ollama"  # {"error": "message"}


# The one error table: per status, what it means (documented on every route; None: not
# documented) and its error type in OpenAI's and in Anthropic's words
# (docs.claude.com/en/api/errors; 529 is its "overloaded", which our 503s — draining,
# no room, worker died — become on its routes). A status not here is OpenAI's
# server_error, Anthropic's api_error (5xx) or invalid_request_error (4xx).
_STATUSES: dict[int, tuple[str | None, str, str]] = {
    400: ("Invalid request", "invalid_request_error", "invalid_request_error"),
    401: ("Missing or wrong API key", "authentication_error", "authentication_error"),
    403: ("Host not allowed", "permission_error", "permission_error"),
    404: ("Model not found", "not_found_error", "not_found_error"),
    405: (None, "invalid_request_error", "invalid_request_error"),
    413: ("Body too large", "invalid_request_error", "request_too_large"),
    422: (None, "invalid_request_error", "invalid_request_error"),
    429: ("Queue full; see Retry-After", "rate_limit_error", "rate_limit_error"),
    500: ("Engine error", "server_error", "api_error"),
    503: ("Shutting down or no room to load the model; see Retry-After", "server_error",
          "overloaded_error"),
}


def error_status(dialect: Dialect, status: int) -> int:
    """The status an error answers with in `dialect`: Anthropic's 529 for our 503."""
    return 529 if status == 503 and dialect is Dialect.ANTHROPIC else status


def _error_type(dialect: Dialect, status: int) -> str:
    row = _STATUSES.get(503 if status == 529 else status)
    if dialect is Dialect.ANTHROPIC:
        return row[2] if row else "api_error" if status >= 500 else "invalid_request_error"
    return row[1] if row else "server_error"


def error_responses(model: type, dialect: Dialect) -> dict[int | str, dict[str, Any]]:
    """The `responses=` of a router: each documented error status with `model` (the
    dialect's error body) and its meaning; Anthropic's name its error type, and say
    529 for 503."""
    out: dict[int | str, dict[str, Any]] = {}
    for status, (text, _, _) in _STATUSES.items():
        if text is None:
            continue
        if dialect is Dialect.ANTHROPIC:
            text = f"{_error_type(dialect, status)}: {text}"
        out[error_status(dialect, status)] = {"model": model, "description": text}
    return out


class APIError(Exception):
    """An error with an HTTP status, a one-line message and optional headers."""

    def __init__(self, status: int, message: str, code: str | None = None,
                 headers: dict[str, str] | None = None,
                 extra: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.headers = headers or {}
        self.extra = extra or {}  # more fields for the OpenAI-shaped error object


# -- which dialect --------------------------------------------------------------------


class DialectRoute(APIRoute):
    """An APIRoute that knows the dialect of its errors (set by its router)."""

    dialect: ClassVar[Dialect] = Dialect.OLLAMA


@functools.cache
def route_class(dialect: Dialect) -> type[DialectRoute]:
    """The route class a router of `dialect` declares: `APIRouter(route_class=...)`."""
    return type(f"{dialect.name.title()}Route", (DialectRoute,), {"dialect": dialect})


def _routed(scope: Scope) -> BaseRoute | None:
    """The route serving `scope`: the router's match once routed; before routing (a
    middleware's refusal), the route among the app's that would serve it (a path match
    whose method differs counts, as the router answers it with a 405)."""
    route = scope.get("route")
    if route is not None:
        return route
    partial = None
    for candidate in getattr(getattr(scope.get("app"), "state", None), "error_routes", ()):
        match, _ = candidate.matches(scope)
        if match is Match.FULL:
            return candidate
        if match is Match.PARTIAL and partial is None:
            partial = candidate
    return partial


def _unrouted(path: str) -> Dialect:
    """The dialect for a path no route serves: that of the API whose URL space holds
    it, as each answers unknown paths under its prefix."""
    if path == "/v1/messages" or path.startswith("/v1/messages/"):
        return Dialect.ANTHROPIC
    if path == "/v1" or path.startswith("/v1/"):
        return Dialect.OPENAI
    return Dialect.OLLAMA


def dialect_of(scope: Scope) -> Dialect:
    """The dialect a request's errors answer in (see the module contract)."""
    route = _routed(scope)
    if isinstance(route, DialectRoute):
        return route.dialect
    return _unrouted(str(scope.get("path", "")))


# -- error bodies ---------------------------------------------------------------------

# the engine's refusal of a prompt longer than a sequence (scheduler.submit)
_TOO_LONG = re.compile(r"the prompt has (\d+) tokens; a sequence holds (\d+)")


def anthropic_request_id() -> str:
    """An id for Anthropic's `request-id` header and error bodies (`req_` + 24 hex)."""
    return f"req_{uuid.uuid4().hex[:24]}"


def error_headers(body: dict[str, Any]) -> dict[str, str]:
    """Headers an error `body` brings: Anthropic's carry its id in `request-id` too, as
    Anthropic's own do (the SDK's errors read their `request_id` there)."""
    return {"request-id": str(body["request_id"])} if "request_id" in body else {}


def error_body(dialect: Dialect, status: int, message: str, code: str | None = None,
               extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The JSON body of an error in `dialect`'s shape. `extra` fields (and a `type`
    among them) join the OpenAI error object."""
    if dialect is Dialect.ANTHROPIC:
        return {"type": "error",
                "error": {"type": _error_type(dialect, status), "message": message},
                "request_id": anthropic_request_id()}
    if dialect is Dialect.OPENAI:
        return {"error": {"message": message, "type": _error_type(dialect, status),
                          "param": None, "code": code, **(extra or {})}}
    return {"error": message}


def error_response(dialect: Dialect, status: int, message: str, code: str | None = None,
                   headers: dict[str, str] | None = None,
                   extra: dict[str, Any] | None = None) -> JSONResponse:
    """The error as a response, with the headers its body brings (error_headers)."""
    body = error_body(dialect, status, message, code, extra)
    return JSONResponse(body, error_status(dialect, status),
                        headers={**(headers or {}), **error_headers(body)})


def api_error_from(exc: BaseException, retry_after_s: int = 2) -> APIError:
    """Map a user-facing InferenceOSError (or APIError) to a status and message."""
    if isinstance(exc, APIError):
        return exc
    msg = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, ModelNotFoundError):
        return APIError(404, msg, "model_not_found")
    if isinstance(exc, EngineBusyError):
        return APIError(429, msg, "queue_full", {"Retry-After": str(retry_after_s)})
    if isinstance(exc, WorkerDiedError):
        return APIError(503, msg, "worker_died", {"Retry-After": str(retry_after_s)})
    if isinstance(exc, StorageError):
        return APIError(503, msg, "storage_error", {"Retry-After": str(retry_after_s)})
    if isinstance(exc, ModelBusyError):
        return APIError(503, msg, "model_busy", {"Retry-After": str(retry_after_s)})
    if isinstance(exc, (ModelLoadError, GenerationError, GGUFFormatError)):
        return APIError(500, msg, "engine_error")
    if isinstance(exc, InferenceOSError):
        too_long = _TOO_LONG.search(msg)
        if too_long:  # llama-server's error type and figures, which its clients read
            return APIError(400, msg, "context_length_exceeded", extra={
                "type": "exceed_context_size_error",
                "n_prompt_tokens": int(too_long[1]), "n_ctx": int(too_long[2])})
        return APIError(400, msg, "invalid_request")
    log.error("internal error", exc_info=exc)
    return APIError(500, "internal server error", "internal_error")


def _validation_message(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors()[:3]:
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
        parts.append(f"{loc or 'body'}: {err.get('msg', 'invalid')}")
    return "invalid request: " + "; ".join(parts)


def install_handlers(app: FastAPI, routers: Iterable[APIRouter]) -> None:
    """Register the handlers that turn every exception into an API-shaped error.
    `routers`: those the app includes, whose routes tell a refusal before routing
    which dialect it speaks."""
    app.state.error_routes = [route for router in routers for route in router.routes]

    @app.exception_handler(APIError)
    async def _api(request: Request, exc: APIError) -> JSONResponse:
        return error_response(dialect_of(request.scope), exc.status, exc.message, exc.code,
                              exc.headers, exc.extra)

    @app.exception_handler(InferenceOSError)
    async def _ios(request: Request, exc: InferenceOSError) -> JSONResponse:
        e = api_error_from(exc)
        return error_response(dialect_of(request.scope), e.status, e.message, e.code,
                              e.headers, e.extra)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(dialect_of(request.scope), 400, _validation_message(exc),
                              "invalid_request")

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = exc.detail if isinstance(exc.detail, str) else "error"
        return error_response(dialect_of(request.scope), exc.status_code, message, None,
                              dict(exc.headers or {}))

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception) -> JSONResponse:
        e = api_error_from(exc)
        return error_response(dialect_of(request.scope), e.status, e.message, e.code)
