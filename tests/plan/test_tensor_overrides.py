"""Plans' tensor placement reaches llama.cpp: buffer-type overrides by tensor pattern."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferenceos.engine.llama.lib import log
from inferenceos.engine.sampling import SamplingParams
from inferenceos.engine.scheduler import generate_one
from inferenceos.engine.session import LoadedModel
from inferenceos.errors import ModelLoadError
from inferenceos.plan.llama_params import LlamaParams

EXPERTS = r"blk\.\d+\.ffn_(gate|up|down)_exps"


def test_expert_override_is_applied_by_llama_cpp(tiny_moe: Path) -> None:
    mark = log().mark()
    settings = LlamaParams(n_ctx=256, n_threads=1, tensor_buft_overrides=((EXPERTS, "CPU"),))
    with LoadedModel(tiny_moe, settings) as lm:
        four = SamplingParams(temperature=0, max_tokens=4)
        out = list(generate_one(lm, lm.tokenize("abc"), four))
    assert len(out) == 4
    moved = [ln for ln in log().since(mark) if "buffer type overridden to CPU" in ln]
    assert len(moved) == 2 * 3  # 2 layers x gate/up/down experts


def test_unknown_device_is_a_clear_error(tiny_moe: Path) -> None:
    settings = LlamaParams(n_ctx=256, tensor_buft_overrides=((EXPERTS, "CUDA7"),))
    with pytest.raises(ModelLoadError, match="no device named 'CUDA7'"):
        LoadedModel(tiny_moe, settings)


def test_plan_overrides_survive_into_load_settings() -> None:
    """A GPU too small for a Mixtral-shaped model's experts (4 layers, 2 GiB): the
    plan keeps some in RAM, and the engine's LlamaParams carries that override (nothing
    of the plan is lost on the way to llama.cpp). The tiny MoE file no longer gives
    such a plan: its experts are so small the optimizer keeps them on the GPU."""
    from inferenceos.plan.memory import ContextSettings
    from inferenceos.plan.preflight import make_plan
    from plan_factories import GiB, machine, make_facts

    facts = make_facts(n_layer=4, n_expert=8, n_used=2)
    plan = make_plan(facts, machine(ram=64 * GiB, gpus=(2 * GiB,)),
                     ContextSettings(n_ctx=4096, flash_attn=True))
    layers = plan.placement.cpu_expert_layers
    assert layers and plan.placement.gpu_layers == 4, plan.summary()
    alt = "|".join(str(i) for i in layers)
    assert (rf"blk\.({alt})\.ffn_(up|down|gate|gate_up)_exps", "CPU") in plan.tensor_overrides
    assert plan.params().tensor_buft_overrides == tuple(plan.tensor_overrides)


@pytest.mark.parametrize("gpu_bytes", [6_000_000, 5_000_000])
def test_sizing_the_ubatch_after_the_optimizer_keeps_the_gpu_within_budget(
    tiny_moe: Path, gpu_bytes: int
) -> None:
    """The optimizer fits the model on a small GPU by lowering the ubatch; the ubatch
    sizing after it looked at the CPU's headroom only and raised it back to 512, which
    put 6.9 MB on a 5-6 MB GPU (2026-12-02). Every accelerator stays within budget."""
    from inferenceos.plan.devices import Overrides, apply_overrides, local_machine
    from inferenceos.plan.model_facts import load_model_facts
    from inferenceos.plan.optimize_rows import device_budgets
    from inferenceos.plan.simulate import plan_for_run

    machine = apply_overrides(local_machine(), Overrides(gpu_memory=(gpu_bytes,)))
    plan = plan_for_run(load_model_facts(tiny_moe), machine, flash_attn=False)
    budgets = device_budgets(machine)
    for dev, used in plan.memory.by_device.items():
        if dev != "CPU":
            assert used <= budgets[dev], (dev, used, budgets[dev], plan.summary())


@pytest.mark.parametrize("kind", ["llama", "moe"])
def test_the_ffn_override_moves_the_ffn_group_in_llama_cpp(tmp_path: Path, kind: str) -> None:
    """plan.FFN_TENSORS for layer 1, as the plan writes it: llama.cpp (std::regex, with
    its lookaheads) overrides exactly that layer's FFN group tensors: gate/up/down of
    a dense layer, the router of a MoE one; never a norm or an expert."""
    from inferenceos.plan.model_facts import load_model_facts
    from inferenceos.plan.placement import FFN_ROLE
    from inferenceos.plan.plan import FFN_TENSORS
    from tiny_models import write_tiny_model

    path = write_tiny_model(tmp_path / "m.gguf", kind)
    want = {t.name for t in load_model_facts(path).tensors if t.layer == 1 and t.role == FFN_ROLE}
    mark = log().mark()
    settings = LlamaParams(n_ctx=256, n_threads=1,
                           tensor_buft_overrides=((rf"blk\.(1)\.{FFN_TENSORS}", "CPU"),))
    with LoadedModel(path, settings) as lm:
        out = list(generate_one(lm, lm.tokenize("abc"),
                                SamplingParams(temperature=0, max_tokens=2)))
    assert len(out) == 2
    moved = {ln.split("tensor ")[1].split(" ")[0] for ln in log().since(mark)
             if "buffer type overridden to CPU" in ln}
    assert moved == want and len(want) == (3 if kind == "llama" else 1)
