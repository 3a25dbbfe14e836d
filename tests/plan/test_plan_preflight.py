"""Preflight: the degradation order, placement of MoE experts, disk-bound and refusal."""

from __future__ import annotations

import pytest

from inferenceos.plan.memory import ContextSettings
from inferenceos.plan.preflight import Leeway, PlanRefused, make_plan
from plan_factories import GiB, machine, make_facts, moe_facts


def _kinds(plan) -> list[str]:  # type: ignore[no-untyped-def]
    return [c.what.split()[0] for c in plan.changes]


def test_fits_as_asked_changes_nothing() -> None:
    plan = make_plan(make_facts(), machine(ram=64 * GiB), ContextSettings(n_ctx=8192))
    assert plan.feasible and not plan.changes and plan.ctx.n_ctx == 8192


def test_context_shrinks_before_kv_is_quantized() -> None:
    facts = make_facts()  # ~3.8 GiB of weights, 128 KiB of KV per token
    # f16 KV + K·Q scratch: 6.1 GiB at 32768 tokens, 3.1 at 16384, 1.6 at 8192
    plan = make_plan(facts, machine(ram=6 * GiB), ContextSettings(n_ctx=32768))
    assert "context" in _kinds(plan) and "KV" not in _kinds(plan)
    assert plan.ctx.n_ctx < 32768 and plan.ctx.type_k == "f16"


def test_kv_is_quantized_after_the_context_floor() -> None:
    facts = make_facts()
    plan = make_plan(facts, machine(ram=4.25 * GiB), ContextSettings(n_ctx=8192),
                     leeway=Leeway(min_ctx=4096))
    assert _kinds(plan)[:1] == ["context"] and "KV" in _kinds(plan)
    assert plan.ctx.n_ctx == 4096 and plan.ctx.type_v in ("q8_0", "q4_0")
    assert plan.ctx.flash_attn  # a quantized V cache needs it


def test_pinned_context_is_not_shrunk() -> None:
    plan = make_plan(
        make_facts(), machine(ram=5.5 * GiB), ContextSettings(n_ctx=16384),
        leeway=Leeway(pinned_ctx=True),
    )
    assert plan.ctx.n_ctx == 16384 and plan.ctx.type_k != "f16"


def test_moe_on_small_gpu_puts_experts_on_cpu_first() -> None:
    plan = make_plan(
        moe_facts(), machine(ram=32 * GiB, gpus=(4 * GiB,)), ContextSettings(n_ctx=4096)
    )
    p = plan.placement
    assert p.gpu_layers == 32  # every dense part fits in 4 GiB ...
    assert any(e == "CPU" for e in p.experts)  # ... because experts left first
    assert any("experts" in c.what for c in plan.changes)
    assert plan.tensor_overrides and plan.tensor_overrides[0][1] == "CPU"
    assert "exps" in plan.tensor_overrides[0][0]


def test_bigger_than_all_memory_is_disk_bound_with_reason() -> None:
    plan = make_plan(moe_facts(), machine(ram=8 * GiB), ContextSettings(n_ctx=4096))
    assert plan.disk_bound and plan.placement.disk_bytes > 10 * GiB
    assert "disk" in plan.reason and any("mmap" in c.what for c in plan.changes)


def test_refusal_gives_the_numbers() -> None:
    with pytest.raises(PlanRefused) as exc:
        make_plan(
            make_facts(), machine(ram=0.05 * GiB), ContextSettings(n_ctx=4096),
            leeway=Leeway(allow_mmap=True),
        )
    msg = str(exc.value)
    assert "cannot run here" in msg and "KV" in msg and "RAM budget 51.2 MiB" in msg
    assert "\n" not in msg


def test_refusal_without_mmap() -> None:
    with pytest.raises(PlanRefused):
        make_plan(moe_facts(), machine(ram=8 * GiB), ContextSettings(n_ctx=4096),
                  leeway=Leeway(allow_mmap=False))


def test_plan_for_run_gives_llama_params(tiny_llama) -> None:  # type: ignore[no-untyped-def]
    from inferenceos.plan.model_facts import load_model_facts
    from inferenceos.plan.simulate import plan_for_run

    plan = plan_for_run(load_model_facts(tiny_llama), machine(ram=8 * GiB), threads=1)
    ls = plan.params()
    assert ls.n_ctx == plan.ctx.n_ctx and ls.n_threads == 1 and ls.n_gpu_layers == 0
    assert (ls.type_k, ls.type_v, ls.swa_full) == (plan.ctx.type_k, plan.ctx.type_v,
                                                    plan.ctx.swa_full)
    assert plan.summary().startswith("plan: ctx ")
    json_plan = plan.to_json()
    assert json_plan["llama_params"]["n_ctx"] == plan.ctx.n_ctx


def _big_vocab_facts():  # type: ignore[no-untyped-def]
    # Gemma-like: small blocks, a 262k vocabulary: the logits of one 512-token ubatch
    # (512 MiB of f32) outweigh the ~190 MiB of weights
    return make_facts(n_layer=2, n_embd=640, n_ff=2048, n_head=4, n_head_kv=1, n_vocab=262144)


def test_ubatch_shrinks_before_weights_go_to_disk() -> None:
    facts = _big_vocab_facts()
    plan = make_plan(facts, machine(ram=0.4 * GiB), ContextSettings(n_ctx=4096))
    assert plan.feasible and not plan.disk_bound
    assert "ubatch" in _kinds(plan)
    assert plan.ctx.n_ubatch < 512 and plan.memory.by_device["CPU"] <= 0.4 * GiB
    # a smaller ubatch only slows prefill: it is taken before any quality is given up
    assert not {"context", "KV"} & set(_kinds(plan)) and plan.ctx.type_k == "f16"


def test_ubatch_is_kept_when_there_is_room() -> None:
    plan = make_plan(_big_vocab_facts(), machine(ram=4 * GiB), ContextSettings(n_ctx=4096))
    assert plan.ctx.n_ubatch == 512 and "ubatch" not in _kinds(plan)


def test_a_cpu_only_plan_keeps_its_products_on_the_cpu() -> None:
    """llama.cpp sends the products of host weights to an accelerator for prompts of
    32+ tokens (op_offload); a plan that placed nothing there turns that off, so its
    "CPU only" holds on a GPU build too. A plan with layers on a GPU keeps llama.cpp's
    default."""
    facts = make_facts()
    cpu_only = make_plan(facts, machine(ram=64 * GiB), ContextSettings(n_ctx=4096))
    assert not cpu_only.accelerators and cpu_only.params().op_offload is False
    on_gpu = make_plan(facts, machine(ram=64 * GiB, gpus=(24 * GiB,)),
                       ContextSettings(n_ctx=4096))
    assert on_gpu.accelerators and on_gpu.params().op_offload is True
