"""Pure-ASGI middleware for the safety rules (pure ASGI so streaming is untouched).

- `HostCheck`: while bound to loopback, a request whose `Host` header is not a loopback
  name or an allowed host gets 403 (a DNS-rebinding page in a browser sends its own
  domain as Host).
- `ApiKeyAuth`: when a key is set, every route but /health and /v1/health needs
  `Authorization: Bearer KEY` or `X-Api-Key: KEY`, compared in constant time; else 401.
  CORS preflights pass (the CORS middleware outside answers them).
- `BodyLimit`: bodies over the limit get 413, whether announced by Content-Length or
  sent chunked (buffered up to the limit, then replayed to the app).
- `Cors`: Starlette's CORS middleware, except that a preflight from an origin not
  allowed is answered as llama-server answers it: 200 with no `Access-Control-Allow-*`
  header (the browser refuses the request all the same), not 400.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Iterable
from typing import Any

from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import PlainTextResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from inferenceos.server.errors import dialect_of, error_body, error_headers
from inferenceos.server.settings import is_loopback

# open without a key: health, and the dashboard's static files (no data: the page asks
# for the key and sends it with every data request)
OPEN_PATHS = frozenset({"/health", "/v1/health", "/ui", "/ui/", "/ui/app.js", "/ui/style.css"})


async def send_error(scope: Scope, send: Send, status: int, message: str,
                     code: str | None = None, headers: Iterable[tuple[str, str]] = ()) -> None:
    """Answer with an API-shaped JSON error without calling the app (in the dialect of
    the route that would have served the request)."""
    shaped = error_body(dialect_of(scope), status, message, code)
    body = json.dumps(shaped).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.lower().encode("latin-1"), v.encode("latin-1"))
            for k, v in [*error_headers(shaped).items(), *headers]]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


def _header(scope: Scope, name: bytes) -> str | None:
    for k, v in scope.get("headers", ()):
        if k == name:
            return str(v.decode("latin-1"))
    return None


def host_name(host_header: str) -> str:
    """`example.com:8080` → `example.com`; `[::1]:80` → `::1`."""
    h = host_header.strip()
    if h.startswith("["):
        return h[1:h.find("]")] if "]" in h else h
    return h.rsplit(":", 1)[0] if h.count(":") == 1 else h


class HostCheck:
    def __init__(self, app: ASGIApp, allowed: Iterable[str] = ()) -> None:
        self.app = app
        self.allowed = {a.lower() for a in allowed}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            raw = _header(scope, b"host")
            name = host_name(raw).lower().rstrip(".") if raw else ""
            if raw is not None and not (is_loopback(name) or name in self.allowed):
                await send_error(scope, send, 403,
                                 f"host '{name[:100]}' is not allowed (the server is bound to "
                                 "loopback; see serve --allow-host)", "host_not_allowed")
                return
        await self.app(scope, receive, send)


class ApiKeyAuth:
    def __init__(self, app: ASGIApp, key: str) -> None:
        self.app = app
        self.key = key.encode()

    def _presented(self, scope: Scope) -> bytes | None:
        auth = _header(scope, b"authorization")
        if auth and auth[:7].lower() == "bearer ":
            return auth[7:].strip().encode("latin-1")
        key = _header(scope, b"x-api-key")
        return key.strip().encode("latin-1") if key else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in OPEN_PATHS and not (
            scope["method"] == "OPTIONS" and _header(scope, b"access-control-request-method")
        ):
            presented = self._presented(scope)
            if presented is None or not hmac.compare_digest(presented, self.key):
                await send_error(scope, send, 401,
                                 "missing or invalid API key (send Authorization: Bearer KEY "
                                 "or X-Api-Key: KEY)", "invalid_api_key",
                                 [("WWW-Authenticate", "Bearer")])
                return
        await self.app(scope, receive, send)


class BodyLimit:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = _header(scope, b"content-length")
        if length is not None:
            if not length.isdigit() or int(length) > self.max_bytes:
                await self._too_large(scope, send)
                return
            await self.app(scope, receive, send)
            return
        # no Content-Length (chunked): read up to the limit before the app sees anything
        chunks, size, more = [], 0, True
        while more:
            msg = await receive()
            if msg["type"] != "http.request":
                await self.app(scope, _replay([msg], receive), send)
                return
            chunks.append(msg.get("body", b""))
            size += len(chunks[-1])
            more = bool(msg.get("more_body"))
            if size > self.max_bytes:
                await self._too_large(scope, send)
                return
        body = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        await self.app(scope, _replay([body], receive), send)

    async def _too_large(self, scope: Scope, send: Send) -> None:
        await send_error(scope, send, 413, f"request body larger than {self.max_bytes} bytes",
                         "body_too_large")


def _replay(messages: list[Message], receive: Receive) -> Receive:
    pending = list(messages)

    async def replay() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()  # later messages (http.disconnect) come from the client

    return replay


def local_origin_regex() -> str:
    """Browser origins on this machine: http(s)://localhost|127.x.x.x|[::1][:port]."""
    return r"https?://(localhost|127\.\d{1,3}\.\d{1,3}\.\d{1,3}|\[::1\])(:\d{1,5})?"


def cors_options(origins: Iterable[str], allow_local: bool) -> dict[str, Any]:
    """Arguments for Starlette's CORSMiddleware."""
    return {"allow_origins": list(origins),
            "allow_origin_regex": local_origin_regex() if allow_local else None,
            "allow_methods": ["GET", "POST", "DELETE", "OPTIONS", "HEAD"],
            "allow_headers": ["*"], "max_age": 600}


class Cors(CORSMiddleware):
    """See the module contract: only the answer to a refused origin's preflight differs."""

    def preflight_response(self, request_headers: Headers) -> Response:
        if self.is_allowed_origin(origin=request_headers["origin"]):
            return super().preflight_response(request_headers)
        # nothing that grants anything: no Allow-Origin, Allow-Methods or Allow-Headers
        return PlainTextResponse("OK", status_code=200, headers={"Vary": "Origin"})
