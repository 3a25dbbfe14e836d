"""Placement + memory model → the bytes each device must hold (a MemoryEstimate).

CPU: its weights (mmap'd from the file, or their CPU_REPACK copies), the KV of its
layers, its compute buffer, the output (logits) buffer and the process overhead.
Accelerator: its weights, the KV of its layers, its compute buffer. GPU compute
buffers use the same phase model as the CPU's (not yet checked against a GPU run).
"""

from __future__ import annotations

from inferenceos.plan.devices import Machine
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
from inferenceos.plan.model_facts import ModelFacts
from inferenceos.plan.placement import Placement


def device_compute(terms: ComputeTerms, has_layers: bool, has_output: bool) -> int:
    """Compute buffer of a device running some layers and/or the output head."""
    layer_peak = terms.inputs + max(terms.attention, terms.ffn) if has_layers else 0
    return max(layer_peak, terms.output if has_output else 0)


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
    compute: dict[str, int] = {}
    for dev in machine.devices:
        has_layers = placement.decode_load(dev.name).layers > 0
        has_output = placement.output_device == dev.name
        if dev.is_cpu:
            has_layers = has_layers or not machine.accelerators
        c = device_compute(terms, has_layers, has_output)
        if c:
            compute[dev.name] = c
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
    return MemoryEstimate(
        weights=weights,
        repack=repack_b,
        kv=kv,
        compute=compute,
        output=output,
        overhead=overhead,
        context=effective_context(ctx),
        by_device=by_device,
    )


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
