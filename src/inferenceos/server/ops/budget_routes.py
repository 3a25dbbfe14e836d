"""Memory budgets that change at run time, the pressure reactor, and recent events.

    GET  /api/budget   → {"devices": [{"name", "cap_bytes", "free_bytes", "used_bytes",
                          "total_bytes", "signal"}], "pressure": {...}}
    POST /api/budget   {"device": NAME, "bytes": N | null} → the same body after the change
    GET  /api/events?since=ID&kind=KIND → {"events": [...], "last_id": ID}

Device names are llama.cpp's (CPU, CUDA0, RPC[127.0.0.1:50052]). A cap is the most the
server's models may hold on that device; `null` lifts it. A cap is an order: the POST
wakes the reactor (registry.pressure), which migrates models over it down at once (no
dwell: that is for measured pressure) and back up when it is raised or lifted; the
"migrating" and "migration" events show it as it happens. Every route is key-protected
like the rest of the API (the app's middleware).

The body is built from snapshots (server/ops/reads.py): the reactor's last sample, never a
fresh one (its sources probe RPC workers and NVML), on the operations' own executor.

`attach(app, manager)` builds the reactor on this machine's sensor (RAM and cgroup,
NVML, the server's RPC workers) from the `pressure.*` config keys and starts it; it
stops when the manager closes.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, FastAPI, Query, Request
from pydantic import BaseModel, Field

from inferenceos.hardware.pressure import PressureSensor, Source, nvml_source, ram_source
from inferenceos.registry import events
from inferenceos.registry.manager import ModelManager
from inferenceos.registry.pressure import PressureReactor
from inferenceos.registry.tiers import used_by
from inferenceos.server.dialects.ollama.schema import ERRORS
from inferenceos.server.errors import APIError, Dialect, route_class
from inferenceos.server.ops.reads import ops_call
from inferenceos.server.state import state_of

router = APIRouter(tags=["memory"], responses=ERRORS, route_class=route_class(Dialect.OLLAMA))

MAX_CAP = 1 << 60  # bytes: anything larger is a typo, not a budget


class BudgetChange(BaseModel):
    device: str = Field(min_length=1, max_length=200)
    bytes: int | None = Field(default=None, ge=0, le=MAX_CAP)


def attach(app: FastAPI, manager: ModelManager) -> PressureReactor | None:
    """Start the pressure reactor for `manager` (None when `pressure.enabled` is off)."""
    from inferenceos.cluster.probe import rpc_source
    from inferenceos.config import load_config

    cfg = load_config()
    if not cfg.get("pressure.enabled"):
        app.state.pressure = None
        return None
    sources: list[Source] = [ram_source, nvml_source]
    if manager.base.rpc:
        sources.append(rpc_source(manager.base.rpc))
    reactor = PressureReactor(
        manager, PressureSensor(sources), high=cfg.get("pressure.high"),
        low=cfg.get("pressure.low"), dwell_s=cfg.get("pressure.dwell_s"),
    )
    reactor.start()
    app.state.pressure = reactor
    return reactor


def _reactor(request: Request) -> PressureReactor | None:
    return getattr(request.app.state, "pressure", None)


def budget_body(manager: ModelManager, reactor: PressureReactor | None) -> dict[str, Any]:
    """Every device the server knows of: sampled, capped, or holding our models. The
    sample is the reactor's last (it samples at start, then every second); before it
    has one a device's free memory is the machine profile's figure (None for a worker)."""
    sample = reactor.sensor.last if reactor is not None else None
    ours = used_by(manager.loaded())
    caps = manager.budget.caps
    machine = manager.budget.machine({})
    sampled = sample.devices if sample is not None else {}
    names = list(dict.fromkeys([*(d.name for d in machine.devices), *sampled, *caps, *ours]))
    signals = reactor.last if reactor is not None else {}
    devices = []
    for name in names:
        mem = sampled.get(name)
        dev = next((d for d in machine.devices if d.name == name), None)
        free = mem.free_bytes if mem else (dev.memory_bytes if dev else None)
        devices.append({
            "name": name, "cap_bytes": caps.get(name), "free_bytes": free,
            "used_bytes": ours.get(name, 0), "total_bytes": mem.total_bytes if mem else None,
            "signal": signals.get(name),
        })
    return {"devices": devices, "pressure": reactor.state() if reactor is not None else None}


@router.get("/api/budget")
async def get_budget(request: Request) -> Any:
    """Memory per device: cap, free, used by our models (and the pressure signal)."""
    manager, reactor = state_of(request).manager, _reactor(request)
    return await ops_call(lambda: budget_body(manager, reactor))


@router.post("/api/budget")
async def set_budget(body: BudgetChange, request: Request) -> Any:
    """Cap what our models may hold on `device` (`bytes`: null lifts the cap); the
    reactor acts on it at once."""
    manager, reactor = state_of(request).manager, _reactor(request)
    name = body.device.strip()
    known = await ops_call(lambda: budget_body(manager, reactor))
    names = [d["name"] for d in known["devices"]]
    if name not in names and not _is_rpc_name(name):
        raise APIError(400, f"unknown device {name!r} (devices: {', '.join(names)})",
                       "invalid_device")
    manager.budget.set_cap(name, body.bytes)
    events.add("budget", "", device=name, cap_bytes=body.bytes)
    if reactor is not None:
        reactor.order()
    return await ops_call(lambda: budget_body(manager, reactor))


@router.get("/api/events")
async def get_events(
    since: int = Query(0, ge=0), kind: str | None = Query(None, max_length=64),
) -> Any:
    """Events after id `since` (migrations, evictions, loads, budget changes, pressure)."""
    return {"events": events.EVENTS.since(since, kind), "last_id": events.EVENTS.last_id}


def _is_rpc_name(name: str) -> bool:
    from inferenceos.endpoint import parse_device_name

    return parse_device_name(name) is not None
