"""Liveness, as /health (operations) and /v1/health (llama-server's spelling) answer it."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

from inferenceos.server.ops import Latest
from inferenceos.server.state import ServerState

# how long /health waits for a cluster worker's fresh state before it reports the last
# one: a frozen worker's probe runs to its own timeout (0.5 s) on its own thread
WORKER_WAIT_S = 0.05
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
    """address → "up", "in use" or "lost: <why>", each worker asked now (network I/O,
    one probe in flight per worker, server.ops.Latest). A worker that has not answered
    within WORKER_WAIT_S keeps the state it last reported; one never heard from yet is
    waited for (its probe's own timeout bounds that)."""
    from inferenceos.cluster.probe import worker_state
    from inferenceos.endpoint import parse_endpoints

    endpoints = parse_endpoints(list(rpc))

    async def one(address: str, ask: Callable[[], str]) -> str:
        last = _WORKERS.last(address)
        with contextlib.suppress(TimeoutError):
            return await _WORKERS.fresh(address, ask, None if last is None else WORKER_WAIT_S)
        return last or "lost: no answer"

    states = await asyncio.gather(*(one(ep.address, functools.partial(worker_state, ep))
                                    for ep in endpoints))
    return dict(zip((ep.address for ep in endpoints), states, strict=True))
