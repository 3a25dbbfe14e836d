"""Liveness, as /health (operations) and /v1/health (llama-server's spelling) answer it."""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import BaseModel

from inferenceos.server.state import ServerState


class Health(BaseModel):
    status: str
    models_loaded: int
    # cluster workers (serve --rpc): address → "up", "in use" or "lost: <why>"
    workers: dict[str, str] | None = None


async def health_body(state: ServerState) -> dict[str, Any]:
    """'ok' ('draining' during shutdown), the models loaded, and the cluster workers'
    states when the server has any (probed in a thread: it is network I/O)."""
    body: dict[str, Any] = {"status": "draining" if state.draining else "ok",
                            "models_loaded": len(state.manager.loaded())}
    rpc = getattr(getattr(state.manager, "base", None), "rpc", ())
    if rpc:
        from inferenceos.cluster.probe import worker_states

        body["workers"] = await asyncio.to_thread(worker_states, rpc)
    return body
