"""Models loaded: one engine per model, loaded on demand, unloaded when idle too long.

Contract of `ModelManager`:
- `acquire(name, ...)` returns a `Lease` on a loaded engine, loading it first if needed
  (blocking: call it from a worker thread, never on an event loop). Release the lease
  when the request is done; while leased a model is never unloaded.
- After its last lease ends a model stays loaded for its `keep_alive` seconds (negative:
  forever; zero: unloaded at once), then a reaper thread unloads it.
- Before a load, idle models are evicted least-recently-used first while the loaded set
  would exceed `max_loaded` models or the memory budget. If that is not enough because
  the others are busy, `ModelBusyError` says to retry later.
- Loads are serialised (one at a time); requests to models already loaded never wait
  for a load.
- Engines come from `factory(path, LoadSettings)`: anything with the `EngineLike` shape,
  so the continuous-batching scheduler drops in without change here.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from inferenceos.engine.session import LoadSettings
from inferenceos.errors import InferenceOSError
from inferenceos.registry.catalog import ResolvedModel

DEFAULT_KEEP_ALIVE_S = 300.0
DEFAULT_CTX = 4096


class ModelBusyError(InferenceOSError):
    """No room to load a model now: the others that would have to go are in use."""


class EngineLike(Protocol):
    """What the server needs from an engine (`inferenceos.engine.engine.Engine`)."""

    @property
    def n_ctx(self) -> int: ...
    @property
    def load_s(self) -> float: ...
    def chat_prompt(
        self,
        messages: Sequence[Any],
        template: str | None = None,
        tools: Sequence[dict[str, Any]] | None = None,
    ) -> str: ...
    def generate(self, prompt: str | list[int], sampling: Any, cancel: Any = None) -> Any: ...
    def embed(self, texts: Sequence[str]) -> list[list[float]]: ...
    def tokenize(self, text: str, add_special: bool = True) -> list[int]: ...
    def close(self) -> None: ...


EngineFactory = Callable[[Path, LoadSettings], EngineLike]


def engine_factory(n_parallel: int, max_queue: int = 64) -> EngineFactory:
    """Engines that batch `n_parallel` sequences and queue `max_queue` more."""
    def factory(path: Path, settings: LoadSettings) -> EngineLike:
        from inferenceos.engine.engine import Engine

        return Engine(path, settings, n_parallel=n_parallel, max_queue=max_queue)
    return factory


@dataclass
class LoadedModel:
    """A loaded engine and its bookkeeping (times from `time.monotonic`)."""

    model: ResolvedModel
    engine: EngineLike
    settings: LoadSettings
    memory_bytes: int
    loaded_at: float
    keep_alive: float
    last_used: float
    refs: int = 0
    expires_at: float | None = None  # monotonic deadline once idle; None: never

    def expires_wall(self, now: float) -> float | None:
        """Wall-clock expiry (for /api/ps): when busy, as if released now."""
        if self.keep_alive < 0:
            return None
        deadline = self.expires_at if self.refs == 0 and self.expires_at else now + self.keep_alive
        return time.time() + (deadline - now)


@dataclass
class Lease:
    """A loaded model in use by one request; `release()` (or `with`) hands it back."""

    manager: ModelManager
    loaded: LoadedModel
    fresh: bool = False  # this acquire loaded the model
    released: bool = field(default=False)

    @property
    def engine(self) -> EngineLike:
        return self.loaded.engine

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.manager._release(self.loaded)

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def estimate_memory(path: Path, n_ctx: int) -> int:
    """Bytes a model will take: its file plus an f16 KV cache for `n_ctx` (upper bound)."""
    from inferenceos.model.spec import load_spec

    spec = load_spec(path)
    kv = spec.block_count * n_ctx * spec.head_count_kv * (spec.key_length + spec.value_length)
    return spec.size_bytes + 2 * kv


class ModelManager:
    """Loads, leases and unloads engines by model name (see the module contract)."""

    def __init__(
        self,
        resolve: Callable[[str], ResolvedModel],
        factory: EngineFactory | None = None,
        base_settings: LoadSettings | None = None,
        keep_alive_s: float = DEFAULT_KEEP_ALIVE_S,
        max_loaded: int = 3,
        memory_budget_bytes: int | None = None,
        estimate: Callable[[Path, int], int] = estimate_memory,
        slots: int = 1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._resolve = resolve
        self._factory = factory or engine_factory(max(1, slots))
        self.base_settings = base_settings or LoadSettings(n_ctx=0)
        self.keep_alive_s = keep_alive_s
        self.max_loaded = max_loaded
        self.memory_budget_bytes = memory_budget_bytes
        self._estimate = estimate
        self.slots = max(1, slots)  # sequences per engine: the KV cache holds n_ctx each
        self._clock = clock
        self._models: dict[str, LoadedModel] = {}
        self._lock = threading.Lock()  # guards _models and counters
        self._load_lock = threading.Lock()  # one load at a time
        self._wake = threading.Event()
        self._closed = False
        self._reaper: threading.Thread | None = None
        self.loads_total = 0
        self.evictions_total: dict[str, int] = {}

    # -- settings ----------------------------------------------------------------------

    def settings_for(self, model: ResolvedModel, overrides: dict[str, int] | None) -> LoadSettings:
        """Base settings + request overrides (`n_ctx`, `n_batch`, `n_threads`);
        n_ctx 0 means min(4096, the model's training context)."""
        s = dataclasses.replace(self.base_settings, **(overrides or {}))  # type: ignore[arg-type]
        train = model.context_length or DEFAULT_CTX
        # a client may not size the KV cache (memory) beyond what the model was trained on
        n_ctx = min(DEFAULT_CTX, train) if s.n_ctx <= 0 else min(s.n_ctx, train)
        threads = min(s.n_threads, os.cpu_count() or 1)
        return dataclasses.replace(s, n_ctx=n_ctx, n_threads=threads,
                                   n_threads_batch=min(s.n_threads_batch, os.cpu_count() or 1))

    # -- leasing -----------------------------------------------------------------------

    def acquire(
        self,
        name: str,
        keep_alive: float | None = None,
        overrides: dict[str, int] | None = None,
    ) -> Lease:
        """Lease the model `name`, loading it if needed (blocking)."""
        model = self._resolve(name)
        settings = self.settings_for(model, overrides)
        hit = self._try_lease(model.name, settings, keep_alive, overrides is not None)
        if hit:
            return hit
        with self._load_lock:
            hit = self._try_lease(model.name, settings, keep_alive, overrides is not None)
            if hit:
                return hit
            return self._load(model, settings, keep_alive)

    def _try_lease(
        self, key: str, settings: LoadSettings, keep_alive: float | None, strict: bool
    ) -> Lease | None:
        """A lease on the loaded `key` if its settings suit; an idle model whose settings
        differ from an explicit request is unloaded (so it reloads), a busy one is used."""
        stale = None
        with self._lock:
            lm = self._models.get(key)
            if lm is None:
                return None
            if strict and lm.settings != settings and lm.refs == 0:
                stale = self._models.pop(key)
            else:
                lm.refs += 1
                lm.last_used = self._clock()
                lm.expires_at = None
                if keep_alive is not None:
                    lm.keep_alive = keep_alive
                return Lease(self, lm)
        self._close(stale, "replaced")
        return None

    def _load(self, model: ResolvedModel, settings: LoadSettings,
              keep_alive: float | None) -> Lease:
        need = self._estimate(model.path, settings.n_ctx * self.slots)
        self._make_room(model.name, need)
        engine = self._factory(model.path, settings)
        now = self._clock()
        lm = LoadedModel(model, engine, settings, need, now,
                         self.keep_alive_s if keep_alive is None else keep_alive, now, refs=1)
        with self._lock:
            self._models[model.name] = lm
            self.loads_total += 1
        return Lease(self, lm, fresh=True)

    def _make_room(self, name: str, need: int) -> None:
        """Evict idle models (LRU) until `need` more bytes and one more model fit."""
        budget = self.memory_budget_bytes
        while True:
            with self._lock:
                used = sum(m.memory_bytes for m in self._models.values())
                over_count = len(self._models) >= self.max_loaded
                over_mem = budget is not None and used + need > budget and bool(self._models)
                if not (over_count or over_mem):
                    return
                idle = [m for m in self._models.values() if m.refs == 0]
                if not idle:
                    raise ModelBusyError(
                        f"cannot load '{name}' now: {len(self._models)} model(s) loaded and "
                        "all in use; retry later"
                    )
                victim = min(idle, key=lambda m: m.last_used)
                del self._models[victim.model.name]
            self._close(victim, "memory" if over_mem else "max_loaded")

    def _release(self, lm: LoadedModel) -> None:
        with self._lock:
            lm.refs -= 1
            lm.last_used = self._clock()
            if lm.refs == 0 and lm.keep_alive >= 0:
                lm.expires_at = lm.last_used + lm.keep_alive
                if lm.keep_alive == 0:
                    self._wake.set()

    # -- unloading ---------------------------------------------------------------------

    def unload(self, name: str) -> bool:
        """Unload `name` now if idle, else as soon as its last lease ends. False if it
        was not loaded."""
        model = self._resolve(name)
        with self._lock:
            lm = self._models.get(model.name)
            if lm is None:
                return False
            lm.keep_alive = 0
            if lm.refs > 0:
                return True
            del self._models[model.name]
        self._close(lm, "unload")
        return True

    def reap(self) -> int:
        """Unload every idle model whose keep-alive has passed; return how many."""
        now = self._clock()
        with self._lock:
            due = [m for m in self._models.values()
                   if m.refs == 0 and m.expires_at is not None and m.expires_at <= now]
            for m in due:
                del self._models[m.model.name]
        for m in due:
            self._close(m, "expired")
        return len(due)

    def _close(self, lm: LoadedModel | None, reason: str) -> None:
        if lm is None:
            return
        with self._lock:
            self.evictions_total[reason] = self.evictions_total.get(reason, 0) + 1
        lm.engine.close()

    def loaded(self) -> list[LoadedModel]:
        """A snapshot of the loaded models."""
        with self._lock:
            return list(self._models.values())

    # -- lifetime ----------------------------------------------------------------------

    def start_reaper(self, interval_s: float = 1.0) -> None:
        """Start the background thread that unloads expired models."""
        def loop() -> None:
            while not self._closed:
                self._wake.wait(interval_s)
                self._wake.clear()
                if not self._closed:
                    self.reap()

        self._reaper = threading.Thread(target=loop, name="model-reaper", daemon=True)
        self._reaper.start()

    def close(self) -> None:
        """Stop the reaper and unload every model (waits for engines to finish)."""
        self._closed = True
        self._wake.set()
        if self._reaper is not None:
            self._reaper.join(timeout=5)
        with self._lock:
            models = list(self._models.values())
            self._models.clear()
        for m in models:
            m.engine.close()
