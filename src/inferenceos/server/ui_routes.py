"""The web dashboard at /ui: three static files, served by the API itself.

The page reads the same routes any client does (/api/ps, /api/budget, /api/events,
/metrics) and streams chat from /v1/chat/completions. Its files are ours, hand-written
(no third-party code to vendor, no CDN): the dashboard works offline. The app's
middleware applies to these routes as to every other (API key, Host check, CORS).
"""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter
from fastapi.responses import Response

from inferenceos.server.errors import Dialect, route_class

router = APIRouter(tags=["dashboard"], include_in_schema=False,
                   route_class=route_class(Dialect.OLLAMA))

_FILES = {"index.html": "text/html; charset=utf-8", "app.js": "text/javascript; charset=utf-8",
          "style.css": "text/css; charset=utf-8"}


def _asset(name: str) -> Response:
    data = resources.files("inferenceos.server").joinpath("ui").joinpath(name).read_bytes()
    return Response(data, media_type=_FILES[name],
                    headers={"Cache-Control": "no-cache",
                             "Content-Security-Policy": "default-src 'self'"})


@router.get("/ui")
@router.get("/ui/")
async def index() -> Response:
    """The dashboard page."""
    return _asset("index.html")


@router.get("/ui/app.js")
async def script() -> Response:
    return _asset("app.js")


@router.get("/ui/style.css")
async def style() -> Response:
    return _asset("style.css")
