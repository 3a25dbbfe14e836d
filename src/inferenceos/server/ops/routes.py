"""Operations routes: /health, /metrics, Ollama's / and /api/version."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse, Response

from inferenceos.server.dialects.ollama.schema import VersionResponse
from inferenceos.server.errors import Dialect, route_class
from inferenceos.server.ops.health import Health, health_body
from inferenceos.server.ops.kv_stats import reported_kv_usage
from inferenceos.server.state import state_of

OLLAMA_API_VERSION = "0.6.0"  # the Ollama API level these routes follow

router = APIRouter(tags=["operations"], route_class=route_class(Dialect.OLLAMA))


@router.get("/health", response_model=Health)
async def health(request: Request) -> Any:
    """Liveness: always open, even when an API key is set. 'draining' during shutdown."""
    return await health_body(state_of(request))


@router.get("/metrics", response_class=PlainTextResponse,
            responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}})
async def metrics(request: Request) -> Response:
    """Prometheus text format 0.0.4 (names after vLLM's, prefix `inferenceos:`;
    server/ops/prometheus.py says why never OpenMetrics)."""
    state = state_of(request)
    state.kv_reported = await reported_kv_usage(state.manager)
    body, content_type = state.metrics.render()
    return Response(body, media_type=content_type)


_TEXT: dict[int | str, dict[str, Any]] = {
    200: {"content": {"text/plain": {"schema": {"type": "string"}}}}}


@router.get("/", response_class=PlainTextResponse, responses=_TEXT)
async def root() -> PlainTextResponse:
    """What Ollama answers, so tools that probe for Ollama find it."""
    return PlainTextResponse("Ollama is running")


@router.head("/", response_class=PlainTextResponse, responses=_TEXT)
async def root_head() -> PlainTextResponse:
    """Ollama's liveness probe."""
    return PlainTextResponse("Ollama is running")


@router.get("/api/version", response_model=VersionResponse)
async def version(request: Request) -> Any:
    """The Ollama API level emulated (and InferenceOS's own version)."""
    return {"version": OLLAMA_API_VERSION, "inferenceos": state_of(request).settings.version}
