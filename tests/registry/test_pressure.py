"""Memory pressure: the sensor's hysteresis (no flapping), the reactor that migrates a
model down and back up, and a greedy stream that lives through both token-identically.

The pressure signal is injected (PressureSensor.inject: the test hook); the engine,
planner and manager are real (tiny model, real worker processes)."""

from __future__ import annotations

import itertools
import threading
from pathlib import Path
from typing import Any

import pytest

from inferenceos.engine.engine import Engine
from inferenceos.engine.sampling import SamplingParams
from inferenceos.hardware.pressure import DOWN, UP, Hysteresis, PressureSensor
from inferenceos.plan.entry import LoadRequest
from inferenceos.plan.llama_params import LlamaParams
from inferenceos.registry import events
from inferenceos.registry.budget import MemoryBudget
from inferenceos.registry.catalog import ResolvedModel
from inferenceos.registry.manager import ModelManager, engine_factory
from inferenceos.registry.pressure import PressureReactor
from plan_factories import GiB, machine

# long enough on the wide model to outlive a worker load or two (a few hundred t/s)
LONG = SamplingParams(temperature=0, max_tokens=1000, ignore_eos=True)


@pytest.fixture(scope="module")
def wide(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model slow enough that a stream outlives a worker load (~25 MB)."""
    from tiny_models import write_tiny_model

    return write_tiny_model(tmp_path_factory.mktemp("wide") / "wide.gguf", "wide")


# -- hysteresis ------------------------------------------------------------------------


def test_hysteresis_needs_the_dwell_on_one_side() -> None:
    h = Hysteresis(high=0.9, low=0.7, dwell_s=5)
    assert h.update(0.95, 0) is None and h.update(0.95, 4.9) is None
    assert h.update(0.95, 5) == DOWN and h.pressured
    assert h.update(0.8, 6) is None  # between the marks: stays pressured
    assert h.update(0.6, 11) is None and h.update(0.6, 15.9) is None
    assert h.update(0.6, 16) == UP and not h.pressured


@pytest.mark.parametrize("period", [0.5, 2.0, 7.0, 13.0])
def test_an_oscillating_signal_makes_at_most_one_transition_per_dwell(period: float) -> None:
    """A square wave around the high watermark, sampled every 0.1 s for 120 s."""
    dwell = 5.0
    h = Hysteresis(high=0.9, low=0.7, dwell_s=dwell)
    times = []
    for i in range(1200):
        t = i * 0.1
        value = 0.95 if (t // (period / 2)) % 2 == 0 else 0.85  # never reaches low
        if h.update(value, t):
            times.append(t)
    assert len(times) <= 1  # around the high mark only: in once, never out
    if period / 2 < dwell:
        assert times == []  # never above for a whole dwell


def test_an_oscillation_across_both_marks_is_limited_by_the_dwell() -> None:
    dwell = 5.0
    h = Hysteresis(high=0.9, low=0.7, dwell_s=dwell)
    times = []
    for i in range(2400):
        t = i * 0.1
        value = 0.95 if (t // 6) % 2 == 0 else 0.5  # 6 s on each side
        if h.update(value, t):
            times.append(t)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert times and all(g >= dwell for g in gaps)
    assert len(times) <= 240 / dwell


def test_the_sensor_injects_and_lifts_a_signal() -> None:
    from inferenceos.hardware.pressure import DeviceMemory

    sensor = PressureSensor([lambda: {"CPU": DeviceMemory(800, 1000)}])
    assert sensor.sample().devices["CPU"].free_bytes == 800
    sensor.inject("CPU", 10)
    s = sensor.sample()
    assert s.devices["CPU"] == DeviceMemory(10, 1000) and s.injected == {"CPU"}
    sensor.inject("CPU", None)
    assert sensor.sample().devices["CPU"].free_bytes == 800


def test_a_broken_source_does_not_blind_the_others() -> None:
    from inferenceos.hardware.pressure import DeviceMemory

    def broken() -> dict[str, DeviceMemory]:
        raise OSError("gone")

    sensor = PressureSensor([broken, lambda: {"CPU": DeviceMemory(1, 2)}])
    assert set(sensor.sample().devices) == {"CPU"}


def test_the_ram_source_reads_this_machine() -> None:
    from inferenceos.hardware.pressure import ram_source

    cpu = ram_source()["CPU"]
    assert 0 < cpu.free_bytes <= cpu.total_bytes


# -- the reactor on a real manager ---------------------------------------------------------


def _manager(tiny: Path, factory: Any = None) -> ModelManager:
    def resolve(name: str) -> ResolvedModel:
        return ResolvedModel("tiny:latest", tiny, "0" * 64, tiny.stat().st_size, "llama",
                             "F32", 1, 8192, 0.0)

    budget = MemoryBudget(machine=lambda: machine(ram=8 * GiB, threads=1))
    base = LoadRequest(n_ctx=4096, threads=1, n_batch=64, type_k="f16", type_v="f16")
    return ModelManager(resolve, factory or engine_factory(), budget=budget, base=base,
                        context_hint=None)


def _undisturbed(tiny: Path, settings: LlamaParams, prompt: str) -> list[int]:
    with Engine(tiny, settings.per_sequence(), n_parallel=1) as engine:
        return [e.token for e in engine.generate(prompt, LONG)]


def test_a_stream_migrates_down_and_back_up_under_an_injected_signal(wide: Path) -> None:
    """Done-when: greedy generation migrating down and back up mid-stream gives exactly
    the undisturbed run's tokens, no request fails, both migrations are recorded."""
    mgr = _manager(wide)
    sensor = PressureSensor([])
    reactor = PressureReactor(mgr, sensor, high=0.95, low=0.85, dwell_s=0.2)
    first_event = events.EVENTS.last_id
    try:
        lease = mgr.acquire("tiny")
        preferred = lease.loaded.plan
        want = _undisturbed(wide, preferred.params(), "ab cab")
        cpu = lease.loaded.charge["CPU"]
        total = int(cpu * 1.5)
        sensor.inject("CPU", total - cpu, total)  # we fill the device to 67 %: calm
        assert reactor.tick(0.0) == []
        got: list[int] = []
        gen = lease.engine.generate("ab cab", LONG)
        it = iter(gen)
        got += [next(it).token for _ in range(5)]
        failed: list[BaseException] = []

        def read() -> None:
            try:
                got.extend(e.token for e in it)
            except BaseException as exc:  # the test asserts there is none
                failed.append(exc)

        reader = threading.Thread(target=read)
        reader.start()
        sensor.inject("CPU", 0, total)  # something else takes the rest: 100 %
        assert reactor.tick(1.0) == []  # the dwell has not passed
        down = reactor.tick(1.3)
        assert [d["action"] for d in down] == ["down"], down
        degraded = lease.loaded.plan
        assert degraded.charge()["CPU"] < cpu
        # the planner's step down on this CPU-only machine: a smaller context, still
        # holding what the live stream was promised (prompt + max_tokens: the optimizer
        # keeps f16 at exactly that, where the ladder halved to 2048 and quantized)
        assert LONG.max_tokens < degraded.ctx.n_ctx < preferred.ctx.n_ctx
        sensor.inject("CPU", total, total)  # the other program is gone
        assert reactor.tick(2.0) == []
        up = reactor.tick(2.3)
        assert [d["action"] for d in up] == ["up"], up
        assert lease.loaded.plan is preferred
        reader.join(120)
        lease.release()
    finally:
        mgr.close()
    assert not failed
    assert got == want  # not one token lost, repeated or changed
    assert gen.metrics.stop_reason == "length"
    assert down[0]["moved"] == 1 and up[0]["moved"] == 1, (down, up)
    migrations = events.EVENTS.since(first_event, "migration")
    assert len(migrations) == 2 and mgr.migrations_total == 2
    assert migrations[0]["cause"].startswith("pressure on CPU")
    assert "gone" in migrations[1]["cause"]
    for m in migrations:
        assert m["plan_before"] != m["plan_after"] and m["pause_s"] > 0 and m["duration_s"] > 0


class CountingEngine:
    """A fake engine that counts migrations (the oscillation test needs no tokens)."""

    def __init__(self, path: Path, params: LlamaParams, slots: int) -> None:
        self.n_ctx, self.load_s, self.migrated = params.n_ctx, 0.0, 0

    def migrate(self, settings: LlamaParams, n_parallel: int | None = None,
                make_before_break: bool = True) -> dict[str, Any]:
        self.migrated += 1
        return {"pause_s": 0.001, "seconds": 0.002, "moved": 0}

    def live_need(self) -> int:
        return 0  # nothing streams on a fake

    def close(self) -> None:
        pass


def test_an_oscillating_signal_migrates_at_most_once_per_dwell(tiny_llama: Path) -> None:
    mgr = _manager(tiny_llama, factory=CountingEngine)
    sensor = PressureSensor([])
    dwell = 3.0
    reactor = PressureReactor(mgr, sensor, high=0.95, low=0.85, dwell_s=dwell)
    try:
        lease = mgr.acquire("tiny")
        cpu = lease.loaded.charge["CPU"]
        total = cpu * 4
        times = []
        for i in range(600):  # 60 s at 10 Hz; the device flips between 99 % and 30 %
            t = i * 0.1
            full = (t // 2) % 2 == 0  # every 2 s
            sensor.inject("CPU", total // 100 if full else total * 7 // 10, total)
            if any(d["action"] in ("down", "up") for d in reactor.tick(t)):
                times.append(t)
        lease.release()
    finally:
        mgr.close()
    assert lease.engine.migrated == len(times)  # type: ignore[attr-defined]
    assert len(times) <= 60 / dwell
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert all(g >= dwell for g in gaps), times


def test_a_lowered_cap_is_an_order_obeyed_at_once(wide: Path) -> None:
    """A cap below what the model holds migrates it down at the next tick, without the
    dwell (an order, not a noisy signal), and only once; lifting it moves the model
    back up at the next tick. Measured pressure still waits the dwell afterwards."""
    mgr = _manager(wide, factory=CountingEngine)
    sensor = PressureSensor([])
    reactor = PressureReactor(mgr, sensor, dwell_s=1000.0)
    first = events.EVENTS.last_id
    try:
        lease = mgr.acquire("tiny")
        cpu = lease.loaded.charge["CPU"]
        mgr.budget.set_cap("CPU", int(cpu * 0.8))
        down = reactor.tick(0)
        assert [d["action"] for d in down] == ["down"]
        assert down[0]["cause"].startswith("pressure on CPU (a cap of ")
        assert lease.loaded.charge["CPU"] <= cpu * 0.8
        assert reactor.tick(0.5) == []  # acted on once
        mgr.budget.set_cap("CPU", None)
        up = reactor.tick(1.0)
        assert [d["action"] for d in up] == ["up"]
        assert lease.loaded.charge["CPU"] == cpu
        sensor.inject("CPU", 0, 8 * GiB)  # the device measured full: that waits the dwell
        assert reactor.tick(2.0) == [] and reactor.tick(500.0) == []
        lease.release()
    finally:
        mgr.close()
    kinds = [e["kind"] for e in events.EVENTS.since(first) if e["kind"].startswith("migr")]
    assert kinds == ["migrating", "migration"] * 2  # each shown as it starts, then done


def test_no_smaller_placement_is_an_event_not_an_error(tiny_llama: Path) -> None:
    mgr = _manager(tiny_llama, factory=CountingEngine)
    sensor = PressureSensor([])
    reactor = PressureReactor(mgr, sensor, dwell_s=0.0)
    first = events.EVENTS.last_id
    try:
        lease = mgr.acquire("tiny")
        mgr.budget.set_cap("CPU", 1)  # nothing fits one byte
        done = reactor.tick(0)
        assert [d["action"] for d in done] == ["none"]
        assert events.EVENTS.since(first, "pressure")
        assert lease.engine.migrated == 0  # type: ignore[attr-defined]
        lease.release()
    finally:
        mgr.close()
