"""Multi-node over llama.cpp's RPC backend, on loopback: two real `inferenceos worker`
processes, each offering less memory than the model needs, and a RAM cap here, so that
the planner must split the model over this machine and both workers."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli_helpers import run_cli
from cluster_harness import (
    RAM,
    RAM_ARG,
    WORKER_BYTES,
    Workers,
    injected_machine,
    rpc_device,
    worker_buffer_mib,
)
from inferenceos.cluster.info import host_id
from inferenceos.cluster.probe import probe_worker
from inferenceos.cluster.spawn import free_port, spawn_worker, stop_worker
from inferenceos.cluster.worker import WorkerConfig, check_bind
from inferenceos.endpoint import parse_endpoint, parse_endpoints
from inferenceos.errors import UsageError, WorkerDiedError
from tiny_models import write_tiny_model

N_CTX = 256


@pytest.fixture(scope="module")
def deep_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("cluster") / "deep.gguf", "deeper")


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Workers]:
    w = Workers(tmp_path_factory.mktemp("worker-logs"))
    try:
        yield w
    finally:
        w.close()


def _plan(model: Path, rpc: tuple[str, ...], ram: int | None = RAM):  # type: ignore[no-untyped-def]
    from inferenceos.plan.devices import local_machine
    from inferenceos.plan.entry import LoadRequest, plan_load
    from inferenceos.plan.model_facts import load_model_facts

    return plan_load(load_model_facts(model), local_machine(),
                     LoadRequest(n_ctx=N_CTX, rpc=rpc, ram=ram))


def _greedy(model: Path, params, n: int = 24) -> list[int]:  # type: ignore[no-untyped-def]
    from inferenceos.engine.sampling import SamplingParams
    from inferenceos.engine.scheduler import generate_one
    from inferenceos.engine.session import LoadedModel

    sp = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
    with LoadedModel(model, params) as lm:
        return [e.token for e in generate_one(lm, lm.tokenize("hello world"), sp)]


# -- addresses and the bind rule ------------------------------------------------------


def test_endpoints_parse_and_reject_clearly() -> None:
    eps = parse_endpoints(["10.0.0.2:50052,10.0.0.3:50052=8GiB", "10.0.0.2:50052"])
    assert [e.address for e in eps] == ["10.0.0.2:50052", "10.0.0.3:50052"]
    assert eps[1].mem_cap == 8 << 30 and eps[0].info_address == ("10.0.0.2", 50053)
    assert parse_endpoint("h:7/9000").info_address == ("h", 9000)
    for bad in ("nope", "h:0", "h:x", ":5", "h:5=lots"):
        with pytest.raises(UsageError):
            parse_endpoint(bad)


def test_worker_refuses_a_remote_bind_without_allow_remote() -> None:
    assert check_bind(WorkerConfig(host="127.0.0.1")) is None
    with pytest.raises(UsageError, match="--allow-remote"):
        check_bind(WorkerConfig(host="0.0.0.0"))
    warning = check_bind(WorkerConfig(host="0.0.0.0", allow_remote=True))
    assert warning and "neither authenticated nor encrypted" in warning
    r = run_cli("worker", "--host", "0.0.0.0", "--port", "50999")
    assert r.returncode == 2 and "refusing" in r.stderr and "Traceback" not in r.stderr


# -- what a worker offers ---------------------------------------------------------------


def test_worker_offers_its_capped_memory_and_a_measured_link(workers: Workers) -> None:
    ep = parse_endpoint(workers.addresses[0])
    first = probe_worker(ep)
    assert first.usable and first.info is not None and first.link is not None
    [dev] = first.info.devices
    assert dev.type == "cpu" and dev.offered_bytes == WORKER_BYTES < dev.memory_free_bytes
    assert first.info.threads == 1 and not first.info.busy
    assert first.info.host_id == host_id()  # a worker of this machine says so
    assert 0 < first.link.rtt_s < 0.05 and first.link.bandwidth_gbps > 0.01
    again = probe_worker(ep)
    assert again.link_cached and again.link == first.link  # measured once, then cached


def test_unreachable_worker_is_left_out_with_the_reason(deep_model: Path) -> None:
    dead = f"127.0.0.1:{free_port()}"
    plan = _plan(deep_model, (dead,), ram=None)
    assert plan.feasible and "RPC[" not in str(plan.placement.dense)
    assert any("unreachable" in c.why and dead in c.why for c in plan.changes)


# -- the planner splits, llama.cpp computes the same tokens -------------------------------


def test_plan_splits_over_both_workers(deep_model: Path, workers: Workers) -> None:
    plan = _plan(deep_model, workers.addresses)
    dense = plan.placement.dense
    assert dense.count("CPU") >= 1
    for name in workers.names():
        assert dense.count(name) >= 1, dense
    assert plan.params().devices == tuple(workers.names())
    assert sum(plan.params().tensor_split) == pytest.approx(1.0)
    # the whole model fits nowhere alone: RAM here and each worker hold less than it
    assert plan.memory.by_device["CPU"] <= RAM


def test_split_run_gives_the_local_greedy_tokens(deep_model: Path, workers: Workers) -> None:
    from inferenceos.engine.llama.lib import log

    split = _plan(deep_model, workers.addresses)
    mark = log().mark()
    tokens = _greedy(deep_model, split.params())
    buffers = " ".join(line for line in log().since(mark) if "model buffer size" in line)
    assert "RPC0" in buffers or "RPC" in buffers, buffers  # llama.cpp put weights remote
    local = _plan(deep_model, (), ram=None)
    assert local.placement.gpu_layers == 0
    assert tokens == _greedy(deep_model, local.params())


def test_a_disk_bound_plan_over_a_worker_runs_load_after_load(
    deep_model: Path, workers: Workers
) -> None:
    """CPU + one worker under the RAM cap: some weights stay on disk and the prefetch
    watches the layers as they compute. Its cb_eval once cut the worker's split of the
    graph too, which llama.cpp's RPC backend cannot compute: most loads died
    (GGML_ASSERT(buffer), or SIGSEGV). Now it watches only the CPU's layers."""
    from inferenceos.engine.engine import Engine
    from inferenceos.engine.sampling import SamplingParams
    from inferenceos.engine.session import LoadedModel
    from inferenceos.plan.entry import LoadRequest, plan_load
    from inferenceos.plan.model_facts import load_model_facts

    # the worker as a device with a fixed link: whether the cost model puts a layer on
    # the real worker follows its measured round trip, which a busy machine changes
    # (plan_load probes it); here the placement is fixed, the load and decode are real
    name = workers.names()[0]
    machine = injected_machine(RAM, rpc_device(workers.addresses[0], WORKER_BYTES))
    # a batch of 128: at 512 a layer's compute buffer (its FFN's three live copies, as
    # llama.cpp allocates them) alone fills the 3 MiB worker, and the plan keeps it idle
    plan = plan_load(load_model_facts(deep_model), machine, LoadRequest(n_ctx=N_CTX,
                                                                        n_batch=128))
    assert plan.disk_bound and name in plan.placement.dense, plan.changes
    sp = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    for _ in range(4):
        engine = Engine(deep_model, plan.params().per_sequence(), n_parallel=1)
        try:
            assert len(list(engine.generate("hello", sp).events)) == 8
        finally:
            engine.close()
    with LoadedModel(deep_model, plan.params()) as lm:
        streamer = lm._streamer
        cpu = [i for i, d in enumerate(plan.placement.dense) if d == "CPU"]
        assert streamer is not None and streamer.blocks == cpu and len(cpu) < 12


def test_simulate_reports_each_worker_as_a_tier(deep_model: Path, workers: Workers) -> None:
    import json

    r = run_cli("simulate", str(deep_model), "--rpc", ",".join(workers.addresses),
                "--ram", RAM_ARG, "--ctx", str(N_CTX), "--prompt-tokens", "16",
                "--output-tokens", "8", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    peak = data["peak_memory_bytes"]
    for name in workers.names():
        assert peak[name] > 0
    links = [k for k in data["decode_seconds_by_resource"] if k.startswith("link RPC[")]
    assert len(links) == 2


def test_run_cli_over_workers_matches_local(deep_model: Path, workers: Workers) -> None:
    args = ["run", str(deep_model), "--prompt", "hello", "--raw", "-n", "12",
            "--temperature", "0", "--ignore-eos", "--ctx", str(N_CTX), "--json"]
    split = run_cli(*args, "--rpc", ",".join(workers.addresses), "--ram", RAM_ARG)
    assert split.returncode == 0, split.stderr
    assert "RPC[" in split.stderr  # the plan line names the workers
    local = run_cli(*args)
    assert local.returncode == 0, local.stderr
    import json

    assert json.loads(split.stdout)["text"] == json.loads(local.stdout)["text"]


# -- one client at a time; failure mid-stream; a worker that comes back ------------------


def test_busy_worker_is_left_out(deep_model: Path, workers: Workers) -> None:
    from inferenceos.engine.session import LoadedModel

    plan = _plan(deep_model, workers.addresses)
    with LoadedModel(deep_model, plan.params()):
        time.sleep(0.3)  # /proc/net/tcp shows the connection
        probe = probe_worker(parse_endpoint(workers.addresses[0]))
        assert not probe.usable and "busy" in probe.error
        again = _plan(deep_model, workers.addresses, ram=None)
        assert all(name not in again.placement.dense for name in workers.names())
        assert any("busy" in c.why for c in again.changes)


def test_worker_lost_mid_stream_then_replanned_then_back(
    deep_model: Path, workers: Workers
) -> None:
    from inferenceos.engine.engine import Engine
    from inferenceos.engine.sampling import SamplingParams

    plan = _plan(deep_model, workers.addresses)
    sp = SamplingParams(temperature=0, max_tokens=100_000, ignore_eos=True)
    victim = workers.ports[1]
    engine = Engine(deep_model, plan.params().per_sequence(), n_parallel=1)
    try:
        gen = engine.generate("hello world", sp)
        events = iter(gen.events)
        for _ in range(5):
            next(events)
        workers.procs[victim].send_signal(signal.SIGKILL)
        started = time.monotonic()
        with pytest.raises(WorkerDiedError, match="cluster worker was lost"):
            for _ in events:
                assert time.monotonic() - started < 30, "the stream hangs"
    finally:
        engine.close()
    workers.procs[victim].wait(5)
    # the next plan leaves the lost worker out and runs on what is left
    replanned = _plan(deep_model, workers.addresses)
    lost = f"RPC[127.0.0.1:{victim}]"
    assert lost not in replanned.placement.dense
    assert any(f"127.0.0.1:{victim}" in c.why for c in replanned.changes)
    assert len(_greedy(deep_model, replanned.params(), n=8)) >= 8
    # a worker that comes back is used again by the next plan
    workers.start(victim)
    back = _plan(deep_model, workers.addresses)
    assert lost in back.placement.dense


def test_worker_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    port = free_port()
    proc = spawn_worker(port, threads=1, log=tmp_path / "w.log")
    assert stop_worker(proc) == 0
    text = (tmp_path / "w.log").read_text()
    assert "worker ready" in text and "worker stopped" in text


def test_hardware_lists_each_worker_and_its_link(workers: Workers) -> None:
    import json

    r = run_cli("hardware", "--rpc", workers.addresses[0], "--json",
                INFERENCEOS_HARDWARE_MEASURE_BANDWIDTH="false", timeout=300)
    assert r.returncode == 0, r.stderr
    [w] = json.loads(r.stdout)["workers"]
    assert w["address"] == workers.addresses[0] and w["usable"]
    assert w["info"]["devices"][0]["offered_bytes"] == WORKER_BYTES
    assert w["link"]["rtt_s"] > 0
    assert w["info"]["host_id"] == host_id()
    text = run_cli("hardware", "--rpc", workers.addresses[0],
                   INFERENCEOS_HARDWARE_MEASURE_BANDWIDTH="false", timeout=300)
    assert text.returncode == 0 and "this machine" in text.stdout, text.stderr


def test_a_frozen_worker_ends_the_stream_instead_of_hanging(
    deep_model: Path, workers: Workers
) -> None:
    """SIGSTOP keeps the TCP connection open but answers nothing (as a cut network or a
    machine that lost power would): llama.cpp would wait forever; the link watchdog
    ends the model's process, and the request gets a WorkerDiedError that says why."""
    from inferenceos.engine.engine import Engine
    from inferenceos.engine.sampling import SamplingParams

    plan = _plan(deep_model, workers.addresses)
    victim = workers.procs[workers.ports[0]]
    sp = SamplingParams(temperature=0, max_tokens=100_000, ignore_eos=True)
    engine = Engine(deep_model, plan.params().per_sequence(), n_parallel=1)
    try:
        events = iter(engine.generate("hello world", sp).events)
        next(events)
        victim.send_signal(signal.SIGSTOP)
        started = time.monotonic()
        with pytest.raises(WorkerDiedError, match="unreachable"):
            for _ in events:
                pass
        assert time.monotonic() - started < 20
    finally:
        victim.send_signal(signal.SIGCONT)
        engine.close()


def test_a_head_kept_on_the_cpu_stays_there(gemma_path: Path, tmp_path: Path) -> None:
    """A plan with blocks on a worker and Gemma's 170 MiB tied head on the CPU: llama.cpp
    offloads the output layer first (n_gpu_layers 1 moves only the head), so the plan
    asks for k + 1 layers and pins the head to the CPU. It asked for k before, and the
    worker got the head and k - 1 blocks: 216.9 MiB where 50.7 MiB were planned, on a
    worker offering 120 MiB. The worker's buffer, as llama.cpp logs it, is the plan's."""
    from inferenceos.engine.llama.lib import log
    from inferenceos.engine.session import LoadedModel
    from inferenceos.plan.entry import LoadRequest, plan_load
    from inferenceos.plan.model_facts import load_model_facts

    port = free_port()
    proc = spawn_worker(port, mem="120MiB", threads=1, log=tmp_path / "w.log")
    address = f"127.0.0.1:{port}"
    name = f"RPC[{address}]"
    try:
        machine = injected_machine(300 << 20, rpc_device(address, 120 << 20, link=5.0))
        plan = plan_load(load_model_facts(gemma_path), machine, LoadRequest(n_ctx=1024))
        k = plan.placement.dense.count(name)
        assert k > 0 and plan.placement.output_device == "CPU", plan.placement.dense
        params = plan.params()
        assert params.n_gpu_layers == k + 1 and params.tensor_buft_overrides
        mark = log().mark()
        with LoadedModel(gemma_path, params):
            pass
        planned = plan.memory.weights[name] / (1 << 20)
        assert worker_buffer_mib(log().since(mark), address) == pytest.approx(planned, rel=0.01)
    finally:
        stop_worker(proc)


def test_each_worker_holds_the_blocks_the_plan_gives_it(
    deep_model: Path, workers: Workers
) -> None:
    """llama.cpp spreads the offloaded blocks and the output layer (k + 1 slots) by
    cumulative tensor_split; fractions by block count (2 + 2 as 0.5/0.5) loaded 3 + 1.
    The split is now chosen so that each worker's buffer, as llama.cpp logs it, is the
    plan's (the placement fixed on injected links, as above)."""
    from inferenceos.engine.llama.lib import log
    from inferenceos.engine.session import LoadedModel
    from inferenceos.plan.entry import LoadRequest, plan_load
    from inferenceos.plan.model_facts import load_model_facts

    machine = injected_machine(RAM, *(rpc_device(a, WORKER_BYTES, link=5.0)
                                      for a in workers.addresses))
    plan = plan_load(load_model_facts(deep_model), machine, LoadRequest(n_ctx=N_CTX))
    counts = [plan.placement.dense.count(n) for n in workers.names()]
    assert all(counts), plan.placement.dense
    mark = log().mark()
    with LoadedModel(deep_model, plan.params()):
        pass
    lines = log().since(mark)
    for address, name in zip(workers.addresses, workers.names(), strict=True):
        planned = plan.memory.weights[name] / (1 << 20)
        assert worker_buffer_mib(lines, address) == pytest.approx(planned, abs=0.01), name


@pytest.mark.parametrize("forced", [1, 3])
def test_a_forced_layer_count_is_planned_as_llama_cpp_loads_it(
    deep_model: Path, workers: Workers, forced: int
) -> None:
    """`--gpu-layers N` (Ollama's num_gpu) is llama.cpp's n_gpu_layers: the output layer
    first, then the last N - 1 blocks. The plan kept the optimizer's placement and only
    changed the parameter, so its figures described another load (N = 1 was shown as a
    block on the worker; llama.cpp moved the head). Now the placement is redone: the
    worker's buffer, as llama.cpp logs it, is the plan's."""
    from inferenceos.engine.llama.lib import log
    from inferenceos.engine.session import LoadedModel
    from inferenceos.plan.devices import local_machine
    from inferenceos.plan.entry import LoadRequest, plan_load
    from inferenceos.plan.model_facts import load_model_facts

    name = workers.names()[0]
    plan = plan_load(load_model_facts(deep_model), local_machine(), LoadRequest(
        n_ctx=N_CTX, rpc=workers.addresses[:1], ram=RAM, gpu_layers=forced))
    assert plan.placement.dense.count(name) == forced - 1
    assert plan.placement.output_device == name and plan.params().n_gpu_layers == forced
    mark = log().mark()
    with LoadedModel(deep_model, plan.params()):
        pass
    planned = plan.memory.weights[name] / (1 << 20)
    assert worker_buffer_mib(log().since(mark), workers.addresses[0]) == pytest.approx(
        planned, abs=0.01)


def test_an_ffn_group_kept_in_ram_is_where_llama_cpp_puts_it(
    deep_model: Path, workers: Workers
) -> None:
    """A placement with some offloaded layers' FFN group in RAM (the optimizer offers it
    on local GPUs, none here; llama.cpp takes the plan's tensor override the same way
    for any backend): the worker's buffer, as llama.cpp logs it, is the plan's, less
    those FFN groups, and the split model computes the local greedy tokens."""
    from dataclasses import replace

    from inferenceos.engine.llama.lib import log
    from inferenceos.plan.entry import LoadRequest, plan_load
    from inferenceos.plan.footprint import estimate
    from inferenceos.plan.model_facts import load_model_facts
    from inferenceos.plan.placement import build_placement, layer_parts

    facts = load_model_facts(deep_model)
    machine = injected_machine(RAM, *(rpc_device(a, WORKER_BYTES, link=5.0)
                                      for a in workers.addresses))
    plan = plan_load(facts, machine, LoadRequest(n_ctx=N_CTX))
    p, parts = plan.placement, layer_parts(facts, plan.ctx)
    away = [i for i, d in enumerate(p.dense) if d != "CPU"][::2]
    ffn = ["CPU" if i in away else d for i, d in enumerate(p.dense)]
    split = build_placement(facts, parts, list(p.dense), list(p.experts), p.output_device,
                            ffn=ffn)
    plan = replace(plan, placement=split, memory=estimate(facts, split, machine, plan.ctx))
    assert split.cpu_ffn_layers == tuple(away) and plan.tensor_overrides
    mark = log().mark()
    tokens = _greedy(deep_model, plan.params())
    lines = log().since(mark)
    moved = sum(parts[i].ffn_bytes for i in away)
    for address, name in zip(workers.addresses, workers.names(), strict=True):
        planned = plan.memory.weights.get(name, 0) / (1 << 20)
        assert worker_buffer_mib(lines, address) == pytest.approx(planned, abs=0.01), name
    assert moved > 0 and sum(1 for ln in lines if "overridden to CPU" in ln) >= 3 * len(away)
    assert tokens == _greedy(deep_model, _plan(deep_model, (), ram=None).params())
