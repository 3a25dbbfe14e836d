"""Errors as each API spells them, and the exception handlers that produce them.

Routes under `/v1/messages` answer Anthropic's shape `{"type": "error", "error":
{"type", "message"}, "request_id"}` (and 529 where the others say 503); other routes
under `/v1/` answer OpenAI's shape `{"error": {"message", "type", "code", "param"}}`;
every other route answers Ollama's `{"error": "message"}`. No traceback ever reaches a
client: an unexpected exception is logged and answered with a generic 500.
"""

from __future__ import annotations

import enum
import logging
import re
import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

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

_OPENAI_TYPES = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
    404: "not_found_error", 405: "invalid_request_error", 413: "invalid_request_error",
    422: "invalid_request_error", 429: "rate_limit_error", 503: "server_error",
}


# Anthropic's error types by status (docs.claude.com/en/api/errors); 529 is its
# "overloaded", which our 503s (draining, no room, worker died) become on its routes
_ANTHROPIC_TYPES = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
    404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
    500: "api_error", 529: "overloaded_error",
}


class Dialect(enum.Enum):
    """The error shape an API answers in (llama-server's routes answer OpenAI's)."""

    OPENAI = "openai"  # {"error": {"message", "type", "code", "param"}}
    ANTHROPIC = "anthropic"  # {"type": "error", "error": {"type", "message"}}, 529 for 503
    OLLAMA = "ollama"  # {"error": "message"}


# What each status means, as the OpenAPI schema documents it for every route: one
# table, rendered per dialect by `error_responses`
_STATUS_TEXT = (
    (400, "Invalid request"), (401, "Missing or wrong API key"), (403, "Host not allowed"),
    (404, "Model not found"), (413, "Body too large"), (429, "Queue full; see Retry-After"),
    (500, "Engine error"), (503, "Shutting down or no room to load the model; see Retry-After"),
)


def error_responses(model: type, dialect: Dialect) -> dict[int | str, dict[str, Any]]:
    """The `responses=` of a router: each error status with `model` (the dialect's
    error body) and its meaning; Anthropic's name its error type, and say 529 for 503."""
    out: dict[int | str, dict[str, Any]] = {}
    for status, text in _STATUS_TEXT:
        if dialect is Dialect.ANTHROPIC:
            status = 529 if status == 503 else status
            text = f"{_ANTHROPIC_TYPES[status]}: {text}"
        out[status] = {"model": model, "description": text}
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


# llama-server's routes (and the OpenAI ones it serves without /v1) answer OpenAI-shaped
# errors, as llama-server does
LLAMACPP_PATHS = frozenset({
    "/completion", "/completions", "/chat/completions", "/chat/completions/input_tokens",
    "/embeddings", "/models", "/tokenize", "/detokenize", "/props", "/slots",
    "/apply-template", "/infill",
})
# the engine's refusal of a prompt longer than a sequence (scheduler.submit)
_TOO_LONG = re.compile(r"the prompt has (\d+) tokens; a sequence holds (\d+)")


def is_openai_path(path: str) -> bool:
    return (path.startswith("/v1/") or path == "/v1" or path in LLAMACPP_PATHS
            or path.startswith("/models/"))


def is_anthropic_path(path: str) -> bool:
    return path == "/v1/messages" or path.startswith("/v1/messages/")


def error_status(path: str, status: int) -> int:
    """The status an error answers with on `path`: Anthropic's 529 for our 503."""
    return 529 if status == 503 and is_anthropic_path(path) else status


def anthropic_error(status: int, message: str) -> dict[str, Any]:
    """Anthropic's error object for `status` (a 4xx it has no name for is
    invalid_request_error, a 5xx api_error, as its reference says)."""
    kind = _ANTHROPIC_TYPES.get(error_status("/v1/messages", status),
                                "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message},
            "request_id": f"req_{uuid.uuid4().hex[:24]}"}


def error_body(path: str, status: int, message: str, code: str | None = None,
               extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The JSON body for an error on `path`, in that API's shape. `extra` fields (and a
    `type` among them) join the OpenAI error object."""
    if is_anthropic_path(path):
        return anthropic_error(status, message)
    if is_openai_path(path):
        kind = _OPENAI_TYPES.get(status, "server_error")
        return {"error": {"message": message, "type": kind, "param": None, "code": code,
                          **(extra or {})}}
    return {"error": message}


def error_response(path: str, status: int, message: str, code: str | None = None,
                   headers: dict[str, str] | None = None,
                   extra: dict[str, Any] | None = None) -> JSONResponse:
    return JSONResponse(error_body(path, status, message, code, extra),
                        error_status(path, status), headers=headers)


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


def install_handlers(app: FastAPI) -> None:
    """Register the handlers that turn every exception into an API-shaped error."""

    @app.exception_handler(APIError)
    async def _api(request: Request, exc: APIError) -> JSONResponse:
        return error_response(request.url.path, exc.status, exc.message, exc.code, exc.headers,
                              exc.extra)

    @app.exception_handler(InferenceOSError)
    async def _ios(request: Request, exc: InferenceOSError) -> JSONResponse:
        e = api_error_from(exc)
        return error_response(request.url.path, e.status, e.message, e.code, e.headers,
                              e.extra)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(request.url.path, 400, _validation_message(exc), "invalid_request")

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = exc.detail if isinstance(exc.detail, str) else "error"
        return error_response(request.url.path, exc.status_code, message, None,
                              dict(exc.headers or {}))

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception) -> JSONResponse:
        e = api_error_from(exc)
        return error_response(request.url.path, e.status, e.message, e.code)
