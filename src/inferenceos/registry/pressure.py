"""The reaction to memory pressure: migrate a model down when a device fills up (or
its cap is lowered) and back up when the memory has returned for the dwell time.

The signal per device d (a fraction; the sensor in hardware.pressure gives free and
total bytes, the budget gives caps):

    signal_d = max(1 - free_d / total_d,  high * ours_d / cap_d)

i.e. how full the device is, and how far our models are over its cap (ours == cap
reads as the high watermark). Each device has a `Hysteresis` (high / low watermarks,
dwell), so a noisy or oscillating signal causes at most one migration per dwell.

A cap is an order, not a noisy signal: the tick after a cap is set, changed or lifted
(`order()` wakes the reactor for it at once) acts on it without the dwell: down when
our models hold more than the cap allows on the device, up when the device is pressured
and the signal with its models back would be at or below the low watermark. Each cap is
acted on once; measured pressure keeps the hysteresis, and after an ordered step the
next measured transition still waits a dwell.

Down: the model holding most on the pressured device is re-planned by the manager's
planner (the one entry point) on a machine whose device d offers only what leaves the
device between the watermarks; everything else the planner may change (fewer layers on
d, quantized KV, a smaller context). A plan that holds no less on d is no help and is
not applied. The model's preferred plan is remembered.

Up: while pressured, the signal fed to the hysteresis is the one the preferred plan
would produce; once it has stayed at or below the low watermark for the dwell time, the
model migrates back to its preferred plan.

Every decision is an event (registry.events and telemetry): "pressure" (a transition
and what was done), "migration" (by the manager).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from inferenceos.errors import InferenceOSError
from inferenceos.hardware.pressure import DOWN, UP, Hysteresis, PressureSensor, Sample
from inferenceos.plan.devices import Machine, with_workers
from inferenceos.plan.plan import Plan
from inferenceos.registry import events
from inferenceos.registry.leases import HOT, ResidentModel
from inferenceos.registry.manager import ModelManager
from inferenceos.registry.tiers import used_by
from inferenceos.units import format_bytes

DEFAULT_HIGH, DEFAULT_LOW, DEFAULT_DWELL_S = 0.95, 0.85, 10.0


@dataclass
class Degraded:
    """A model moved down: its preferred plan, and the device that pushed it."""

    preferred: Plan
    device: str
    since: float


@dataclass
class PressureReactor:
    """Watches `sensor` every `interval_s` and migrates `manager`'s models (module doc)."""

    manager: ModelManager
    sensor: PressureSensor
    high: float = DEFAULT_HIGH
    low: float = DEFAULT_LOW
    dwell_s: float = DEFAULT_DWELL_S
    interval_s: float = 1.0
    clock: Callable[[], float] = time.monotonic
    marks: dict[str, Hysteresis] = field(default_factory=dict)
    degraded: dict[str, Degraded] = field(default_factory=dict)
    migrations: int = 0
    last: dict[str, float] = field(default_factory=dict)  # device → last signal
    _obeyed: dict[str, int | None] = field(default_factory=dict)  # device → cap acted on
    _stop: threading.Event = field(default_factory=threading.Event)
    _wake: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    # -- the signal ------------------------------------------------------------------------

    def signals(self, sample: Sample, ours: dict[str, int],
                swap: tuple[str, dict[str, int], dict[str, int]] | None = None,
                ) -> dict[str, float]:
        """signal per device; `swap` = (model, its charge now, another charge) predicts
        the signals with that model holding the other charge instead."""
        caps = self.manager.budget.caps
        names = set(sample.devices) | set(caps)
        out = {}
        for d in names:
            mem = sample.devices.get(d)
            held, free = ours.get(d, 0), mem.free_bytes if mem else 0
            if swap is not None:
                delta = swap[2].get(d, 0) - swap[1].get(d, 0)
                held, free = held + delta, free - delta
            fill = 1 - free / mem.total_bytes if mem and mem.total_bytes else 0.0
            out[d] = max(fill, _cap_term(self.high, held, caps.get(d)))
        return out

    # -- one tick ----------------------------------------------------------------------------

    def tick(self, now: float | None = None) -> list[dict[str, Any]]:
        """Sample, update every device's hysteresis, migrate where a transition fired;
        returns what was done (one dict per action)."""
        now = self.clock() if now is None else now
        sample = self.sensor.sample()
        models = [m for m in self.manager.loaded() if m.tier == HOT]
        loaded = {m.model.name for m in self.manager.loaded()}
        for name in [n for n in self.degraded if n not in loaded]:
            del self.degraded[name]  # unloaded since: a new load gets its own plan
        ours = used_by(models)
        sig = self.signals(sample, ours)
        self.last = sig
        done = []
        # a pressured device that is no longer measured (its cap lifted, a source gone)
        # reads as no pressure: its models may go back up after the dwell
        calm = {d: 0.0 for d, m in self.marks.items() if m.pressured and d not in sig}
        for dev, value in {**sig, **calm}.items():
            mark = self.marks.setdefault(dev, Hysteresis(self.high, self.low, self.dwell_s))
            if mark.pressured:
                value = self._up_signal(dev, sample, ours, models, value)
            ordered = self._ordered(dev, mark, ours, value, now)
            step = ordered or mark.update(value, now)
            if step == DOWN:
                cause = self._cause(dev, ours, value) if ordered else None
                done.append(self._down(dev, sample, ours, models, value, now, cause))
            elif step == UP:
                done.append(self._up(dev, value, now, ordered is not None))
        return done

    def _ordered(self, dev: str, mark: Hysteresis, ours: dict[str, int], value: float,
                 now: float) -> str | None:
        """The step a cap set, changed or lifted since the last tick orders on `dev`, at
        once (module doc): DOWN when our models hold at least the cap, UP when `dev` is
        pressured and `value` (the signal with its degraded models back) is at or below
        the low watermark; None when the cap is the one already acted on, or orders
        neither (the hysteresis then decides, as for measured pressure)."""
        cap = self.manager.budget.caps.get(dev)
        if self._obeyed.get(dev) == cap:
            return None
        self._obeyed[dev] = cap
        if _cap_term(self.high, ours.get(dev, 0), cap) >= self.high:
            mark.force(True, now)
            return DOWN
        if mark.pressured and value <= self.low:
            mark.force(False, now)
            return UP
        return None

    def _cause(self, dev: str, ours: dict[str, int], value: float) -> str:
        """Why an ordered step down: the cap, and what our models hold over it."""
        cap = self.manager.budget.caps.get(dev, 0)
        return (f"pressure on {dev} (a cap of {format_bytes(cap)}; our models hold "
                f"{format_bytes(ours.get(dev, 0))})")

    def _up_signal(self, dev: str, sample: Sample, ours: dict[str, int],
                   models: list[ResidentModel], value: float) -> float:
        """While pressured: the signal if every model degraded for `dev` went back."""
        for m in models:
            d = self.degraded.get(m.model.name)
            if d is not None and d.device == dev:
                pred = self.signals(sample, ours, (m.model.name, m.charge, d.preferred.charge()))
                value = max(value, pred.get(dev, 0.0))
        return value

    def _down(self, dev: str, sample: Sample, ours: dict[str, int],
              models: list[ResidentModel], value: float, now: float,
              cause: str | None = None) -> dict[str, Any]:
        """Migrate the model holding most on `dev` to its next placement down (the
        first that helps); `cause`: what the events say (None: the measured signal)."""
        victims = sorted((m for m in models if m.charge.get(dev, 0) > 0),
                         key=lambda m: -m.charge.get(dev, 0))
        cause = cause or f"pressure on {dev} ({value:.0%} ≥ {self.high:.0%})"
        for lm in victims:
            plan = self._plan_down(lm, dev, sample, ours)
            if plan is None:
                continue
            before = lm.plan
            try:
                info = self.manager.migrate(lm.model.name, plan, cause,
                                            self._room_for_both(plan, sample, ours),
                                            self._why(dev, sample, ours), "down")
            except InferenceOSError as exc:
                events.add("pressure", lm.model.name, device=dev, signal=value,
                           action="migration failed", error=str(exc))
                continue
            # a second step down keeps the first preferred plan: up goes all the way back
            self.degraded.setdefault(lm.model.name, Degraded(before, dev, now))
            self.migrations += 1
            return {"device": dev, "action": "down", "model": lm.model.name, **info}
        events.add("pressure", "", device=dev, signal=value,
                   action="no smaller placement helps")
        return {"device": dev, "action": "none"}

    def _up(self, dev: str, value: float, now: float, ordered: bool = False) -> dict[str, Any]:
        """Migrate a model degraded for `dev` back to its preferred plan; `ordered`: a
        cap raised or lifted made room (no dwell was waited)."""
        for name, d in list(self.degraded.items()):
            if d.device != dev:
                continue
            below = f"{value:.0%} ≤ {self.low:.0%}"
            cause = (f"the cap on {dev} raised ({below})" if ordered
                     else f"pressure on {dev} gone for {self.dwell_s:g} s ({below})")
            sample = self.sensor.last
            both = sample is not None and self._room_for_both(
                d.preferred, sample, used_by(self.manager.loaded()))
            try:
                info = self.manager.migrate(name, d.preferred, cause, both, "recovered", "up")
            except InferenceOSError as exc:
                events.add("pressure", name, device=dev, action="migration up failed",
                           error=str(exc))
                self.marks[dev].force(True, now)  # still down: try again after a dwell
                return {"device": dev, "action": "none", "error": str(exc)}
            del self.degraded[name]
            self.migrations += 1
            return {"device": dev, "action": "up", "model": name, **info}
        return {"device": dev, "action": "none"}

    def _why(self, dev: str, sample: Sample, ours: dict[str, int]) -> str:
        """What pushed `dev` over: "cap" when our models' share of its cap is the larger
        term of the signal, else "memory" (the device itself filled up)."""
        caps, mem = self.manager.budget.caps, sample.devices.get(dev)
        fill = 1 - mem.free_bytes / mem.total_bytes if mem and mem.total_bytes else 0.0
        cap = caps.get(dev)
        if cap is None:
            return "memory"
        over = self.high * ours.get(dev, 0) / cap if cap > 0 else float("inf")
        return "cap" if over >= fill else "memory"

    def _room_for_both(self, plan: Plan, sample: Sample, ours: dict[str, int]) -> bool:
        """Make before break only if the new placement fits beside the old one on every
        device as sampled now (and under its cap); else pause, save, reload, restore."""
        caps = self.manager.budget.caps
        for d, b in plan.charge().items():
            mem = sample.devices.get(d)
            if mem is not None and b > mem.free_bytes:
                return False
            if d in caps and ours.get(d, 0) + b > caps[d]:
                return False
        return True

    # -- planning down ---------------------------------------------------------------------

    def _plan_down(self, lm: ResidentModel, dev: str, sample: Sample,
                   ours: dict[str, int]) -> Plan | None:
        """The next placement down for `lm`: what the planner makes of a machine where
        `dev` leaves the device between the watermarks; None when it holds no less."""
        mid = (self.high + self.low) / 2
        mem = sample.devices.get(dev)
        give = 0.0
        if mem is not None and mem.total_bytes:
            give = max(give, (1 - mid) * mem.total_bytes - mem.free_bytes)
        cap = self.manager.budget.caps.get(dev)
        if cap is not None:
            give = max(give, ours.get(dev, 0) - cap * mid / self.high)
        now_on_dev = lm.charge.get(dev, 0)
        target = int(now_on_dev - give)
        if target <= 0 and dev == "CPU":
            return None  # the CPU always holds something: nothing smaller can fit
        machine = self._machine(lm, dev, max(0, target), sample)
        mgr = self.manager
        model = lm.model
        req, _ = mgr.request_for(model, None)
        # the planner may shrink the context (unpinned), never below what the live
        # requests were promised (prompt + max_tokens, asked from the engine); below
        # that, the context is pinned and the planner degrades the rest (layers off the
        # device, KV type, ubatch)
        need = _live_need(lm)
        tries = [replace(req, n_ctx=0, need_tokens=0, rpc=())]
        if need:
            tries.append(replace(req, n_ctx=need, need_tokens=0, rpc=()))
        for ask in tries:
            try:
                plan = mgr._planner(model, ask, machine)
            except InferenceOSError:
                continue
            if plan.ctx.n_ctx // max(1, mgr.slots) < need:
                continue
            if plan.params() == lm.plan.params():
                continue  # the same placement under another estimate: no help
            if plan.charge().get(dev, 0) < now_on_dev and plan.charge().get(dev, 0) <= max(
                    target, 0):
                return plan
        return None

    def _machine(self, lm: ResidentModel, dev: str, target: int, sample: Sample) -> Machine:
        """The machine `lm` is re-planned on: the budget's view (with RPC workers), each
        device's memory as sampled plus what `lm` holds there, `dev` held to `target`."""
        mgr = self.manager
        others = used_by(m for m in mgr.loaded() if m.model.name != lm.model.name)
        machine = mgr.budget.machine(others)
        if mgr.base.rpc:
            machine = mgr.budget.cap_machine(with_workers(machine, mgr.base.rpc))
        devices = []
        for d in machine.devices:
            mine = lm.charge.get(d.name, 0)
            mem = sample.devices.get(d.name)
            room = d.memory_bytes if mem is None else min(d.memory_bytes, mem.free_bytes + mine)
            if d.name == dev:
                room = min(room, target)
            devices.append(replace(d, memory_bytes=max(0, room)))
        return replace(machine, devices=tuple(devices))

    # -- lifetime ------------------------------------------------------------------------

    def start(self) -> None:
        """Tick on a daemon thread until `stop()`: at once (so the operations routes
        have a sample to read from the start), then every `interval_s`, and as soon as
        `order()` is called."""
        def loop() -> None:
            while not self._stop.is_set():
                if self.manager._closed:  # the server is shutting down
                    return
                self._wake.clear()  # before the tick: an order during it ticks again
                try:
                    self.tick()
                except Exception as exc:  # a sensor or plan bug must not stop watching
                    events.add("pressure", "", action="tick failed", error=repr(exc))
                self._wake.wait(self.interval_s)

        self._thread = threading.Thread(target=loop, name="pressure-reactor", daemon=True)
        self._thread.start()

    def order(self) -> None:
        """A cap was set, changed or lifted: tick now rather than at the next interval
        (a tick in progress is followed by another at once)."""
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def state(self) -> dict[str, Any]:
        """For /api/budget and the monitor: signals, watermarks, who is degraded. Read
        from another thread while the reactor ticks: each dict is copied first (one
        C-level step under the GIL), never iterated while the tick may change it."""
        marks, degraded = dict(self.marks), dict(self.degraded)
        return {
            "high": self.high, "low": self.low, "dwell_s": self.dwell_s,
            "signals": dict(self.last),
            "pressured": [d for d, m in marks.items() if m.pressured],
            "degraded": {n: d.device for n, d in degraded.items()},
            "migrations": self.migrations,
        }


def _cap_term(high: float, held: int, cap: int | None) -> float:
    """The cap's term of a device's signal: `high` × held / cap (ours == cap reads as
    the high watermark); a cap of 0 with anything held is infinitely over; no cap, 0."""
    if cap is None:
        return 0.0
    if cap > 0:
        return high * held / cap
    return float("inf") if held > 0 else 0.0


def _live_need(lm: ResidentModel) -> int:
    """Context per sequence the requests live on `lm` were promised; an engine that
    cannot say keeps its context (0 only when it says nothing is live)."""
    ask = getattr(lm.engine, "live_need", None)
    if ask is None:
        return lm.n_ctx if lm.refs else 0
    try:
        return int(ask())
    except Exception:  # a dead worker: keep the context, to be safe
        return lm.n_ctx
