"""Liveness, as /health (operations) and /v1/health (llama-server's spelling) answer it."""

from __future__ import annotations

import asyncio
import functools
from typing import Any

from pydantic import BaseModel

from inferenceos.server.ops.reads import Latest
from inferenceos.server.state import ServerState

_WORKERS: Latest[str, str] = Latest("worker-state")  # by address


class Health(BaseModel):
    status: str
    models_loaded: int
    # cluster workers (serve --rpc): address → "up", "in use" or "lost: <why>"
    workers: dict[str, str] | None = None


async def health_body(state: ServerState) -> dict[str, Any]:
    """'ok' ('draining' during shutdown), the models loaded, and the cluster workers'
    states when the server has any."""
    body: dict[str, Any] = {"status": "draining" if state.draining else "ok",
                            "models_loaded": len(state.manager.loaded())}
    rpc = getattr(getattr(state.manager, "base", None), "rpc", ())
    if rpc:
        body["workers"] = await worker_states(rpc)
    return body


async def worker_states(rpc: tuple[str, ...]) -> dict[str, str]:
    """address → "up", "in use" or "lost: <why>", each worker asked now: network I/O on
    a thread of its own per worker (server.ops.Latest: never the default executor, and
    /health calls that arrive while a worker's probe runs wait for that one rather than
    start another). A frozen worker answers "lost" when its probe times out (0.5 s); a
    killed one at once (its port refuses)."""
    from inferenceos.cluster.probe import worker_state
    from inferenceos.endpoint import parse_endpoints

    endpoints = parse_endpoints(list(rpc))
    states = await asyncio.gather(*(_WORKERS.fresh(ep.address,
                                                   functools.partial(worker_state, ep), None)
                                    for ep in endpoints))
    return dict(zip((ep.address for ep in endpoints), states, strict=True))
