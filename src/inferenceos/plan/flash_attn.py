"""Whether a plan uses flash attention when the caller did not say (pure).

llama.cpp's own "auto" turns flash attention on for its CPU, CUDA and Metal backends, and
so does the planner, with one exception measured on the CPU: a server that keeps
conversations in its KV cache (`serve`, engine/kv/store.py) spends its time on turns
that are a few new tokens over a deep cached history. There llama.cpp's CPU flash
attention computes each new row 30-70 % slower than the plain K·Q path (llama-bench
`pp11 @ d4096`, 2 threads: Qwen2.5-Coder-0.5B 46.4 t/s with it, 66.8 without; the 1.5B
20.0 against 34.3; Gemma 3 270M 217 against 296), while a long prompt from nothing
prefills 5-8 % faster with it (`pp4096`: 148 against 137 t/s on the 0.5B; 2 % after
microbatch.MAX_UBATCH_WITHOUT_FA) and decode is within the noise for Qwen at depth, ~5 %
slower without it for Gemma. So on a CPU-only machine, with a V cache that is not
quantized, `cached_turns` plans without it (docs/plan.md, "Flash attention").

Without flash attention the compute buffer holds K·Q for a whole ubatch (n_kv × ubatch ×
heads × 4 B: plan/memory.py charges it). A plan never gives up quality for that: when
the plan without it lowers the context or the KV precision, or leaves weights on disk,
the one with it (the default) is taken instead (`prefer_without`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from inferenceos.plan.devices import Machine
from inferenceos.plan.llama_params import QUANTIZED_KV
from inferenceos.plan.memory import ContextSettings
from inferenceos.plan.plan import Plan
from inferenceos.plan.preflight import PlanRefused


def off_by_default(machine: Machine, cached_turns: bool, type_v: str, n_seq: int = 1) -> bool:
    """True when a plan with no asked flash attention should first try without it: a
    CPU-only machine (no GPU, no RPC worker), turns over a cached history of one
    sequence, a V cache that is not quantized (a quantized one needs flash attention).
    Several sequences share one pool of cells: without flash attention every row computes
    K·Q over all of them, the other sequences' masked out, which llama.cpp's CPU flash
    attention skips (tiny llama through `serve`, paired against llama-server: 0.54x
    without, 0.67x with at 8 streams, 0.68x and 1.07x at 32; docs/engine.md)."""
    return (cached_turns and n_seq == 1 and not machine.accelerators
            and type_v not in QUANTIZED_KV)


def keeps_quality(plan: Plan, ctx: ContextSettings) -> bool:
    """`plan` holds the asked context and KV types with every weight in memory."""
    return (plan.ctx.n_ctx == ctx.n_ctx and plan.ctx.type_k == ctx.type_k
            and plan.ctx.type_v == ctx.type_v and not plan.disk_bound)


def prefer_without(optimize: Callable[[ContextSettings], Plan], ctx: ContextSettings) -> Plan:
    """The plan for `ctx` (flash attention off), unless that plan gives up any quality or
    is refused: then the plan with flash attention, which never needs more memory."""
    try:
        plan = optimize(ctx)
    except PlanRefused:
        return optimize(_with_fa(ctx))
    return plan if keeps_quality(plan, ctx) else optimize(_with_fa(ctx))


def _with_fa(ctx: ContextSettings) -> ContextSettings:
    return replace(ctx, flash_attn=True)
