"""A user's layer count (`--gpu-layers`, Ollama's `num_gpu`) as the placement llama.cpp
will really make, so that the plan's memory and predictions describe that load.

llama.cpp's n_gpu_layers = N offloads the output layer first and then the last N - 1
blocks (llama_params.offloaded_blocks). Before, a forced count only changed the parameter: the
plan kept the optimizer's placement and memory, so `--gpu-layers 1` on a 12-block
model was shown as a block on the worker while llama.cpp moved the head instead.

The forced blocks go to the accelerators the optimizer used, in its proportions, or,
where it used none, to every accelerator in proportion to its memory (llama.cpp's own
default split); `Plan.tensor_split` then makes llama.cpp load exactly this placement.
A count over what the devices hold is the user's to ask for: the plan says so in its
memory figures, and the load may fail as llama.cpp's would.
"""

from __future__ import annotations

from dataclasses import replace

from inferenceos.plan.devices import Machine
from inferenceos.plan.footprint import estimate, head_fits
from inferenceos.plan.llama_params import offloaded_blocks
from inferenceos.plan.model_facts import ModelFacts
from inferenceos.plan.placement import build_placement, layer_parts
from inferenceos.plan.plan import Change, Plan


def force_gpu_layers(
    plan: Plan, facts: ModelFacts, machine: Machine, n: int
) -> tuple[Plan, Change]:
    """`plan` loaded with n_gpu_layers `n` (-1: all), its placement and memory redone
    to match; the Change says what the planner would have offloaded."""
    blocks = facts.spec.block_count
    want = blocks + 1 if n < 0 else min(n, blocks + 1)
    had = plan.n_gpu_layers
    change = Change(f"{want} GPU layers (forced)", f"asked for; the planner would offload {had}")
    weights = _shares(plan, machine)
    if not weights:  # nothing to offload to: llama.cpp keeps everything on the CPU
        return replace(plan, gpu_layers_forced=0), change
    offloaded = offloaded_blocks(want, blocks)
    dense = ["CPU"] * (blocks - offloaded) + _spread(offloaded, weights)
    head = (dense[-1] if offloaded else next(iter(weights))) if want else "CPU"
    if not all(head_fits(facts, d) for d in machine.accelerators if d.name == head):
        head = "CPU"  # llama.cpp keeps a head its device refuses (over its largest tensor)
    experts = [_expert_home(plan, i, dev) for i, dev in enumerate(dense)]
    placement = build_placement(facts, layer_parts(facts, plan.ctx), dense, experts, head)
    cpu_weights = placement.loads["CPU"].weights if "CPU" in placement.loads else 0
    placement = replace(placement, disk_bytes=min(plan.placement.disk_bytes, cpu_weights))
    used = tuple(a for a in weights if a in dense or a == head)
    memory = estimate(facts, placement, machine, plan.ctx)
    return replace(plan, placement=placement, memory=memory, accelerators=used,
                   gpu_layers_forced=want), change


def _shares(plan: Plan, machine: Machine) -> dict[str, float]:
    """Accelerator -> its share of forced blocks, in device order."""
    used = {a: float(plan.placement.dense.count(a)) for a in plan.accelerators}
    if sum(used.values()) > 0:
        return {a: w for a, w in used.items() if w > 0}
    return {d.name: float(max(d.memory_bytes, 1)) for d in machine.accelerators}


def _spread(k: int, weights: dict[str, float]) -> list[str]:
    """`k` blocks over the accelerators in order, contiguous, by largest remainder."""
    total = sum(weights.values())
    exact = {a: k * w / total for a, w in weights.items()}
    counts = {a: int(x) for a, x in exact.items()}
    for a in sorted(exact, key=lambda a: counts[a] - exact[a])[: k - sum(counts.values())]:
        counts[a] += 1
    return [a for a in weights for _ in range(counts[a])]


def _expert_home(plan: Plan, i: int, dev: str) -> str | None:
    """Layer i's routed experts: none without experts; with the layer, unless the plan
    kept them in RAM on this same device (a tensor override then keeps them there)."""
    had = plan.placement.experts[i]
    if had is None:
        return None
    if dev == "CPU":
        return "CPU"
    return had if plan.placement.dense[i] == dev else dev
