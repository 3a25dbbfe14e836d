"""Real pressure on loopback: a model split across the local CPU and an RPC worker; the
worker's offered memory is capped while a stream runs; layers move to the local CPU
(the reactor's plan down), the stream survives with the undisturbed run's tokens, and
the model moves back when the cap is lifted."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from inferenceos.cluster.ggml import has_rpc
from inferenceos.cluster.probe import rpc_source
from inferenceos.cluster.spawn import free_port, spawn_worker, stop_worker
from inferenceos.engine.engine import Engine
from inferenceos.engine.sampling import SamplingParams
from inferenceos.hardware.pressure import PressureSensor
from inferenceos.plan.entry import LoadRequest
from inferenceos.registry import events
from inferenceos.registry.budget import MemoryBudget
from inferenceos.registry.catalog import ResolvedModel
from inferenceos.registry.manager import ModelManager
from inferenceos.registry.pressure import PressureReactor
from plan_factories import machine
from tiny_models import write_tiny_model

pytestmark = pytest.mark.skipif(not has_rpc(), reason="llama.cpp was built without RPC")

LONG = SamplingParams(temperature=0, max_tokens=2000, ignore_eos=True)  # outlives two re-plans


@pytest.fixture(scope="module")
def deep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("rpc-pressure") / "deep.gguf", "deep")


@pytest.fixture
def worker(tmp_path: Path) -> Any:
    port = free_port()
    proc = spawn_worker(port, mem="256MiB", threads=1, log=tmp_path / "worker.log")
    yield f"127.0.0.1:{port}"
    stop_worker(proc)


def test_capping_a_workers_memory_moves_layers_home_mid_stream(deep: Path,
                                                                worker: str) -> None:
    def resolve(name: str) -> ResolvedModel:
        return ResolvedModel("deep:latest", deep, "0" * 64, deep.stat().st_size, "llama",
                             "F32", 1, 512, 0.0)

    # local RAM is short at load time (so the planner splits the model onto the worker),
    # and has room later, when the worker's memory is taken back
    ram = {"now": 6 << 20}
    budget = MemoryBudget(machine=lambda: machine(ram=ram["now"], threads=1))
    # a context past the tiny model's training one, so the stream outlives the re-plan
    base = LoadRequest(n_ctx=2048, threads=1, n_batch=64, type_k="f16", type_v="f16",
                       rpc=(worker,), rope_scaling=True)
    mgr = ModelManager(resolve, budget=budget, base=base, context_hint=None)
    sensor = PressureSensor([rpc_source([worker])])
    # an hour's dwell: the caps below are orders, obeyed at the next tick all the same
    reactor = PressureReactor(mgr, sensor, dwell_s=3600.0)
    device = f"RPC[{worker}]"
    first = events.EVENTS.last_id
    got: list[int] = []
    failed: list[BaseException] = []
    try:
        planned = mgr.plan_for("deep")  # the undisturbed run first: one client a worker
        with Engine(deep, planned.params().per_sequence(), n_parallel=1) as alone:
            want = [e.token for e in alone.generate("ab cab", LONG)]
        lease = mgr.acquire("deep")
        before = lease.loaded.plan
        assert before.params() == planned.params()
        on_worker = before.charge().get(device, 0)
        assert on_worker > 0, before.summary()  # split: layers on the worker
        ram["now"] = 1 << 30
        assert reactor.tick(0.0) == []  # calm
        it = iter(lease.engine.generate("ab cab", LONG))
        got += [next(it).token for _ in range(3)]

        def read() -> None:
            try:
                got.extend(e.token for e in it)
            except BaseException as exc:
                failed.append(exc)

        reader = threading.Thread(target=read)
        reader.start()
        mgr.budget.set_cap(device, on_worker // 2)  # the worker offers half as much now
        down = reactor.tick(1.0)
        assert [d["action"] for d in down] == ["down"], down
        after = lease.loaded.plan
        assert after.charge().get(device, 0) <= on_worker // 2
        assert after.charge()["CPU"] > before.charge()["CPU"]  # the layers came home
        assert after.n_gpu_layers < before.n_gpu_layers
        mgr.budget.set_cap(device, None)
        up = reactor.tick(2.0)
        assert [d["action"] for d in up] == ["up"], up
        reader.join(120)
        lease.release()
    finally:
        mgr.close()
    assert not failed
    assert down[0]["moved"] == 1, down
    assert down[0]["ended"] == 0 and up[0]["moved"] == 1, (down, up)
    assert got == want  # the same CPU kernels on both sides of the link
    kinds = [e["kind"] for e in events.EVENTS.since(first)]
    assert kinds.count("migration") == 2
