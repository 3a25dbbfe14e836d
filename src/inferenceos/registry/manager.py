"""The memory manager: many models in one memory budget, hot / warm / cold.

Contract of `ModelManager`:
- `acquire(name, keep_alive, overrides)` returns a `Lease` on a hot engine (blocking:
  call it from a worker thread, never on an event loop): a hot model is leased at once;
  a warm one (worker and weights kept, context freed) is promoted by opening a context,
  without reading the weights again; a cold one is planned and loaded. Release the
  lease when the request is done; a leased model is never demoted.
- Every load is planned by the one planner entry point (`plan.entry.plan_load`) against
  the memory usable now (`budget.MemoryBudget`), and the model is charged the plan's
  own figures per device (`Plan.charge`): hot = weights + KV + compute + output,
  warm = what stays when the context is freed.
- Room is made by memory, least recently used first, hot → warm before warm → cold
  (`tiers`); pinned models are never demoted. A load that cannot fit even then raises
  `NoRoomError` (503) with the figures. `load_pinned()` loads the pinned models up
  front (`serve --pin` calls it before it listens).
- Ollama's keep_alive: seconds an idle model stays loaded (0: unloaded on release,
  negative: never by time; memory pressure may still demote an unpinned model).
- Requests carrying load overrides (num_ctx, num_gpu, ...) get a model planned for
  them: a change of context only is a resize of the same worker that carries cached
  conversations over (`Engine.resize`); any other change reloads an idle model.
- Loads are serialised (one at a time); requests to hot models never wait for a load,
  and requests to different hot models run in parallel, each on its own worker.
- `_lock` guards bookkeeping only: it is never held across a load, a migration, a
  worker call or a file read, so `loaded()`, `ps()` and `is_moving()` answer at once
  (the server's operations routes read them on its event loop, server/ops/reads.py).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import inferenceos.telemetry as telemetry
from inferenceos.engine.client import EngineClient
from inferenceos.errors import InferenceOSError, UsageError
from inferenceos.plan.devices import Machine
from inferenceos.plan.entry import LoadRequest
from inferenceos.plan.llama_params import LlamaParams
from inferenceos.plan.model_facts import load_model_facts
from inferenceos.plan.plan import Plan
from inferenceos.plan.preflight import PlanRefused
from inferenceos.registry import events
from inferenceos.registry.budget import MemoryBudget
from inferenceos.registry.catalog import ResolvedModel
from inferenceos.registry.leases import COLD, HOT, WARM, Lease, ResidentModel
from inferenceos.registry.tiers import blockers, next_demotion, shortfall, used_by
from inferenceos.units import format_bytes as fb

DEFAULT_KEEP_ALIVE_S = 300.0
_WOKE = "woke from warm; "  # the reason a promoted model shows, before its load's


class ModelBusyError(InferenceOSError):
    """No room to load a model now: the others that would have to go are in use."""


class NoRoomError(ModelBusyError):
    """The model does not fit the budget even after every idle model gave way."""


Planner = Callable[[ResolvedModel, LoadRequest, Machine], Plan]
EngineFactory = Callable[..., EngineClient]  # (path, LlamaParams, slots, **plan keywords)
ContextHint = Callable[[ResolvedModel], "tuple[int, str] | None"]


def plan_model(model: ResolvedModel, req: LoadRequest, machine: Machine) -> Plan:
    """The default planner: the one entry point for this machine now (free cores, the
    learned calibration, the policy, optimize's stored best), on the GGUF header."""
    from inferenceos.plan.here import plan_here

    return plan_here(load_model_facts(model.path), machine, req).plan


def engine_factory(max_queue: int = 64, **engine_kw: Any) -> EngineFactory:
    """Engines in worker processes that batch `slots` sequences, queue `max_queue`; the
    plan's projector (mmproj, mmproj_gpu) and drafter come as keyword arguments."""
    def factory(path: Path, params: LlamaParams, slots: int, **planned: Any) -> EngineClient:
        from inferenceos.engine.engine import Engine

        return Engine(path, params.per_sequence(), n_parallel=slots, max_queue=max_queue,
                      **engine_kw, **planned)
    # host RAM each engine's KV cache tier may hold (engine/kv/store.py): the manager
    # charges it beside the model's own, in both tiers (it lives in the worker)
    factory.kv_cache_ram = int(engine_kw.get("kv_cache_ram", 0) or 0)  # type: ignore[attr-defined]
    return factory


def _engine_kw(plan: Plan) -> dict[str, Any]:
    """The engine's arguments from the plan besides its parameters: the projector's (a
    multimodal model) and the drafter (plan/draft_choice.py; none: plain decoding)."""
    p = plan.projector
    kw: dict[str, Any] = {} if p is None else {
        "mmproj": Path(p.path), "mmproj_gpu": p.use_gpu, "mmproj_device": p.llama_name}
    if plan.engine_draft is not None:
        kw["draft"] = plan.engine_draft
    return kw


def recent_context(model: ResolvedModel) -> tuple[int, str] | None:
    """The context this model's recorded traffic needs: the 95th percentile of prompt +
    output tokens over its last 200 generations here, with 25 % headroom, rounded up to
    a power of two (≥ 2048); None without history."""
    try:
        rows = telemetry.generations(model.path, limit=200)
    except Exception:  # telemetry is advice: never a reason to fail a load
        return None
    sizes = sorted(r.prompt_tokens + r.output_tokens for r in rows)
    if len(sizes) < 3:
        return None
    p95 = sizes[min(len(sizes) - 1, int(0.95 * len(sizes)))]
    n = 2048
    while n < p95 * 1.25:
        n *= 2
    return n, f"p95 of {len(sizes)} recorded requests is {p95} tokens"


class ModelManager:
    """Loads, leases, demotes and unloads engines by model name (see the module doc)."""

    def __init__(
        self,
        resolve: Callable[[str], ResolvedModel],
        factory: EngineFactory | None = None,
        *,
        planner: Planner = plan_model,
        budget: MemoryBudget | None = None,
        base: LoadRequest | None = None,
        slots: int = 1,
        keep_alive_s: float = DEFAULT_KEEP_ALIVE_S,
        max_loaded: int | None = None,
        pinned: Iterable[str] = (),
        context_hint: ContextHint | None = recent_context,
        on_load: Callable[[str, Plan], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        adapters: Callable[[ResolvedModel], tuple[str, ...]] | None = None,
    ) -> None:
        self._resolve = resolve
        self._adapters = adapters  # a model's LoRA files, priced by its plan (LoadRequest.lora)
        self._factory = factory or engine_factory()
        self._planner = planner
        self.budget = budget or MemoryBudget()
        self.slots = max(1, slots)  # sequences per engine
        self.base = replace(base or LoadRequest(), n_seq=self.slots)
        self.keep_alive_s = keep_alive_s
        self.max_loaded = max_loaded
        self._pinned_names = set(pinned)
        self._pin_order = list(dict.fromkeys(pinned))  # load_pinned's order
        self._hint = context_hint
        self._on_load = on_load
        self._clock = clock
        self._models: dict[str, ResidentModel] = {}
        self._moving: set[str] = set()  # models being demoted, promoted or resized
        self._lock = threading.Lock()  # guards _models, _moving and counters
        self._load_lock = threading.Lock()  # one load / promotion / demotion at a time
        self._wake = threading.Event()
        self._closed = False
        self._reaper: threading.Thread | None = None
        self.loads_total = 0
        self.evictions_total: dict[str, int] = {}
        self.promotions_total = 0
        self.migrations_total = 0
        # live migrations by (reason, direction), and the sequence-state bytes they
        # carried by direction: read by the server's /metrics at scrape time
        self.migrations_by: dict[tuple[str, str], int] = {}
        self.migration_bytes: dict[str, int] = {}

    # -- requests ----------------------------------------------------------------------

    def request_for(
        self, model: ResolvedModel, overrides: dict[str, Any] | None, why: str = ""
    ) -> tuple[LoadRequest, str]:
        """The LoadRequest for `model` with a request's overrides (LoadRequest field
        names), and why its context is what it is."""
        asked, req, why = why, self.base, ""
        if req.n_ctx:
            why = f"--ctx {req.n_ctx}"
        elif self._hint is not None and (hint := self._hint(model)) is not None:
            req, why = replace(req, n_ctx=hint[0]), hint[1]
        if self._adapters is not None and (files := self._adapters(model)):
            req = replace(req, lora=files)
        if overrides:
            req = replace(req, **overrides)
            if "n_ctx" in overrides:
                why = asked or f"num_ctx {overrides['n_ctx']} asked by a request"
        train = model.context_length or 0
        if req.n_ctx and train and req.n_ctx > train and not req.rope_scaling:
            req = replace(req, n_ctx=train)  # a client may not size beyond training
        return req, why or "default context"

    def plan_for(self, name: str, overrides: dict[str, Any] | None = None) -> Plan:
        """The plan a load of `name` would get now (nothing is loaded)."""
        model = self._resolve(name)
        return self._plan(model, self.request_for(model, overrides)[0], exclude=model.name)

    def acquire(
        self, name: str, keep_alive: float | None = None,
        overrides: dict[str, Any] | None = None, why: str = "",
    ) -> Lease:
        """Lease the model `name`, loading or promoting it if needed (blocking); `why`
        explains the overrides (what `ps` shows as the reason)."""
        model = self._resolve(name)
        if overrides is None and (hit := self._try_lease(model.name, keep_alive)):
            return hit  # (before request_for: its context hint reads telemetry)
        req, why = self.request_for(model, overrides, why)
        strict = req if overrides is not None else None
        if strict is not None and (hit := self._try_lease(model.name, keep_alive, strict)):
            return hit
        with self._load_lock:
            hit = self._try_lease(model.name, keep_alive, strict)
            if hit:
                return hit
            lm = self._models.get(model.name)
            if lm is not None and lm.tier == WARM and self._fits_request(lm, req, False):
                return self._promote(lm, keep_alive)
            if lm is not None and lm.refs == 0 and _stale(lm):
                self._drop(lm, "worker_lost")
                lm = None
            if lm is not None and lm.refs == 0:
                resized = self._try_resize(lm, req, why, keep_alive)
                if resized:
                    return resized
                self._drop(lm, "replaced")
            return self._load(model, req, why, keep_alive)

    @staticmethod
    def _fits_request(lm: ResidentModel, req: LoadRequest, strict: bool) -> bool:
        return not strict or lm.key == _key(req)

    def try_acquire(self, name: str, keep_alive: float | None = None) -> Lease | None:
        """A lease on the hot model `name` (a resolved name: `ResolvedModel.name`) as it
        is loaded, for a request without load settings; None where `acquire` would load,
        promote, re-plan or wait for a move. Reads nothing but memory and takes only
        the short-held table lock: an event loop may call it."""
        return self._try_lease(name, keep_alive)

    def _try_lease(
        self, name: str, keep_alive: float | None, strict: LoadRequest | None = None
    ) -> Lease | None:
        """A lease on the hot `name` if it suits the request: a `strict` one (a
        request's explicit load settings) whose settings differ takes the slow path
        (resize or reload) when the model is idle; a busy model is used as it is."""
        with self._lock:
            lm = self._models.get(name)
            if lm is None or lm.tier != HOT or name in self._moving:
                return None
            if strict is not None and lm.key != _key(strict) and lm.refs == 0:
                return None
            if lm.refs == 0 and _stale(lm):
                return None  # the slow path re-plans it
            self._lease(lm, keep_alive)
            return Lease(self, lm)

    def _lease(self, lm: ResidentModel, keep_alive: float | None) -> None:
        lm.refs += 1
        lm.last_used = self._clock()
        lm.expires_at = None
        if keep_alive is not None:
            lm.keep_alive = keep_alive

    # -- loading, promoting, resizing ----------------------------------------------------

    def _plan(self, model: ResolvedModel, req: LoadRequest, exclude: str = "") -> Plan:
        """The plan for `model` on the memory our other models could give back; an
        accelerator's share of models that cannot give way now (in use, pinned) is not
        offered: the model goes beside them there (layers in RAM), as it cannot wait."""
        others = [m for m in self.loaded() if m.model.name != exclude]
        held = used_by(m for m in others if m.refs or m.pinned)
        if model.mmproj is not None and req.mmproj is None:  # its encoder is charged too
            req = replace(req, mmproj=model.mmproj)
        try:
            return self._planner(model, req, self.budget.machine(used_by(others), held=held))
        except PlanRefused as exc:
            raise NoRoomError(f"cannot load '{model.name}': {exc}") from None

    def _load(self, model: ResolvedModel, req: LoadRequest, why: str,
              keep_alive: float | None) -> Lease:
        plan = self._plan(model, req)
        kv_ram = int(getattr(self._factory, "kv_cache_ram", 0) or 0)
        need = plan.charge()
        # the drafter's weights and KV as the plan priced them: the worker measures
        # them only once loaded (`lm.extra` below), and room must be made before
        drafter = plan.draft.memory if plan.draft is not None else 0
        need["CPU"] = need.get("CPU", 0) + kv_ram + drafter
        self._make_room(model.name, need)
        t0 = time.perf_counter()
        engine = self._factory(model.path, plan.params(), self.slots, **_engine_kw(plan))
        now = self._clock()
        lm = ResidentModel(
            model, engine, plan, self.slots, now,
            self.keep_alive_s if keep_alive is None else keep_alive, now, refs=1,
            pinned=model.name in self._pinned_names, reason=f"{why}; {plan.summary()}",
            key=_key(req),
        )
        draft = int(getattr(engine, "draft_bytes", 0) or 0)
        if draft or kv_ram:  # a draft: measured by the worker once it has loaded
            lm.extra = {"CPU": draft + kv_ram}
        lm.kv_cache_ram = kv_ram
        with self._lock:
            self._models[model.name] = lm
            self.loads_total += 1
        _record_load(model, time.perf_counter() - t0, plan, engine)
        events.add("load", model.name, load_s=time.perf_counter() - t0, plan=plan.summary())
        if self._on_load is not None:
            self._on_load(model.name, plan)
        return Lease(self, lm, fresh=True)

    def _promote(self, lm: ResidentModel, keep_alive: float | None) -> Lease:
        """warm → hot: room for the context, then a new context on the kept weights."""
        hot = lm.plan.charge()
        # what the worker holds besides the model (draft, KV cache RAM) is in both tiers
        delta = {d: b + lm.extra.get(d, 0) - lm.charge.get(d, 0) for d, b in hot.items()}
        self._moving.add(lm.model.name)
        try:
            self._make_room(lm.model.name, delta)
            _call_tier(lm.engine, "wake")
            with self._lock:
                lm.tier = HOT
                lm.reason = _WOKE + (lm.hot_reason or lm.plan.summary())
                self._lease(lm, keep_alive)
                self.promotions_total += 1
        finally:
            self._moving.discard(lm.model.name)
        return Lease(self, lm, woke=True)

    def _try_resize(self, lm: ResidentModel, req: LoadRequest, why: str,
                    keep_alive: float | None) -> Lease | None:
        """Only the context differs: a new context on the same worker, cached
        conversations carried over (the context follows the workload)."""
        resize = getattr(lm.engine, "resize", None)
        if resize is None or lm.key[1:] != _key(req)[1:]:
            return None
        plan = self._plan(lm.model, req, exclude=lm.model.name)
        if plan.params().n_gpu_layers != lm.plan.params().n_gpu_layers:
            return None  # placement changed too: a reload
        self._moving.add(lm.model.name)
        try:
            grow = {d: b + lm.extra.get(d, 0) - lm.charge.get(d, 0)
                    for d, b in plan.charge().items()}
            self._make_room(lm.model.name, grow)
            if lm.tier == WARM:
                _call_tier(lm.engine, "wake")
            old = lm.n_ctx
            resize(plan.ctx.n_ctx // self.slots, self.slots)
            with self._lock:
                lm.plan, lm.tier, lm.key = plan, HOT, _key(req)
                lm.reason = f"resized {old} → {lm.n_ctx}: {why}"
                self._lease(lm, keep_alive)
        finally:
            self._moving.discard(lm.model.name)
        _record("reload", lm.model, reason="resize", n_ctx_before=old, n_ctx_after=lm.n_ctx)
        return Lease(self, lm)

    def _make_room(self, name: str, need: dict[str, int]) -> None:
        """Demote idle models (tiers' order) until `need` more bytes fit, or raise."""
        while True:
            now = self.budget.now()  # file and /proc reads: never under `_lock`
            with self._lock:
                models = [m for m in self._models.values() if m.model.name not in self._moving
                          or m.model.name == name]
                ours = used_by(self._models.values())
                short = shortfall(
                    ours, need, self.budget.capacity(ours, now), self.budget.total_cap,
                    len(self._models) if name not in self._models else 0, self.max_loaded,
                )
                if not short:
                    return
                step = next_demotion(models, short, exclude=name)
                if step is not None:
                    victim, tier = step
                    self._moving.add(victim.model.name)
                    if tier == COLD:
                        del self._models[victim.model.name]
            if step is None:  # the message reads the models: outside the lock
                message = self._no_room(name, need, short.describe())
                _record("oom_refusal", self._resolve(name), need=need, reason=message)
                raise NoRoomError(message)
            try:
                self._demote(victim, tier, "memory" if short.bytes_by_device else "max_models")
            finally:
                self._moving.discard(victim.model.name)

    def _no_room(self, name: str, need: dict[str, int], short: str) -> str:
        held = blockers(self.loaded(), exclude=name)
        needs = ", ".join(f"{d} {fb(b)}" for d, b in need.items() if b > 0)
        return (f"cannot load '{name}' now: it needs {needs}; {short}"
                + (f"; held by {held}" if held else "") + "; retry later or free memory")

    def _demote(self, lm: ResidentModel, tier: str, reason: str) -> None:
        if tier == WARM:
            _call_tier(lm.engine, "sleep")
            with self._lock:
                # what the model says again once it wakes (once: not "woke from warm" twice)
                lm.hot_reason = lm.reason.removeprefix(_WOKE)
                lm.tier, lm.reason = WARM, f"demoted to warm ({reason})"
        else:
            self._close(lm, reason)
        with self._lock:
            key = f"{reason}_{tier}"
            self.evictions_total[key] = self.evictions_total.get(key, 0) + 1
        _record("eviction", lm.model, reason=reason, tier=tier)

    def _release(self, lm: ResidentModel) -> None:
        with self._lock:
            lm.refs -= 1
            lm.last_used = self._clock()
            if lm.refs == 0 and lm.keep_alive >= 0 and not lm.pinned:
                lm.expires_at = lm.last_used + lm.keep_alive
                if lm.keep_alive == 0:
                    self._wake.set()

    # -- live migration ------------------------------------------------------------------

    def migrate(self, name: str, plan: Plan, cause: str,
                make_before_break: bool | None = None, reason: str = "requested",
                direction: str | None = None) -> dict[str, Any]:
        """Move the loaded `name` to `plan` while its streams run (Engine.migrate): the
        Engine object its leases hold stays, its worker is swapped underneath. Make
        before break when old + new fit the budget (None: decided here), else pause,
        save, reload, restore; a make-before-break whose load fails is retried the
        other way. New leases wait for the switch (the model is "moving"); streams in
        flight go on. Records a "migration" event (cause, plans, pause, duration) and
        counts it in `migrations_by[(reason, direction)]` and its sequence-state bytes in
        `migration_bytes[direction]` (direction None: `migration_direction`).
        UsageError when the model is not loaded or its engine cannot migrate."""
        resolved = self._resolve(name).name
        with self._load_lock:
            now = self.budget.now()  # file and /proc reads: never under `_lock`
            with self._lock:
                lm = self._models.get(resolved)
                if lm is None or lm.tier != HOT or not hasattr(lm.engine, "migrate"):
                    raise UsageError(f"'{name}' is not a hot model that can migrate")
                self._moving.add(lm.model.name)
                if make_before_break is None:
                    ours = used_by(self._models.values())
                    make_before_break = not shortfall(ours, plan.charge(),
                                                      self.budget.capacity(ours, now))
            before = lm.plan
            try:
                # seen at once (monitor, /api/events): the "migration" event comes at the end
                events.add("migrating", lm.model.name, cause=cause,
                           plan_before=before.summary(), plan_after=plan.summary(),
                           make_before_break=make_before_break)
                params = plan.params().per_sequence()
                migrate = lm.engine.migrate
                try:
                    info = migrate(params, self.slots, make_before_break=make_before_break)
                except InferenceOSError:
                    if not make_before_break:
                        raise
                    make_before_break = False  # no room for both after all
                    info = migrate(params, self.slots, make_before_break=False)
                with self._lock:
                    lm.plan = plan
                    lm.reason = f"migrated ({cause}); {plan.summary()}"
                    self.migrations_total += 1
                    way = direction or migration_direction(before, plan)
                    self.migrations_by[reason, way] = self.migrations_by.get((reason, way), 0) + 1
                    self.migration_bytes[way] = (self.migration_bytes.get(way, 0)
                                                 + int(info.get("kv_bytes") or 0))
            finally:
                self._moving.discard(lm.model.name)
        detail = {
            "cause": cause, "plan_before": before.summary(), "plan_after": plan.summary(),
            "charge_before": before.charge(), "charge_after": plan.charge(),
            "pause_s": info.get("pause_s"), "duration_s": info.get("seconds"),
            "make_before_break": make_before_break, "moved": info.get("moved"),
            "restored": info.get("restored"), "reprefilled": info.get("reprefilled"),
        }
        _record("migration", lm.model, **detail)
        return {**info, **detail}

    # -- unloading ---------------------------------------------------------------------

    def unload(self, name: str) -> bool:
        """Unload `name` now if idle, else as soon as its last lease ends. False if it
        was not loaded."""
        model = self._resolve(name)
        with self._lock:
            lm = self._models.get(model.name)
            if lm is None:
                return False
            lm.keep_alive, lm.pinned = 0, False
            if lm.refs > 0:
                lm.expires_at = None
                return True
            del self._models[model.name]
        self._close(lm, "unload")
        return True

    def reap(self) -> int:
        """Unload every idle model whose keep-alive has passed; return how many."""
        now = self._clock()
        with self._lock:
            due = [m for m in self._models.values()
                   if m.refs == 0 and m.expires_at is not None and m.expires_at <= now
                   and m.model.name not in self._moving]
            for m in due:
                del self._models[m.model.name]
        for m in due:
            self._close(m, "expired")
        return len(due)

    def _drop(self, lm: ResidentModel, reason: str) -> None:
        with self._lock:
            self._models.pop(lm.model.name, None)
        self._close(lm, reason)

    def _close(self, lm: ResidentModel, reason: str) -> None:
        with self._lock:
            self.evictions_total[reason] = self.evictions_total.get(reason, 0) + 1
        lm.tier = COLD
        lm.engine.close()

    # -- views -------------------------------------------------------------------------

    def is_moving(self, name: str) -> bool:
        """Whether `name` (a loaded model's resolved name) is being migrated, demoted,
        promoted or resized now: its worker is busy with that, not with requests."""
        return name in self._moving

    def loaded(self) -> list[ResidentModel]:
        """A snapshot of the loaded (hot and warm) models."""
        with self._lock:
            return list(self._models.values())

    def pin(self, name: str) -> None:
        """Keep `name` hot once loaded: never demoted, never expired."""
        resolved = self._resolve(name).name
        with self._lock:
            self._pinned_names.add(resolved)
            if resolved not in self._pin_order:
                self._pin_order.append(resolved)
            if resolved in self._models:
                self._models[resolved].pinned = True

    def load_pinned(self, on_start: Callable[[str], None] | None = None) -> list[str]:
        """Load every pinned model now, in the order given (what `serve --pin` does
        before it answers, so no request pays the load); the names loaded. Raises what
        `acquire` raises for the first one that cannot be loaded (those loaded before it
        stay loaded)."""
        names = [n for n in self._pin_order if n in self._pinned_names]
        for name in names:
            if on_start is not None:
                on_start(name)
            self.acquire(name).release()
        return names

    def ps(self) -> list[dict[str, Any]]:
        """What `inferenceos ps --json` shows per loaded model."""
        now = self._clock()
        out = []
        for lm in self.loaded():
            exp = lm.expires_wall(now) if not lm.pinned else None
            out.append({
                "name": lm.model.name, "state": lm.tier, "pinned": lm.pinned,
                "memory_by_device": lm.charge, "size": lm.memory_bytes,
                "size_vram": lm.vram_bytes, "context_length": lm.n_ctx, "slots": lm.slots,
                "expires_at": exp, "in_use": lm.refs, "reason": lm.reason,
                "kv_cache_ram": lm.kv_cache_ram,
            })
        return out

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


def _key(req: LoadRequest) -> tuple[Any, ...]:
    """What identifies a loaded configuration: the context first (a resize can change
    it), then everything that needs a reload."""
    return (req.n_ctx, req.n_batch, req.threads, req.gpu_layers, req.backend, req.type_k,
            req.type_v, req.flash_attn, req.n_seq)


def _stale(lm: ResidentModel) -> bool:
    """A model whose worker died while its plan used remote (RPC) devices: restarting
    it on the same plan would fail again, so it is planned anew (without the worker
    that was lost, or refused with the reason)."""
    remote = any(d.startswith("RPC[") for d in lm.plan.memory.by_device)
    return remote and not getattr(lm.engine, "worker_alive", True)


def _call_tier(engine: EngineClient, verb: str) -> None:
    """engine.sleep() / engine.wake() when the engine has tiers (fakes may not)."""
    fn = getattr(engine, verb, None)
    if fn is not None:
        fn()


def _record(kind: str, model: ResolvedModel, **detail: Any) -> None:
    """A telemetry event (and one in this process's recent events); recording never
    fails a load."""
    events.add(kind, model.name, **detail)
    with contextlib.suppress(Exception):
        telemetry.recorder().event(kind, model.path, digest=model.digest or None,
                                   name=model.name, **detail)


def _record_load(model: ResolvedModel, load_s: float, plan: Plan, engine: EngineClient) -> None:
    with contextlib.suppress(Exception):  # recording never fails a load
        telemetry.recorder().load(model.path, source="server", load_s=load_s,
                                  digest=model.digest or None, name=model.name,
                                  memory=getattr(engine, "memory_buffers", None),
                                  settings=asdict(plan.params()), plan=plan.to_json())


def migration_direction(before: Plan, after: Plan) -> str:
    """"down" when `after` holds fewer bytes in all than `before`, "up" when more, else
    "same" (the label of a migration nobody named a direction for)."""
    old, new = sum(before.charge().values()), sum(after.charge().values())
    return "down" if new < old else "up" if new > old else "same"
