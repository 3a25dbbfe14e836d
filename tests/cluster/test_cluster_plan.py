"""The planner with remote (RPC) devices, without any worker: placement and cost model."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from cluster_harness import injected_machine as _machine
from cluster_harness import rpc_device as _rpc
from inferenceos.plan.entry import LoadRequest, plan_load
from inferenceos.plan.model_facts import ModelFacts, load_model_facts
from inferenceos.plan.perf import Calibration, decode_cost
from inferenceos.plan.simulate import Workload, predict
from tiny_models import write_tiny_model

GB = 1 << 30


@pytest.fixture(scope="module")
def facts(tmp_path_factory: pytest.TempPathFactory) -> ModelFacts:
    path: Path = write_tiny_model(tmp_path_factory.mktemp("plan") / "deep.gguf", "deep")
    return load_model_facts(path)


REQ = LoadRequest(n_ctx=256)


def test_a_workers_cpu_is_not_used_when_the_model_fits_here(facts: ModelFacts) -> None:
    plan = plan_load(facts, _machine(GB, _rpc("a:1", GB), _rpc("b:1", GB)), REQ)
    assert set(plan.placement.dense) == {"CPU"} and plan.params().devices == ()


def test_workers_take_only_what_local_ram_cannot_hold(facts: ModelFacts) -> None:
    full = plan_load(facts, _machine(GB), REQ).memory.by_device["CPU"]
    layer = 1_050_000  # one layer of the deep model with its KV, roughly
    # (one layer short fits with a smaller ubatch: a slower prefill, not a visit per token)
    plan = plan_load(facts, _machine(full - 3 * layer, _rpc("a:1", GB), _rpc("b:1", GB)), REQ)
    remote = [d for d in plan.placement.dense if d != "CPU"]
    assert 1 <= len(remote) <= 3, plan.placement.dense  # the overflow, not everything
    assert plan.memory.by_device["CPU"] <= full - 3 * layer
    # the offloaded block is contiguous at the end, as llama.cpp's n_gpu_layers is
    assert plan.placement.dense[-len(remote):] == tuple(remote)


def test_a_workers_gpu_is_used_like_a_local_one(facts: ModelFacts) -> None:
    gpu = _rpc("g:1", GB, kind="gpu", gbps=900.0)
    plan = plan_load(facts, _machine(GB, gpu), REQ)
    assert all(d == gpu.name for d in plan.placement.dense)


def test_each_remote_split_costs_a_round_trip_per_token(facts: ModelFacts) -> None:
    ram = plan_load(facts, _machine(GB), REQ).memory.by_device["CPU"] - 3_000_000
    cal = Calibration()

    def cost(rtt: float) -> tuple[float, dict[str, float], object]:
        # each worker too small for the overflow alone: both are used
        m = _machine(ram, _rpc("a:1", 2 << 20, rtt=rtt), _rpc("b:1", 2 << 20, rtt=rtt))
        plan = plan_load(facts, m, REQ)
        c = decode_cost(facts, plan.placement, m, plan.ctx, 64, cal, plan.threads)
        return c.seconds, c.parts, plan

    base, parts, plan = cost(1e-4)
    assert {"link RPC[a:1]", "link RPC[b:1]"} <= set(parts)
    slow, parts5, _ = cost(5e-3 + 1e-4)
    assert slow - base == pytest.approx(2 * 5e-3, rel=0.01)  # two remote splits, one trip each
    assert max(parts5, key=lambda k: parts5[k]).startswith("link RPC[")  # the bottleneck
    pred = predict(facts, _machine(ram, _rpc("a:1", 4 << 20), _rpc("b:1", 4 << 20)), plan,
                   Workload(16, 8, 256), cal)
    assert {"RPC[a:1]", "RPC[b:1]"} <= set(pred.peak_memory)


def test_budget_caps_and_workers_reach_the_plan(facts: ModelFacts) -> None:
    from inferenceos.plan.devices import local_machine

    plan = plan_load(facts, local_machine(), replace(REQ, ram=10 << 20))
    assert plan.budgets["CPU"] == 10 << 20


def test_a_slow_link_is_named_as_the_bottleneck(facts: ModelFacts) -> None:
    ram = plan_load(facts, _machine(GB), REQ).memory.by_device["CPU"] - 3_000_000
    m = _machine(ram, _rpc("a:1", 4 << 20, rtt=0.02), _rpc("b:1", 4 << 20, rtt=0.02))
    plan = plan_load(facts, m, REQ)
    pred = predict(facts, m, plan, Workload(16, 8, 256), Calibration())
    assert pred.bottleneck.startswith("link RPC[")
    assert "round trips to RPC[" in pred.recommendation


def test_a_co_located_worker_costs_a_wake_up_per_visit(facts: ModelFacts) -> None:
    from inferenceos.plan.perf import RPC_COLOCATED_VISIT_S

    ram = plan_load(facts, _machine(GB), REQ).memory.by_device["CPU"] - 3_000_000
    cal = Calibration()

    def cost(here: bool) -> float:
        m = _machine(ram, replace(_rpc("a:1", 2 << 20), co_located=here),
                     replace(_rpc("b:1", 2 << 20), co_located=here))
        plan = plan_load(facts, m, REQ)
        assert {"RPC[a:1]", "RPC[b:1]"} <= set(plan.placement.dense)
        return decode_cost(facts, plan.placement, m, plan.ctx, 64, cal, plan.threads).seconds

    # two workers visited once per token: two wake-ups of processes sharing the cores
    assert cost(True) - cost(False) == pytest.approx(2 * RPC_COLOCATED_VISIT_S, rel=0.01)
    assert replace(_rpc("a:1", 1), co_located=True).to_json()["co_located"] is True


def test_workers_on_this_machine_are_recognised_by_the_kernel_boot_id() -> None:
    from inferenceos.cluster.info import LinkMeasure, RemoteDevice, WorkerInfo, host_id
    from inferenceos.cluster.probe import WorkerProbe
    from inferenceos.endpoint import Endpoint
    from inferenceos.plan.devices import _worker_devices

    assert len(host_id()) >= 32  # Linux: /proc/sys/kernel/random/boot_id
    dev = RemoteDevice(0, "CPU", "cpu", "cpu", GB, GB, GB)

    def probe(hid: str) -> WorkerProbe:
        info = WorkerInfo(rpc_port=5, devices=[dev], threads=2, host_id=hid)
        return WorkerProbe(Endpoint("10.0.0.2", 5), info, LinkMeasure(1e-4, 1.0, 0.0))

    notes: list[str] = []
    assert _worker_devices(probe(host_id()), notes)[0].co_located
    assert "runs on this machine" in notes[0]
    assert not _worker_devices(probe("another-host"), [])[0].co_located
    assert not _worker_devices(probe(""), [])[0].co_located  # an older worker: unknown


def test_openmp_threads_spin_briefly_unless_the_user_chose_how_they_wait() -> None:
    from inferenceos.hardware.openmp import SPIN_COUNT, USER_KNOBS, bounded_spin

    env: dict[str, str] = {}
    assert bounded_spin(env)
    assert env == {"GOMP_SPINCOUNT": SPIN_COUNT}
    for knob in USER_KNOBS:
        mine = {knob: "PASSIVE" if knob == "OMP_WAIT_POLICY" else "5"}
        before = dict(mine)
        assert not bounded_spin(mine)
        assert mine == before


def test_libgomp_takes_the_bounded_spin_count_when_llama_cpp_loads() -> None:
    """In a fresh process, loading llama.cpp through the engine sets the spin count
    before libgomp reads its environment (libgomp prints what it took)."""
    import os
    import subprocess
    import sys

    from inferenceos.hardware.openmp import SPIN_COUNT, USER_KNOBS

    env = {k: v for k, v in os.environ.items() if k not in USER_KNOBS}
    env["OMP_DISPLAY_ENV"] = "VERBOSE"
    code = "from inferenceos.engine.llama.lib import lib; lib()"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"GOMP_SPINCOUNT = '{SPIN_COUNT}'" in out.stderr
