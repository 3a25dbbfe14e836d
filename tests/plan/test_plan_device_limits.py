"""What a GPU's backend decides beside the placement (plan/footprint.py): the largest
tensor its ops accept (`Device.max_tensor_bytes`: lavapipe's 128 MiB keeps Gemma 3's
tied head on the CPU) and llama.cpp's op_offload, whose compute buffer on the first GPU
the planner charges where it keeps it on, and turns off where it would not fit."""

from __future__ import annotations

from dataclasses import replace

from inferenceos.hardware.profile import takes_weight
from inferenceos.plan.devices import machine_from_profile_json
from inferenceos.plan.footprint import OP_OFFLOAD_MIN_BATCH, estimate, offload_compute
from inferenceos.plan.memory import ContextSettings, compute_terms
from inferenceos.plan.optimize import Objective, solve_context
from inferenceos.plan.perf import Calibration
from inferenceos.plan.placement import build_placement, head_tensor, layer_parts
from plan_factories import GiB, machine, make_facts

MiB = 1 << 20
CTX = ContextSettings(n_ctx=4096, n_ubatch=512, n_batch=512, flash_attn=True)
# a small model with a large vocabulary: its head (32 MiB at q4_0) is its largest tensor
FACTS = make_facts(n_layer=4, n_embd=1024, n_ff=4096, n_head=16, n_head_kv=4,
                   n_vocab=56000)


def _gpu(m, limit: int):  # type: ignore[no-untyped-def]
    return replace(m, devices=(m.cpu, replace(m.accelerators[0], max_tensor_bytes=limit)))


def test_a_head_over_the_devices_largest_tensor_stays_on_the_cpu() -> None:
    head = head_tensor(FACTS)
    assert head is not None
    roomy = machine(ram=16 * GiB, gpus=(4 * GiB,))
    free = solve_context(FACTS, roomy, CTX, Calibration(), 8, Objective())
    assert free is not None and free.placement.output_device == "GPU0"
    limited = _gpu(roomy, head.n_bytes - 1)
    got = solve_context(FACTS, limited, CTX, Calibration(), 8, Objective())
    assert got is not None
    assert got.placement.output_device == "CPU" and got.placement.gpu_layers == 4
    # the head and its logits are charged to the CPU, not the device
    gpu, cpu = got.memory.by_device["GPU0"], got.memory.by_device["CPU"]
    assert gpu < free.memory.by_device["GPU0"] - head.n_bytes
    assert cpu > free.memory.by_device["CPU"] + head.n_bytes


def test_op_offload_is_charged_where_it_fits_and_off_where_it_would_not() -> None:
    parts = layer_parts(FACTS, CTX)
    dense = ["CPU", "CPU", "GPU0", "GPU0"]
    p = build_placement(FACTS, parts, dense, [None] * 4, "CPU")
    roomy = machine(ram=16 * GiB, gpus=(4 * GiB,))
    dev = roomy.accelerators[0]
    terms = compute_terms(FACTS, CTX)
    need = offload_compute(FACTS, p, CTX, terms, dev)
    own = estimate(FACTS, p, roomy, CTX)
    assert own.op_offload and own.compute["GPU0"] == need
    # the CPU layers' largest weight is copied in beside a layer's activations
    assert need > terms.gpu_layer_peak(first=True) + 4 * MiB
    held = own.weights["GPU0"] + own.kv["GPU0"]
    tight = machine(ram=16 * GiB, gpus=(int((held + need - MiB) / 0.95),))
    off = estimate(FACTS, p, tight, CTX)
    assert not off.op_offload and off.compute["GPU0"] < need
    assert off.by_device["GPU0"] <= tight.accelerators[0].memory_bytes * 0.95
    # below llama.cpp's batch for it nothing is offloaded
    small = replace(CTX, n_ubatch=OP_OFFLOAD_MIN_BATCH // 2)
    assert offload_compute(FACTS, p, small, compute_terms(FACTS, small), dev) == 0


def test_a_profile_without_the_largest_tensor_still_loads() -> None:
    """Profiles cached before the probe asked have no `max_tensor_bytes`: no limit."""
    gpu = {"name": "Vulkan0", "type": "gpu", "memory_free_bytes": 2 * GiB}
    old = machine_from_profile_json({"llama_devices": [gpu]})
    new = machine_from_profile_json({"llama_devices": [{**gpu, "max_tensor_bytes": 128 * MiB}]})
    was, now = old.accelerators[0].max_tensor_bytes, new.accelerators[0].max_tensor_bytes
    assert was == 0 and takes_weight(1 << 40, 1, was)
    assert not takes_weight(128 * MiB + 1, 1, now)
    assert new.accelerators[0].to_json()["max_tensor_bytes"] == 128 * MiB
