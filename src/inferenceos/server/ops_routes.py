"""Operations routes: /health, /metrics, Ollama's / and /api/version."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse, Response
from pydantic import BaseModel

from inferenceos.server.kv_stats import reported_kv_usage
from inferenceos.server.ollama_schema import VersionResponse

OLLAMA_API_VERSION = "0.6.0"  # the Ollama API level these routes follow

router = APIRouter(tags=["operations"])


class Health(BaseModel):
    status: str
    models_loaded: int
    # cluster workers (serve --rpc): address → "up", "in use" or "lost: <why>"
    workers: dict[str, str] | None = None


@router.get("/health", response_model=Health)
async def health(request: Request) -> Any:
    """Liveness: always open, even when an API key is set. 'draining' during shutdown."""
    state = request.app.state.ios
    body: dict[str, Any] = {"status": "draining" if state.draining else "ok",
                            "models_loaded": len(state.manager.loaded())}
    rpc = getattr(getattr(state.manager, "base", None), "rpc", ())
    if rpc:
        import asyncio

        from inferenceos.cluster.probe import worker_states

        body["workers"] = await asyncio.to_thread(worker_states, rpc)
    return body


@router.get("/metrics", response_class=PlainTextResponse,
            responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}})
async def metrics(request: Request) -> Response:
    """Prometheus text format 0.0.4 (names after vLLM's, prefix `inferenceos:`;
    server/prometheus.py says why never OpenMetrics)."""
    state = request.app.state.ios
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
    return {"version": OLLAMA_API_VERSION, "inferenceos": request.app.state.ios.settings.version}
