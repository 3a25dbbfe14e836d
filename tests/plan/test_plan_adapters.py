"""LoRA adapters in the planner (plan/adapters.py, LoadRequest.lora in plan/entry.py).

The bytes are checked against llama.cpp's own figure: llama_adapter_lora_init logs
"<buffer> LoRA buffer size = X MiB" for what it allocates.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType as QT
from gguf import GGUFValueType as VT

from gguf_craft import build, kv_scalar, kv_str, tensor_info
from inferenceos.errors import UsageError
from inferenceos.plan.adapters import load_adapter_facts
from inferenceos.plan.entry import LoadRequest, plan_load
from inferenceos.plan.model_facts import ModelFacts, load_model_facts
from inferenceos.plan.preflight import PlanRefused
from lora_craft import write_lora
from plan_factories import GiB, machine, make_facts

MiB = 1024 * 1024

_LOAD = r"""
import sys, llama_cpp as L
L.llama_backend_init()
m = L.llama_model_load_from_file(sys.argv[1].encode(), L.llama_model_default_params())
assert L.llama_adapter_lora_init(m, sys.argv[2].encode())
"""


def write_sparse_lora(path: Path, facts: ModelFacts, rank: int,
                      targets: tuple[str, ...] = ("attn_q", "ffn_up")) -> Path:
    """An adapter GGUF header for `facts` (f32 A and B of `rank` on `targets` of every
    layer) whose data is a sparse hole: any size, a few KB of disk."""
    kvs = [kv_str("general.architecture", "llama"), kv_str("general.type", "adapter"),
           kv_str("adapter.type", "lora"), kv_scalar("adapter.lora.alpha", VT.FLOAT32, rank)]
    infos, offset = [], 0
    for t in facts.tensors:
        if t.layer < 0 or not any(f".{x}." in t.name for x in targets):
            continue
        n_in = t.n_elements // t.rows
        for suffix, shape in ((".lora_a", [n_in, rank]), (".lora_b", [rank, t.rows])):
            infos.append(tensor_info(t.name + suffix, shape, QT.F32, offset))
            offset += shape[0] * shape[1] * 4
            offset += -offset % 32
    head = build(kvs, infos)
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(len(head) + offset)
    return path


def test_adapter_bytes_on_the_cpu_equal_llama_cpps_buffer(tiny_llama: Path, tmp_path: Path
                                                          ) -> None:
    lora = write_lora(tmp_path / "a.gguf", tiny_llama, seed=1, rank=4)
    facts = load_model_facts(tiny_llama)
    base = plan_load(facts, machine(), LoadRequest(n_ctx=256))
    plan = plan_load(facts, machine(), LoadRequest(n_ctx=256, lora=(str(lora),)))
    want = load_adapter_facts(lora, facts.spec.block_count).bytes
    assert plan.memory.adapters == {"CPU": want}
    assert plan.memory.by_device["CPU"] == base.memory.by_device["CPU"] + want
    assert "LoRA" in plan.summary()
    r = subprocess.run([sys.executable, "-c", _LOAD, str(tiny_llama), str(lora)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    mib = [float(x) for x in re.findall(r"LoRA buffer size = +([\d.]+) MiB", r.stdout + r.stderr)]
    assert mib, "llama.cpp logged no LoRA buffer size"
    assert abs(sum(mib) * MiB - want) <= 0.01 * MiB * len(mib)  # the log's rounding


def test_adapters_follow_their_layers_devices(tmp_path: Path) -> None:
    facts = make_facts()  # ~4 GiB at Q4_0, 32 layers
    lora = write_sparse_lora(tmp_path / "a.gguf", facts, rank=16)
    m = machine(ram=64 * GiB, gpus=(2.5 * GiB,))  # about half the layers on the GPU
    plan = plan_load(facts, m, LoadRequest(n_ctx=2048, lora=(str(lora),)))
    adapters = load_adapter_facts(lora, facts.spec.block_count)
    want: dict[str, int] = {}
    for t in adapters.tensors:
        dev = plan.placement.dense[t.layer] if t.role != "ffn" else plan.placement.ffn_device(
            t.layer)
        want[dev] = want.get(dev, 0) + t.n_bytes
    assert set(want) == {"CPU", "GPU0"}
    assert plan.memory.adapters == want
    assert all(plan.memory.by_device[d] <= plan.budgets[d] for d in plan.budgets)


def test_adapters_that_overfill_a_device_replan_or_refuse(tmp_path: Path) -> None:
    facts = make_facts(n_layer=8)
    lora = write_sparse_lora(tmp_path / "big.gguf", facts, rank=2048)  # ~1.2 GiB of f32
    need = load_adapter_facts(lora, facts.spec.block_count).bytes
    assert need > GiB
    base = plan_load(facts, machine(ram=64 * GiB), LoadRequest(n_ctx=2048))
    ram = base.memory.by_device["CPU"] + need // 2  # fits without the adapter only
    plan_fit = plan_load(facts, machine(ram=ram), LoadRequest(n_ctx=2048))
    assert plan_fit.memory.adapters == {}
    plan = plan_load(facts, machine(ram=ram), LoadRequest(n_ctx=2048, lora=(str(lora),)))
    assert plan.memory.adapters == {"CPU": need}
    assert plan.budgets["CPU"] == ram
    assert plan.memory.by_device["CPU"] - plan.placement.disk_bytes <= ram
    assert plan.placement.disk_bytes > 0  # the model's weights make room, from the disk
    assert any("kept for LoRA adapters" in c.what for c in plan.changes)
    with pytest.raises(PlanRefused, match="LoRA"):
        plan_load(facts, machine(ram=need // 2), LoadRequest(n_ctx=2048, lora=(str(lora),)))


def test_a_file_that_is_no_adapter_is_refused(tiny_llama: Path) -> None:
    facts = load_model_facts(tiny_llama)
    with pytest.raises(UsageError, match="not a LoRA adapter"):
        plan_load(facts, machine(), LoadRequest(n_ctx=256, lora=(str(tiny_llama),)))


def test_the_pool_plans_the_default_models_lora_files(tiny_llama: Path, tmp_path: Path) -> None:
    """serve MODEL --lora FILE: the manager's plan for MODEL (what its memory budget is
    charged) holds the adapter; another model's does not."""
    from inferenceos.app.serve import adapter_files
    from inferenceos.registry.catalog import Catalog
    from inferenceos.registry.manager import ModelManager
    from inferenceos.registry.store import ModelStore

    lora = write_lora(tmp_path / "a.gguf", tiny_llama, seed=2, rank=4)
    catalog = Catalog(ModelStore(tmp_path / "models"))
    catalog.add_file(tiny_llama, "tiny")
    catalog.add_file(tiny_llama, "other")
    manager = ModelManager(catalog.resolve, base=LoadRequest(n_ctx=256), context_hint=None,
                           adapters=adapter_files(catalog, "tiny", ((str(lora), 1.0),)))
    want = load_adapter_facts(lora, load_model_facts(tiny_llama).spec.block_count).bytes
    assert manager.plan_for("tiny").memory.adapters == {"CPU": want}
    assert manager.plan_for("other").memory.adapters == {}
