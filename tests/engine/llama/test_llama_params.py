"""One builder of llama.cpp's parameters (engine/llama/structs.py): the load that
`measure_load` (the memory model's ground truth) measures is the load the engine makes.

A multi-device plan here: the "deep" tiny model over this machine's CPU and two real
`inferenceos worker` processes on loopback (llama.cpp RPC devices), with one layer's
feed-forward weights overridden back to the CPU. Both `LoadedModel` and `measure_load`
load it; what each hands to llama_model_load_from_file and llama_init_from_model is
recorded, and the buffers llama.cpp logs for each load are compared.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from inferenceos.cluster.spawn import free_port, spawn_worker, stop_worker
from inferenceos.plan.llama_params import LlamaParams
from tiny_models import write_tiny_model

# as tests/cluster/test_cluster.py: 4 MiB per worker and 5 MiB here make the planner use both
WORKER_MEM = "4MiB"
RAM = 5 << 20
N_CTX = 256
OVERRIDE = (r"blk\.5\.ffn_(up|down|gate)\.weight", "CPU")


@dataclass
class Load:
    """What one load handed to llama.cpp, and the buffers llama.cpp logged for it."""

    model: list[dict[str, Any]]
    context: list[dict[str, Any]]
    buffers: dict[tuple[str, str], int]


@pytest.fixture(scope="module")
def deep_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("llama-params") / "deep.gguf", "deep")


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, ...]]:
    logs = tmp_path_factory.mktemp("worker-logs")
    ports = [free_port()]
    ports.append(free_port())
    while ports[1] in (ports[0] - 1, ports[0], ports[0] + 1):
        ports[1] = free_port()
    procs = []
    try:
        for p in ports:
            procs.append(spawn_worker(p, mem=WORKER_MEM, threads=1,
                                      log=logs / f"worker-{p}.log"))
        yield tuple(f"127.0.0.1:{p}" for p in ports)
    finally:
        for proc in procs:
            stop_worker(proc)


@pytest.fixture(scope="module")
def split_params(deep_model: Path, workers: tuple[str, ...]) -> LlamaParams:
    from inferenceos.plan.devices import local_machine
    from inferenceos.plan.entry import LoadRequest, plan_load
    from inferenceos.plan.model_facts import load_model_facts

    plan = plan_load(load_model_facts(deep_model), local_machine(),
                     LoadRequest(n_ctx=N_CTX, rpc=workers, ram=RAM))
    params = plan.params()
    # the plan must be a multi-device one, or this test proves nothing
    assert params.devices == tuple(f"RPC[{a}]" for a in workers), params
    assert params.n_gpu_layers > 0 and len(params.tensor_split) == 2, params
    return replace(params, tensor_buft_overrides=(OVERRIDE,))


def _recorded(run: Any) -> Load:
    """Run `run()` with llama.cpp's load and context calls recorded."""
    from inferenceos.engine.llama.lib import lib, log
    from inferenceos.engine.llama.memory_report import parse_buffer_lines
    from inferenceos.engine.llama.structs import describe_context_params, describe_model_params

    ll = lib()
    real_load, real_init = ll.llama_model_load_from_file, ll.llama_init_from_model
    seen = Load([], [], {})

    def load(path: bytes, params: Any) -> Any:
        seen.model.append(describe_model_params(params))
        return real_load(path, params)

    def init(model: Any, params: Any) -> Any:
        seen.context.append(describe_context_params(params))
        return real_init(model, params)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(ll, "llama_model_load_from_file", load)
        m.setattr(ll, "llama_init_from_model", init)
        mark = log().mark()
        run()
        seen.buffers = parse_buffer_lines(log().since(mark))
    return seen


@pytest.fixture(scope="module")
def loads(deep_model: Path, split_params: LlamaParams) -> tuple[Load, Load]:
    """(the engine's load, measure_load's) of the same multi-device plan; the latter's
    buffers are the ones measure_load reports."""
    from inferenceos.engine.llama.memory_report import BufferReport, measure_load
    from inferenceos.engine.session import LoadedModel

    reports: list[BufferReport] = []
    mine = _recorded(lambda: LoadedModel(deep_model, split_params).close())
    measured = _recorded(lambda: reports.append(measure_load(deep_model, split_params)))
    assert measured.buffers == reports[0].buffers  # its report is what it logged
    return mine, measured


def test_measure_load_hands_llama_cpp_the_engines_params(
    loads: tuple[Load, Load], workers: tuple[str, ...]
) -> None:
    mine, measured = loads
    assert len(mine.model) == len(measured.model) == 1
    assert len(mine.context) == len(measured.context) == 1
    [model] = mine.model
    assert len(model["devices"]) == 2 and all("RPC" in d for d in model["devices"]), model
    assert model["tensor_buft_overrides"] == [(OVERRIDE[0], "CPU")]
    assert sum(model["tensor_split"]) == pytest.approx(1.0)
    assert model["n_gpu_layers"] > 0
    for key in ("devices", "tensor_split", "tensor_buft_overrides", "n_gpu_layers",
                "main_gpu", "split_mode", "load_mode", "use_extra_bufts"):
        assert measured.model[0][key] == model[key], key
    assert measured.model == mine.model  # and every other field
    assert measured.context == mine.context


def test_measured_buffers_per_device_equal_the_engines(loads: tuple[Load, Load]) -> None:
    mine, measured = loads
    remote = {buft for (kind, buft) in mine.buffers if kind == "model" and "RPC" in buft}
    assert len(remote) == 2, mine.buffers  # weights on both workers
    assert any(kind == "KV" and "RPC" in buft for kind, buft in mine.buffers), mine.buffers
    assert measured.buffers == mine.buffers


def test_a_workers_buffers_are_parsed_with_its_address() -> None:
    from inferenceos.engine.llama.memory_report import MIB, parse_buffer_lines

    lines = ["load_tensors: RPC0[127.0.0.1:50052] model buffer size =     3.75 MiB",
             "llama_kv_cache: RPC1[10.0.0.2:50052] KV buffer size =     0.25 MiB",
             "~llama_context: RPC0[127.0.0.1:50052] compute buffer size is   0.9404 MiB, "
             "matches expectation of   0.9404 MiB",
             "load_tensors:   CPU_Mapped model buffer size =     2.02 MiB"]
    assert parse_buffer_lines(lines) == {
        ("model", "RPC0[127.0.0.1:50052]"): round(3.75 * MIB),
        ("KV", "RPC1[10.0.0.2:50052]"): round(0.25 * MIB),
        ("model", "CPU_Mapped"): round(2.02 * MIB),
    }


def test_a_file_check_and_a_vocabulary_load_place_nothing(tiny_llama: Path) -> None:
    from inferenceos.engine.llama.lib import lib
    from inferenceos.engine.llama.structs import (
        LOAD_MODE_NONE,
        describe_model_params,
        file_check_params,
        vocab_only_params,
    )

    ll = lib()
    check = describe_model_params(file_check_params())
    assert check["no_alloc"] and check["load_mode"] == LOAD_MODE_NONE
    assert check["n_gpu_layers"] == 0 and check["devices"] == []
    vocab = vocab_only_params()
    assert vocab.vocab_only and vocab.n_gpu_layers == 0
    for params in (file_check_params(), vocab):
        model = ll.llama_model_load_from_file(str(tiny_llama).encode(), params)
        assert model
        ll.llama_model_free(model)
