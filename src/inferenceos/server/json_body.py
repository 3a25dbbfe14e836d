"""Read request bodies as JSON whatever their Content-Type, as Ollama does.

Ollama's own documentation calls it with `curl URL -d '{...}'`, which sends
`application/x-www-form-urlencoded`; Ollama parses the body as JSON anyway, and so do
we. Only for requests without an `Origin` header: a browser always sends one, and a web
page must not be able to slip a JSON body past the CORS preflight as a "simple"
text/plain or form request (a cross-site request forgery against the local API).
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

_JSON = b"application/json"


class JsonBodies:
    """Pure ASGI: rewrite a non-JSON Content-Type to application/json (see module)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] in ("POST", "PUT", "DELETE"):
            headers = dict(scope["headers"])
            ctype = headers.get(b"content-type", b"")
            if b"origin" not in headers and not ctype.startswith(_JSON):
                kept = [(k, v) for k, v in scope["headers"] if k != b"content-type"]
                scope = {**scope, "headers": [*kept, (b"content-type", _JSON)]}
        await self.app(scope, receive, send)
