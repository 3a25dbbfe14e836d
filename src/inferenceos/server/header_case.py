"""Send CORS response header names in their usual capitalisation.

Header names are case-insensitive, and uvicorn sends what the app gives it; Starlette's
CORS middleware gives lower case. Some clients look headers up case-sensitively in a
plain dict (llama.cpp's own server tests do, for `Access-Control-Allow-Origin`), so the
`access-control-*` names go out as llama-server sends them. Pure ASGI: streaming bodies
pass untouched.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

_PREFIX = b"access-control-"


def _canonical(name: bytes) -> bytes:
    return b"-".join(part[:1].upper() + part[1:] for part in name.split(b"-"))


class CorsHeaderCase:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_canonical(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [
                    (_canonical(k) if k.lower().startswith(_PREFIX) else k, v)
                    for k, v in message.get("headers", ())]
            await send(message)

        await self.app(scope, receive, send_canonical)
