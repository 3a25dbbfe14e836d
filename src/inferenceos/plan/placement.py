"""Which device holds each layer, each layer's MoE experts, and the output head.

The planner's placement now comes from `plan/optimize.py` (a MILP over perf.py's cost
model, with `build_placement` below turning its decisions into a Placement); `place`,
the greedy fill described here, remains for the calibration probe and the old ladder
(`preflight.ladder_plan`), which benchmarks compare against.

Cost model: decode time per token is Σ over devices of (bytes read there / its
bandwidth) plus link crossings. Moving a byte of a dense layer from the CPU to a GPU
saves (1/bw_cpu − 1/bw_gpu) seconds per token; moving a byte of routed experts saves only
used/count of that, because a token reads only its routed experts. So under memory
budgets the best use of accelerator memory is, in order: dense parts of layers (with
their KV cache), the output head, then experts — the exchange argument makes this
greedy optimal for the linear cost model, which is why no solver is needed here (a
MILP would only matter for heterogeneous link costs, e.g. RPC devices; see docs/plan.md).

Layers go to accelerators as one contiguous block at the end of the model, because
that is what llama.cpp's `n_gpu_layers` does (the last N layers are offloaded); the
block is split over several GPUs in order (`tensor_split`). Experts that do not fit stay
on the CPU through `tensor_buft_overrides` patterns (llama.cpp's `--n-cpu-moe` / `-ot`).
Weights that do not fit in RAM either are left to mmap, read from disk as needed.

Remote devices (kind "rpc", an `inferenceos worker` on another machine) cost a network
round trip and the activations' transfer at every evaluation, on top of their compute.
A remote device whose memory is no faster than this CPU's (a worker serving its CPU)
saves nothing per byte, so it takes only the layers this machine's RAM cannot hold
(`_overflow_layers`): the layers nearest the local block, so that the offloaded block
stays contiguous. A remote GPU is used like a local one.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from typing import Any

from inferenceos.plan.devices import Device, Machine
from inferenceos.plan.memory import (
    ContextSettings,
    compute_terms,
    kv_layer_bytes,
    output_buffer_bytes,
    process_overhead,
)
from inferenceos.plan.model_facts import ModelFacts, TensorFact
from inferenceos.units import format_bytes

# The tensors of a layer that form its FFN group (model.spec's byte bucket "ffn": the
# dense FFN, a MoE's router and shared experts; not its norms or routed experts)
FFN_ROLE = "ffn"


@dataclass(frozen=True)
class LayerParts:
    """One layer's bytes and parameter counts, dense part and routed experts apart.

    `dense_*` is everything of the layer but its routed experts; `ffn_*` the part of it
    that can run away from the layer's attention (`FFN_ROLE` tensors: the dense FFN, or
    a MoE's router and shared experts), which is why it is counted in `dense_*` too."""

    index: int
    dense_bytes: int
    expert_bytes: int
    dense_params: int
    expert_params: int
    kv_bytes: int
    ffn_bytes: int = 0
    ffn_params: int = 0

    @property
    def attention_bytes(self) -> int:
        """The dense part that stays with the layer: attention, norms (not its KV)."""
        return self.dense_bytes - self.ffn_bytes

    @property
    def attention_params(self) -> int:
        return self.dense_params - self.ffn_params


@dataclass(frozen=True)
class DeviceLoad:
    """What a device holds and reads per decoded token."""

    weights: int = 0  # resident weight bytes
    kv: int = 0
    bytes_read: float = 0.0  # weight bytes read per token (routed experts: used/count)
    active_params: float = 0.0
    layers: int = 0  # layers whose attention (and KV) runs here


@dataclass(frozen=True)
class Placement:
    """Device per layer (`dense`: its attention, norms and KV), per layer's routed
    experts (`experts`, None without MoE), per layer's FFN group (`ffn`: empty when
    every one is with its layer; see `LayerParts`) and for the output head;
    `disk_bytes` are CPU weights left to stream from the file."""

    dense: tuple[str, ...]
    experts: tuple[str | None, ...]
    output_device: str
    loads: dict[str, DeviceLoad]
    disk_bytes: int = 0
    # (what, why) of each placement choice a user may not expect (the plan's "changed")
    notes: tuple[tuple[str, str], ...] = field(default_factory=tuple)
    ffn: tuple[str, ...] = ()

    def decode_load(self, device: str) -> DeviceLoad:
        return self.loads.get(device, DeviceLoad())

    def ffn_device(self, layer: int) -> str:
        """The device running layer `layer`'s FFN group."""
        return self.ffn[layer] if self.ffn else self.dense[layer]

    def device_of(self, t: TensorFact) -> str:
        """The device holding weight `t` (a tied output head also has a copy on
        `output_device`; token_embd itself always stays on the CPU)."""
        if t.layer >= 0:
            if t.role == "expert":
                return self.experts[t.layer] or "CPU"
            return self.ffn_device(t.layer) if t.role == FFN_ROLE else self.dense[t.layer]
        if t.name.startswith(("output.", "output_norm.")):
            return self.output_device
        return "CPU"

    @property
    def detours(self) -> tuple[int, ...]:
        """Layers whose FFN side (FFN group or routed experts) runs on another device
        than their attention: the activations go there and back (two crossings; the
        group and the experts are next to each other in the graph, one trip for both)."""
        out = []
        for i, (d, e) in enumerate(zip(self.dense, self.experts, strict=True)):
            if self.ffn_device(i) != d or (e is not None and e != d):
                out.append(i)
        return tuple(out)

    @property
    def crossings(self) -> int:
        """Activation transfers between devices per evaluated token (CPU→GPU block,
        block→block, back for the output head, and there and back for a `detours`
        layer)."""
        seq = [*self.dense, self.output_device]
        n = sum(1 for a, b in itertools.pairwise(seq) if a != b)
        return n + 2 * len(self.detours)

    @property
    def gpu_layers(self) -> int:
        return sum(1 for d in self.dense if d != "CPU")

    @property
    def cpu_expert_layers(self) -> tuple[int, ...]:
        pairs = enumerate(zip(self.dense, self.experts, strict=True))
        return tuple(i for i, (d, e) in pairs if e == "CPU" and d != "CPU")

    @property
    def cpu_ffn_layers(self) -> tuple[int, ...]:
        """Offloaded layers whose FFN group stays in RAM."""
        return tuple(i for i, d in enumerate(self.dense)
                     if d != "CPU" and self.ffn_device(i) == "CPU")

    @property
    def ffn_in_ram(self) -> str:
        """" (FFN of N in RAM)" for a plan's one-line summaries; "" when none is."""
        n = len(self.cpu_ffn_layers)
        return f" (FFN of {n} in RAM)" if n else ""

    def to_json(self) -> dict[str, Any]:
        return {
            "layers": [
                {"layer": i, "dense": d, "ffn": self.ffn_device(i), "experts": e}
                for i, (d, e) in enumerate(zip(self.dense, self.experts, strict=True))
            ],
            "output_device": self.output_device,
            "disk_bytes": self.disk_bytes,
            "loads": {k: v.__dict__ for k, v in self.loads.items()},
            "notes": [{"what": w, "why": y} for w, y in self.notes],
        }


def layer_parts(facts: ModelFacts, ctx: ContextSettings) -> list[LayerParts]:
    """Per-layer bytes and parameters from the tensor table."""
    n = facts.spec.block_count
    db, eb, dp, ep = [0] * n, [0] * n, [0] * n, [0] * n
    fb, fp = [0] * n, [0] * n
    for t in facts.tensors:
        if t.layer < 0:
            continue
        if t.role == "expert":
            eb[t.layer] += t.n_bytes
            ep[t.layer] += t.n_elements
        else:
            db[t.layer] += t.n_bytes
            dp[t.layer] += t.n_elements
            if t.role == FFN_ROLE:
                fb[t.layer] += t.n_bytes
                fp[t.layer] += t.n_elements
    return [
        LayerParts(i, db[i], eb[i], dp[i], ep[i], kv_layer_bytes(facts, i, ctx), fb[i], fp[i])
        for i in range(n)
    ]


def head_tensor(facts: ModelFacts) -> TensorFact | None:
    """The output head's matrix: output.weight, or token_embd.weight when tied."""
    by_name = {t.name: t for t in facts.tensors}
    return by_name.get("output.weight") or by_name.get("token_embd.weight")


def output_head(facts: ModelFacts) -> tuple[int, int]:
    """(bytes, params) of the output projection (token_embd when tied) and final norm."""
    head = head_tensor(facts)
    norm = next((t for t in facts.tensors if t.name == "output_norm.weight"), None)
    b = (head.n_bytes if head else 0) + (norm.n_bytes if norm else 0)
    p = (head.n_elements if head else 0) + (norm.n_elements if norm else 0)
    return b, p


def routed_fraction(facts: ModelFacts) -> float:
    s = facts.spec
    return s.expert_used_count / s.expert_count if s.expert_count else 0.0


@dataclass
class _Budget:
    name: str
    free: int


def place(
    facts: ModelFacts,
    machine: Machine,
    ctx: ContextSettings,
    gpu_free: dict[str, int],
    max_gpu_layers: int | None = None,
    experts_on_cpu: bool = False,
) -> Placement:
    """Assign layers, experts and the output head under `gpu_free` (bytes each
    accelerator has left for weights and KV, after its compute buffer).

    `max_gpu_layers` caps the offloaded block (the preflight lowers it); with
    `experts_on_cpu` no routed expert goes to an accelerator.
    """
    parts = layer_parts(facts, ctx)
    n = len(parts)
    cap = n if max_gpu_layers is None else max(0, min(n, max_gpu_layers))
    slow = {d.name for d in machine.accelerators if _no_faster_than_cpu(d, machine)}
    if slow:
        cap = min(cap, _overflow_layers(facts, machine, ctx, parts, gpu_free, slow, cap))
    dense = ["CPU"] * n
    budgets = [_Budget(d.name, gpu_free.get(d.name, 0)) for d in machine.accelerators]
    _place_dense(parts, dense, budgets, cap)
    head_bytes, head_params = output_head(facts)
    output_device = "CPU"
    if dense and all(d != "CPU" for d in dense):
        last = next(b for b in budgets if b.name == dense[-1])
        if last.free >= head_bytes:
            last.free -= head_bytes
            output_device = last.name
    experts: list[str | None] = [None if p.expert_bytes == 0 else "CPU" for p in parts]
    if not experts_on_cpu:
        _place_experts(parts, dense, experts, budgets)
    loads = _loads(facts, parts, dense, experts, output_device, head_bytes, head_params)
    return _with_notes(facts, parts, Placement(tuple(dense), tuple(experts), output_device,
                                               loads, 0))


def build_placement(
    facts: ModelFacts,
    parts: list[LayerParts],
    dense: list[str],
    experts: list[str | None],
    output_device: str,
    disk_bytes: int = 0,
    ffn: list[str] | None = None,
) -> Placement:
    """The Placement of explicit decisions (the optimizer's): loads per device and the
    notes, as `place` computes them. `ffn` None: every FFN group with its layer."""
    head_bytes, head_params = output_head(facts)
    split = ffn if ffn is not None and list(ffn) != list(dense) else None
    loads = _loads(facts, parts, dense, experts, output_device, head_bytes, head_params, split)
    return _with_notes(facts, parts, Placement(tuple(dense), tuple(experts), output_device,
                                               loads, disk_bytes, ffn=tuple(split or ())))


def _no_faster_than_cpu(dev: Device, machine: Machine) -> bool:
    """A remote device that reads memory no faster than this CPU (within 25 %)."""
    cpu_gbps = machine.cpu.bandwidth_gbps
    return dev.is_remote and dev.computes_like_cpu and dev.bandwidth_gbps <= 1.25 * cpu_gbps


def _overflow_layers(
    facts: ModelFacts,
    machine: Machine,
    ctx: ContextSettings,
    parts: list[LayerParts],
    gpu_free: dict[str, int],
    slow: set[str],
    cap: int,
) -> int:
    """How many layers to offload when slow remote devices should only take what local
    RAM cannot hold: the fast accelerators' block, plus the fewest layers before it
    whose bytes cover the RAM overflow."""
    fast_only = {k: (0 if k in slow else v) for k, v in gpu_free.items()}
    dense = ["CPU"] * len(parts)
    budgets = [_Budget(d.name, fast_only.get(d.name, 0)) for d in machine.accelerators]
    _place_dense(parts, dense, budgets, cap)
    on_cpu = [p for p in parts if dense[p.index] == "CPU"]
    fixed = (
        compute_terms(facts, ctx).total + output_buffer_bytes(facts, ctx)
        + process_overhead(facts) + sum(t.n_bytes for t in facts.tensors if t.layer < 0)
    )
    need = fixed + sum(p.dense_bytes + p.expert_bytes + p.kv_bytes for p in on_cpu)
    overflow = need - machine.cpu.memory_bytes
    offloaded = len(parts) - len(on_cpu)
    for p in reversed(on_cpu):  # the layers just before the offloaded block go first
        if overflow <= 0:
            break
        overflow -= p.dense_bytes + p.expert_bytes + p.kv_bytes
        offloaded += 1
    return offloaded


def _place_dense(
    parts: list[LayerParts], dense: list[str], budgets: list[_Budget], cap: int
) -> None:
    """Fill accelerators with dense layer parts (+ KV) from the last layer backwards,
    in accelerator order, as one contiguous block (llama.cpp's n_gpu_layers)."""
    gi = len(budgets) - 1  # the last GPU takes the last layers
    for placed, p in enumerate(reversed(parts)):
        if placed >= cap or gi < 0:
            break
        need = p.dense_bytes + p.kv_bytes
        while gi >= 0 and budgets[gi].free < need:
            gi -= 1
        if gi < 0:
            break
        budgets[gi].free -= need
        dense[p.index] = budgets[gi].name


def _place_experts(
    parts: list[LayerParts], dense: list[str], experts: list[str | None], budgets: list[_Budget]
) -> None:
    """Experts join their layer's accelerator while it has room, last layers first."""
    by_name = {b.name: b for b in budgets}
    for p in reversed(parts):
        b = by_name.get(dense[p.index])
        if p.expert_bytes and b is not None and b.free >= p.expert_bytes:
            b.free -= p.expert_bytes
            experts[p.index] = b.name


def _loads(
    facts: ModelFacts,
    parts: list[LayerParts],
    dense: list[str],
    experts: list[str | None],
    output_device: str,
    head_bytes: int,
    head_params: int,
    ffn: list[str] | None = None,
) -> dict[str, DeviceLoad]:
    acc: dict[str, dict[str, float]] = {}

    def add(dev: str, **kw: float) -> None:
        slot = acc.setdefault(
            dev, dict.fromkeys(("weights", "kv", "bytes_read", "active_params", "layers"), 0.0)
        )
        for k, v in kw.items():
            slot[k] += v

    frac = routed_fraction(facts)
    for p in parts:
        away = ffn is not None and ffn[p.index] != dense[p.index]
        own_b = p.attention_bytes if away else p.dense_bytes
        own_p = p.attention_params if away else p.dense_params
        add(dense[p.index], weights=own_b, kv=p.kv_bytes, bytes_read=own_b,
            active_params=own_p, layers=1)
        if away and ffn is not None:
            add(ffn[p.index], weights=p.ffn_bytes, bytes_read=p.ffn_bytes,
                active_params=p.ffn_params)
        if p.expert_bytes:
            add(
                experts[p.index] or "CPU",
                weights=p.expert_bytes,
                bytes_read=p.expert_bytes * frac,
                active_params=p.expert_params * frac,
            )
    add(output_device, weights=head_bytes, bytes_read=head_bytes, active_params=head_params)
    # token_embd stays on the CPU (llama.cpp keeps the input layer there); one row read
    embd = facts.tensor_bytes("token_embd.")
    tied = not facts.has_output_tensor
    if not (tied and output_device == "CPU"):
        add("CPU", weights=embd)
    other = (
        sum(t.n_bytes for t in facts.tensors if t.layer < 0)
        - embd
        - head_bytes
        + (embd if tied else 0)
    )
    add("CPU", weights=max(other, 0))
    return {
        dev: DeviceLoad(
            int(v["weights"]), int(v["kv"]), v["bytes_read"], v["active_params"], int(v["layers"])
        )
        for dev, v in acc.items()
    }


def _with_notes(facts: ModelFacts, parts: list[LayerParts], p: Placement) -> Placement:
    """`p` with the notes of what it keeps in RAM that a user may not expect."""
    notes = []
    if p.cpu_ffn_layers:
        moved = sum(parts[i].ffn_bytes for i in p.cpu_ffn_layers)
        notes.append((
            f"FFN of {len(p.cpu_ffn_layers)} offloaded layer(s) in RAM ({_mib(moved)})",
            "their attention and KV cache are worth more per byte of accelerator memory",
        ))
    if p.cpu_expert_layers:
        moved = sum(parts[i].expert_bytes for i in p.cpu_expert_layers)
        notes.append((
            f"experts of {len(p.cpu_expert_layers)} GPU layer(s) on the CPU ({_mib(moved)})",
            f"a token reads only {facts.spec.expert_used_count} of "
            f"{facts.spec.expert_count} experts, so accelerator memory is worth more to "
            "dense layers",
        ))
    return replace(p, notes=tuple(notes))


def _mib(n: float) -> str:
    return format_bytes(n)
