"""The client side: what each worker offers now, and the link to it (measured once).

`probe_workers(endpoints)` asks every worker's info endpoint (in parallel, each with a
short timeout) for its devices and free memory, and returns one `WorkerProbe` per
endpoint: either `info` (+ `link`) or `error` saying why it is left out (unreachable,
busy with another client, not a worker). It never touches the RPC port itself: only the
engine that loads a model connects there, so probing does not take the worker's single
client slot.

The link (round-trip time, bandwidth) is measured on first contact and cached in
`<data dir>/hardware/links.json`, keyed by the worker's address, like the rest of the
hardware profile; `refresh=True` (`inferenceos hardware --refresh`) measures again.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from inferenceos.atomic import read_json, write_json_atomic
from inferenceos.cluster.info import (
    LinkMeasure,
    WorkerInfo,
    WorkerUnreachable,
    measure_link,
    query_info,
)
from inferenceos.endpoint import Endpoint, parse_endpoints
from inferenceos.hardware.pressure import DeviceMemory, Source
from inferenceos.paths import data_dir

LINK_MAX_AGE_S = 7 * 24 * 3600


@dataclass(frozen=True)
class WorkerProbe:
    """One worker as the planner will see it; `error` set means: leave it out."""

    endpoint: Endpoint
    info: WorkerInfo | None = None
    link: LinkMeasure | None = None
    error: str = ""
    link_cached: bool = False

    @property
    def usable(self) -> bool:
        return self.info is not None and not self.error


def links_path() -> Path:
    return data_dir() / "hardware" / "links.json"


def _cached_link(ep: Endpoint) -> LinkMeasure | None:
    data = read_json(links_path(), {})
    entry = data.get(ep.address) if isinstance(data, dict) else None
    if not isinstance(entry, dict):
        return None
    try:
        link = LinkMeasure(**entry)
    except TypeError:
        return None
    return link if time.time() - link.measured_at < LINK_MAX_AGE_S else None


def _store_link(ep: Endpoint, link: LinkMeasure) -> None:
    data = read_json(links_path(), {})
    data = data if isinstance(data, dict) else {}
    data[ep.address] = asdict(link)
    write_json_atomic(links_path(), data)


def forget_links() -> None:
    """Drop every cached link measurement (the next probe measures again)."""
    links_path().unlink(missing_ok=True)


def probe_worker(ep: Endpoint, timeout: float = 2.0, refresh: bool = False,
                 measure: bool = True) -> WorkerProbe:
    """Ask one worker; never raises for a worker that is down or busy."""
    try:
        info = query_info(ep, timeout)
    except WorkerUnreachable as exc:
        return WorkerProbe(ep, error=f"worker {ep.address} unreachable: {exc}")
    # info.rpc_port may differ from ep.port: through an SSH tunnel or a relay the client
    # reaches the worker's ports under other numbers (docs/cluster.md)
    if info.busy:
        return WorkerProbe(ep, info, error=f"worker {ep.address} is busy with another client")
    if not info.devices:
        return WorkerProbe(ep, info, error=f"worker {ep.address} serves no devices")
    link = None if refresh else _cached_link(ep)
    cached = link is not None
    if link is None and measure:
        try:
            link = measure_link(ep, timeout=max(timeout, 5.0))
            _store_link(ep, link)
        except WorkerUnreachable as exc:
            return WorkerProbe(ep, info, error=f"worker {ep.address}: link test failed: {exc}")
    return WorkerProbe(ep, info, link, link_cached=cached)


def probe_workers(endpoints: tuple[Endpoint, ...], timeout: float = 2.0,
                  refresh: bool = False) -> list[WorkerProbe]:
    """`probe_worker` for each endpoint, in parallel, in the given order."""
    if not endpoints:
        return []
    with ThreadPoolExecutor(max_workers=min(8, len(endpoints))) as pool:
        return list(pool.map(lambda ep: probe_worker(ep, timeout, refresh), endpoints))


def wait_ready(ep: Endpoint, timeout: float = 30.0) -> WorkerInfo:
    """Poll until the worker's info endpoint answers (for scripts and tests)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return query_info(ep, timeout=1.0)
        except WorkerUnreachable:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def worker_state(ep: Endpoint, timeout: float = 0.5) -> str:
    """"up" (free), "in use" (a client, e.g. a loaded model, holds it) or "lost: <why>"
    for the worker at `ep` (/health asks each on a thread of its own). Never measures
    the link."""
    p = probe_worker(ep, timeout, measure=False)
    if p.usable:
        return "up"
    if p.info is not None and p.info.busy:
        return "in use"
    return f"lost: {p.error}"


def rpc_source(rpc: Iterable[str], timeout: float = 0.5) -> Source:
    """Workers' devices (`RPC[host:port]`, `#i` for device i > 0) with the memory each
    worker offers now (its free memory within its `--mem` cap)."""
    endpoints = tuple(rpc)

    def read() -> dict[str, DeviceMemory]:
        out: dict[str, DeviceMemory] = {}
        for ep in parse_endpoints(endpoints):
            try:
                info = query_info(ep, timeout=timeout)
            except Exception:  # unreachable: left out of this sample
                continue
            for dev in info.devices:
                cap = ep.mem_cap or info.mem_cap_bytes  # the client's cap, else the worker's
                free, total = dev.offered_bytes, dev.memory_total_bytes
                if cap:
                    free, total = min(free, cap), min(total, cap)
                out[ep.device_name(dev.index)] = DeviceMemory(free, total)
        return out

    return read
