"""Everything a route needs, in one object stored on `app.state.ios`."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass, field

from starlette.requests import Request

from inferenceos.engine.cancel import CancelEvent
from inferenceos.errors import ModelNotFoundError
from inferenceos.registry.catalog import Catalog
from inferenceos.registry.manager import ModelManager
from inferenceos.registry.names import InvalidNameError
from inferenceos.server.admission import Admission
from inferenceos.server.errors import APIError
from inferenceos.server.ops.metrics import ServerMetrics
from inferenceos.server.settings import ServerSettings


@dataclass
class ActiveGeneration:
    """A generation in flight: its model, cancel event and live token counts."""

    model: str
    n_ctx: int
    cancel: CancelEvent  # set: the stream waiting for its next token wakes at once
    tokens: int = 0  # prompt + generated so far (KV cells it holds)


@dataclass
class ServerState:
    """Settings, catalog, model manager, queue and metrics of one running server."""

    settings: ServerSettings
    catalog: Catalog
    manager: ModelManager
    admission: Admission = field(init=False)
    metrics: ServerMetrics = field(init=False)
    draining: bool = False
    kv_reported: dict[str, float] = field(default_factory=dict)  # engines' own, per scrape
    _gens: dict[int, ActiveGeneration] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        s = self.settings
        self.admission = Admission(s.max_running, s.max_waiting, s.retry_after_s)
        self.metrics = ServerMetrics(
            running=lambda: [({}, float(self.admission.running))],
            waiting=lambda: [({}, float(self.admission.waiting))],
            loaded=lambda: [({}, float(len(self.manager.loaded())))],
            kv_usage=self._kv_usage,
            loads=lambda: [({}, float(self.manager.loads_total))],
            evictions=lambda: [({"reason": k}, float(v))
                               for k, v in sorted(self.manager.evictions_total.items())],
            migrations=lambda: [({"reason": r, "direction": d}, float(n))
                                for (r, d), n in sorted(self.manager.migrations_by.items())],
            migration_bytes=lambda: [({"direction": d}, float(n))
                                     for d, n in sorted(self.manager.migration_bytes.items())],
        )
        from inferenceos.server.ops.kv_cache_metrics import register as register_kv_cache
        from inferenceos.server.ops.weight_metrics import register as register_weights

        loaded = lambda: [m.model.name for m in self.manager.loaded()]  # noqa: E731
        register_kv_cache(self.metrics, loaded)
        register_weights(self.metrics, loaded)

    def model_name(self, requested: str | None) -> str:
        """The model a request means: its own name, else the server's default. With
        `any_model`, a name the catalog does not know also means the default (as
        llama-server answers whatever model a client names)."""
        name = (requested or "").strip() or self.settings.default_model
        if not name:
            raise APIError(400, "no model named in the request and the server has no default",
                           "model_required")
        if self.settings.any_model and self.settings.default_model and name != \
                self.settings.default_model:
            try:
                self.catalog.resolve(name)
            except (ModelNotFoundError, InvalidNameError):
                return self.settings.default_model
        return name

    def check_accepting(self) -> None:
        """503 while shutting down."""
        if self.draining:
            self.metrics.rejected.labels(reason="draining").inc()
            raise APIError(503, "server is shutting down", "shutting_down",
                           {"Retry-After": str(self.settings.retry_after_s)})

    # -- generations in flight ---------------------------------------------------------

    def track(self, gen: ActiveGeneration) -> None:
        with self._lock:
            self._gens[id(gen)] = gen

    def untrack(self, gen: ActiveGeneration) -> None:
        with self._lock:
            self._gens.pop(id(gen), None)

    def cancel_all(self) -> int:
        """Ask every generation in flight to stop (graceful shutdown's last resort)."""
        with self._lock:
            gens = list(self._gens.values())
        for g in gens:
            g.cancel.set()
        return len(gens)

    def _kv_usage(self) -> Iterable[tuple[dict[str, str], float]]:
        """Per loaded model: what its engine reported at this scrape (`kv_reported`,
        filled by the /metrics route), else an estimate from the generations in
        flight (tokens held over `slots` × n_ctx cells)."""
        usage: dict[str, float] = {lm.model.name: 0.0 for lm in self.manager.loaded()}
        with self._lock:
            for g in self._gens.values():
                cells = max(1, g.n_ctx * self.manager.slots)
                usage[g.model] = usage.get(g.model, 0.0) + g.tokens / cells
        usage.update({k: v for k, v in self.kv_reported.items() if k in usage})
        return [({"model_name": k}, min(1.0, v)) for k, v in sorted(usage.items())]


def state_of(request: Request) -> ServerState:
    """The server's state for a request (set on `app.state.ios` by `create_app`): the
    one way a route module reaches the catalog, manager, queue and metrics."""
    state: ServerState = request.app.state.ios
    return state
