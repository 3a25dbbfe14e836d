"""Placement + memory model → the bytes each device must hold (a MemoryEstimate).

CPU: its weights (mmap'd from the file, or their CPU_REPACK copies), the KV of its
layers, its compute buffer, the output (logits) buffer and the process overhead.
Accelerator: its weights, the KV of its layers, its compute buffer: a local GPU's by
`ComputeTerms.gpu_layer_peak` (checked against ggml-vulkan on lavapipe, docs/gpu.md), a
worker's by the CPU's phases.

llama.cpp's op_offload: with a GPU in the plan, a prompt's products of CPU-resident
weights (batches of OP_OFFLOAD_MIN_BATCH tokens and more) run on the first GPU, each
weight copied into that GPU's compute buffer (ggml-backend.cpp, the scheduler's
"1.off" and its split inputs), which llama.cpp sizes for them. `estimate` keeps
op_offload on only where that buffer fits the GPU's budget beside the placement;
elsewhere it is off, and those products run on the CPU (`MemoryEstimate.op_offload`).
"""

from __future__ import annotations

from inferenceos.hardware.profile import takes_weight
from inferenceos.plan.devices import Device, Machine, device_budgets
from inferenceos.plan.memory import (
    ComputeTerms,
    ContextSettings,
    MemoryEstimate,
    compute_terms,
    effective_context,
    output_buffer_bytes,
    process_overhead,
    repack_bytes,
)
from inferenceos.plan.model_facts import ModelFacts, TensorFact
from inferenceos.plan.placement import Placement, head_tensor

# ggml's GPU backends (CUDA, Vulkan, SYCL, Metal) take an op of a host-memory weight
# only for a batch of this many rows or more (op_offload_min_batch_size, the default of
# GGML_OP_OFFLOAD_MIN_BATCH)
OP_OFFLOAD_MIN_BATCH = 32
# An offloaded layer's peak beyond the GPU's own layer phase and the weight copied in:
# ggml-alloc's fragmentation around the copies, up to one more copy and at most this
# many residual-stream activations (T × n_embd f32). Fitted on lavapipe at 512 tokens
# (logged / predicted: tiny wide 9.25 / 9.26 MiB, tiny deep 4.56 / 4.51, the tiny llama
# 1.52 / 1.57, Qwen2.5-Coder-0.5B 38.36 / 38.55); at 128 to 256 tokens copies fit in
# freed blocks and the estimate is over by up to 28 % (wide at 256: 4.0 / 5.13).
_OFFLOAD_EXTRA_EMBD = 1.5


def device_compute(terms: ComputeTerms, has_layers: bool, has_output: bool,
                   gpu: bool = False) -> int:
    """Compute buffer of a device running some layers and/or the output head: the CPU's
    phases, or with `gpu` a local GPU's (charged as if it ran the first layer, whose
    input embeddings it then holds: one activation over where it does not, which keeps
    this a charge per device the placement programs can make)."""
    if not has_layers:
        layer_peak = 0
    elif gpu:
        layer_peak = terms.gpu_layer_peak(first=True)
    else:
        layer_peak = terms.inputs + max(terms.attention, terms.ffn)
    return max(layer_peak, terms.output if has_output else 0)


def is_local_gpu(dev: Device) -> bool:
    return dev.kind in ("gpu", "igpu")


def layer_and_head_compute(terms: ComputeTerms, dev: Device) -> tuple[int, int]:
    """(compute with layers, with layers and the output head) the placement programs
    charge accelerator `dev`, as `estimate` does."""
    gpu = is_local_gpu(dev)
    return device_compute(terms, True, False, gpu), device_compute(terms, True, True, gpu)


def takes_product(dev: Device, t: TensorFact) -> bool:
    """Whether `dev` accepts weight `t` and its product (the largest tensor its ops
    accept, `Device.max_tensor_bytes`; hardware.profile.takes_weight, the probe's rule
    too): llama.cpp keeps a weight it refuses on the CPU, and runs its product there."""
    return takes_weight(t.n_bytes, t.rows, dev.max_tensor_bytes)


def head_fits(facts: ModelFacts, dev: Device) -> bool:
    """Whether the output head may go to `dev` (lavapipe refuses Gemma 3's 170 MiB
    tied head and Qwen2.5-Coder-0.5B's 137 MiB one: over its 128 MiB)."""
    head = head_tensor(facts)
    return head is None or takes_product(dev, head)


def offload_device(machine: Machine, placement: Placement) -> Device | None:
    """The GPU llama.cpp's scheduler gives CPU weights' large products: the first of
    the plan's devices with a backend that offloads ops (a local GPU; an RPC device
    offloads none)."""
    return next((d for d in machine.accelerators
                 if is_local_gpu(d) and d.name in placement.loads), None)


def offload_compute(facts: ModelFacts, placement: Placement, ctx: ContextSettings,
                    terms: ComputeTerms, dev: Device) -> int:
    """The compute buffer op_offload needs on `dev` (0: nothing to offload): a CPU
    layer's phase computed there with its largest weight copied in, or the output
    head's logits with the head's matrix copied in."""
    if effective_context(ctx).n_ubatch < OP_OFFLOAD_MIN_BATCH:
        return 0
    copied = [t.n_bytes for t in facts.tensors
              if t.layer >= 0 and placement.device_of(t) == "CPU" and takes_product(dev, t)]
    peak = 0
    if copied:
        extra = min(max(copied), int(_OFFLOAD_EXTRA_EMBD * terms.embd))
        peak = terms.gpu_layer_peak(first=True) + max(copied) + extra
    head = head_tensor(facts)
    if placement.output_device == "CPU" and head is not None and takes_product(dev, head):
        peak = max(peak, terms.output + head.n_bytes)
    return peak


def gpu_compute_reserve(facts: ModelFacts, ctx: ContextSettings) -> int:
    """What an accelerator keeps for compute if it gets layers and the output head."""
    return compute_terms(facts, ctx).total


def estimate(
    facts: ModelFacts,
    placement: Placement,
    machine: Machine,
    ctx: ContextSettings,
    repack: bool | None = None,
) -> MemoryEstimate:
    """Bytes per device for `placement` with context `ctx`.

    `repack` False: the load sets use_extra_bufts off, so no CPU weight is copied into
    CPU_REPACK and every CPU weight stays in the mapped file (`MemoryEstimate.tiers`).
    None (the default) decides from the placement: a placement with weights left on
    disk is loaded without repacking (preflight's disk step), any other with it; so
    every caller that re-estimates a plan gets the same answer."""
    if repack is None:
        repack = placement.disk_bytes == 0
    terms = compute_terms(facts, ctx)
    weights = {d: load.weights for d, load in placement.loads.items() if load.weights}
    kv = {d: load.kv for d, load in placement.loads.items() if load.kv}
    compute = _own_compute(terms, placement, machine)
    op_offload = _with_offload(facts, placement, machine, ctx, terms, compute,
                               weights, kv)
    cpu_tensors = [t for t in facts.tensors if placement.device_of(t) == "CPU"]
    repack_b = repack_bytes(cpu_tensors, machine.cpu.isa) if repack else 0
    output = output_buffer_bytes(facts, ctx)
    overhead = process_overhead(facts)
    by_device: dict[str, int] = {}
    for part in (weights, kv, compute):
        for d, b in part.items():
            by_device[d] = by_device.get(d, 0) + b
    # A repacked weight lives in CPU_REPACK; its mmap'd source pages were read once and
    # are reclaimable page cache, so the budget counts the weight once (RSS shows both
    # until the kernel reclaims the source: `MemoryEstimate.rss` adds `repack`).
    by_device["CPU"] = by_device.get("CPU", 0) + output + overhead
    return MemoryEstimate(weights=weights, repack=repack_b, kv=kv, compute=compute,
                          output=output, overhead=overhead, context=effective_context(ctx),
                          by_device=by_device, op_offload=op_offload)


def _own_compute(terms: ComputeTerms, placement: Placement, machine: Machine) -> dict[str, int]:
    """Each device's compute buffer for the layers and the head it holds (the CPU's
    for every layer when there is no accelerator)."""
    compute: dict[str, int] = {}
    for dev in machine.devices:
        has_layers = placement.decode_load(dev.name).layers > 0
        has_output = placement.output_device == dev.name
        if dev.is_cpu:
            has_layers = has_layers or not machine.accelerators
        c = device_compute(terms, has_layers, has_output, is_local_gpu(dev))
        if c:
            compute[dev.name] = c
    return compute


def _with_offload(facts: ModelFacts, placement: Placement, machine: Machine,
                  ctx: ContextSettings, terms: ComputeTerms, compute: dict[str, int],
                  weights: dict[str, int], kv: dict[str, int]) -> bool:
    """Whether the load keeps llama.cpp's op_offload on; when on, `compute` (updated)
    holds the GPU's buffer sized for it. On where it costs nothing or fits the GPU's
    budget beside its weights and KV; off where it would not: the planner never gives
    up a layer for it, since the perf model does not count the prompt time it saves."""
    dev = offload_device(machine, placement)
    if dev is None:
        return True
    need = offload_compute(facts, placement, ctx, terms, dev)
    if need <= compute.get(dev.name, 0):
        return True
    held = weights.get(dev.name, 0) + kv.get(dev.name, 0)
    if held + need > device_budgets(machine).get(dev.name, 0):
        return False
    compute[dev.name] = need
    return True


def stream_room(facts: ModelFacts, head_on_cpu: bool = True) -> int:
    """Memory a disk-bound plan needs besides its anonymous bytes: the page cache to
    stream its largest layer through (`stream_window`, with `head_on_cpu` as there)
    twice over. Twice, because reclaim cannot take the layer just computed at once: its
    pages are still referenced and survive the first scan, so the kernel needs a layer
    of slack to make room for the next. Measured on tests/tiny_q4.py (6.3 MiB layers)
    under a real cgroup limit: with room for one layer and the decode's code pages, 2 of
    60 runs were OOM-killed mid-decode with 19 MB of page cache it could not reclaim;
    with room for two, none of 40 (2026-12-03). The code pages themselves are reserved
    in an enforced limit's budget, for every plan (hardware.memory.DECODE_CODE_PAGES)."""
    return 2 * stream_window(facts, head_on_cpu)


def stream_window(facts: ModelFacts, head_on_cpu: bool = True) -> int:
    """Page cache a disk-bound decode needs at least: the largest block's weights (or
    the output head's, when `head_on_cpu`), all read within one step of the graph. The
    token embedding is read by row, so it needs no window unless it doubles as the
    output head on the CPU. With the head on an accelerator the tensors outside the
    blocks need none: the head (tied or not) computes there, and the CPU reads the
    embedding's rows (Gemma 3 270M: a 170 MiB tied head against 3.6 MiB blocks)."""
    by_rows = facts.has_output_tensor or not head_on_cpu
    per_layer: dict[int, int] = {}
    for t in facts.tensors:
        if t.layer < 0 and not head_on_cpu and not t.name.startswith("token_embd"):
            continue  # the output head and its norm: on the accelerator
        if not (by_rows and t.name.startswith("token_embd")):
            per_layer[t.layer] = per_layer.get(t.layer, 0) + t.n_bytes
    return max(per_layer.values(), default=0)
