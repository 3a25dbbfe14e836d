"""The Plan: how to load a model here, as one printable, JSON-saveable record, and its
translation into llama.cpp parameters."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inferenceos.atomic import write_json_atomic
from inferenceos.plan.draft_choice import DraftPlan
from inferenceos.plan.llama_params import LlamaParams, gpu_layers_for
from inferenceos.plan.memory import ContextSettings, MemoryEstimate
from inferenceos.plan.placement import Placement
from inferenceos.plan.projector import ProjectorPlan
from inferenceos.plan.speculative import PLANNED
from inferenceos.units import format_bytes

EXPERT_TENSORS = r"ffn_(up|down|gate|gate_up)_exps"
# a layer's FFN group (placement.FFN_ROLE, as model.spec's _role buckets it): `ffn_*`
# tensors but its norms and routed experts. llama.cpp matches with std::regex_search
# (ECMAScript), which has lookahead
FFN_TENSORS = r"ffn_(?!.*norm)(?!.*_exps)"
# the output head's matrix: output.weight, or for a tied head llama.cpp's duplicate of
# token_embd.weight (the input embedding, on the CPU in any case)
HEAD_TENSORS = r"^(output|token_embd)\.weight$"


@dataclass(frozen=True)
class Change:
    """One degradation the preflight applied, and why."""

    what: str
    why: str

    def __str__(self) -> str:
        return f"{self.what} ({self.why})"


@dataclass(frozen=True)
class Plan:
    """Everything needed to load a model, plus what the planner predicted for it.

    `feasible` is False only for a refused plan (then `reason` says why, with numbers);
    `disk_bound` means weights stream from the file through mmap at every token.
    """

    model_path: str
    model_name: str
    ctx: ContextSettings
    placement: Placement
    memory: MemoryEstimate
    budgets: dict[str, int]
    threads: int
    use_mmap: bool = True
    feasible: bool = True
    disk_bound: bool = False
    reason: str = ""
    changes: tuple[Change, ...] = field(default_factory=tuple)
    accelerators: tuple[str, ...] = ()
    gpu_layers_forced: int | None = None  # a user override of n_gpu_layers (see entry.py)
    # llama parameters set after planning (optimize's stored best: plan/tuned.py); they
    # only ever lower what costs memory, so the estimate stays an upper bound
    param_overrides: tuple[tuple[str, Any], ...] = ()
    # the multimodal projector (LoadRequest.mmproj): its device and bytes, already
    # counted in `memory` (plan/projector.py)
    projector: ProjectorPlan | None = None
    # the best plans the optimizer rejected (plan/optimize.py `Candidate.to_json`), each
    # with its settings, predicted t/s and memory; filled only when asked to explain
    alternatives: tuple[dict[str, Any], ...] = ()
    # the speculative drafter (plan/draft_choice.py); None: the request did not ask
    draft: DraftPlan | None = None

    @property
    def engine_draft(self) -> str | None:
        """The engine's default drafter for this plan: None decodes plainly; an auto
        choice carries plan.speculative's PLANNED prefix (a seeded sampled request
        then decodes plainly, so its seed replays)."""
        d = self.draft
        if d is None or d.drafter is None:
            return None
        return f"{PLANNED}{d.drafter}" if d.asked == "auto" else d.drafter

    # -- llama.cpp parameters ------------------------------------------------------------

    @property
    def n_gpu_layers(self) -> int:
        """llama.cpp's n_gpu_layers for the placement (llama_params.gpu_layers_for: k
        offloaded blocks are k + 1, since llama.cpp offloads the output layer first; a
        head the plan keeps on the CPU stays there by a tensor override,
        `tensor_overrides`). Before, such a plan asked for k: llama.cpp then moved the
        head and k - 1 blocks, not the k blocks planned (Gemma 3 270M: a 170 MiB head
        where a 3.6 MiB block was budgeted)."""
        if self.gpu_layers_forced is not None:
            return self.gpu_layers_forced
        return gpu_layers_for(self.placement.gpu_layers, self.placement.output_device != "CPU")

    @property
    def tensor_split(self) -> list[float]:
        """Per accelerator (device order), the fractions llama.cpp splits the offloaded
        layers by, chosen so that its assignment is the plan's. llama.cpp spreads k
        offloaded blocks and the output layer, k + 1 slots, by cumulative fraction:
        slot j goes to the first device whose cumulative split exceeds j / (k + 1)
        (llama_model's load_tensors). Fractions by block count alone (c / k) moved
        blocks: 2 + 2 planned over two workers loaded as 3 + 1. Each boundary sits
        half a slot below the plan's, the last device with blocks ends at 1 (so the
        output slot is its own, as the placement's head must be)."""
        counts = [sum(1 for d in self.placement.dense if d == a) for a in self.accelerators]
        k = sum(counts)
        if k == 0:  # only the head offloaded, or nothing
            head = self.placement.output_device
            return [1.0 if a == head else 0.0 for a in self.accelerators] \
                if head in self.accelerators else []
        last = max(i for i, c in enumerate(counts) if c)
        cums: list[float] = []
        run = 0
        for i, c in enumerate(counts):
            run += c
            cums.append(1.0 if i >= last else (run - 0.5) / (k + 1))
        return [b - a for a, b in zip([0.0, *cums[:-1]], cums, strict=True)]

    @property
    def main_gpu(self) -> int:
        split = self.tensor_split
        return max(range(len(split)), key=lambda i: split[i]) if split else 0

    @property
    def tensor_overrides(self) -> list[tuple[str, str]]:
        """(regex, buffer type) pairs for llama.cpp's tensor_buft_overrides: the FFN
        groups and routed experts of offloaded layers that stay in RAM, and the output
        head when it stays on the CPU while blocks are offloaded (see `n_gpu_layers`; a
        tied head is llama.cpp's duplicate of token_embd.weight, which the CPU holds
        anyway)."""
        out: list[tuple[str, str]] = []
        if self.gpu_layers_forced is None and self.placement.gpu_layers \
                and self.placement.output_device == "CPU":
            out.append((HEAD_TENSORS, "CPU"))
        for layers, group in ((self.placement.cpu_ffn_layers, FFN_TENSORS),
                              (self.placement.cpu_expert_layers, EXPERT_TENSORS)):
            if layers:
                alt = "|".join(str(i) for i in layers)
                out.append((rf"blk\.({alt})\.{group}", "CPU"))
        return out

    def params(self) -> LlamaParams:
        """The one llama-parameters record the engine loads this plan with."""
        params = self._planned_params()
        return dataclasses.replace(params, **dict(self.param_overrides))

    def _planned_params(self) -> LlamaParams:
        return self.ctx.llama_params(
            n_threads=self.threads,
            n_threads_batch=self.threads,
            n_gpu_layers=self.n_gpu_layers,
            use_mmap=self.use_mmap,
            use_extra_bufts=not self.disk_bound,  # no anonymous repack of streamed weights
            stream_resident_bytes=self._resident_bytes(),
            tensor_buft_overrides=tuple(self.tensor_overrides),
            tensor_split=tuple(self.tensor_split),
            main_gpu=self.main_gpu,
            devices=self.accelerators,
            # a CPU-only plan computes on the CPU; footprint.estimate decides the rest
            op_offload=bool(self.accelerators) and self.memory.op_offload,
        )

    def _resident_bytes(self) -> int:
        """Page cache a disk-bound plan keeps its resident weights in (0: not disk-bound):
        the engine streams the rest (engine/weights/prefetch.py). An enforced limit's budget
        already leaves out the code a decode runs (hardware.memory.DECODE_CODE_PAGES),
        so locked weights leave it its pages."""
        if not self.disk_bound:
            return 0
        return max(1, self.memory.tiers(self.budgets.get("CPU", 0))["page cache"])

    def llama_params(self) -> dict[str, Any]:
        """`params()` as JSON (what `simulate --json` and `placement` print)."""
        d = dataclasses.asdict(self.params())
        d["tensor_buft_overrides"] = [f"{p}={b}" for p, b in self.tensor_overrides]
        d["tensor_split"] = list(self.tensor_split)
        d["devices"] = list(self.accelerators)
        return d

    def charge(self, warm: bool = False) -> dict[str, int]:
        """Bytes per device a loaded model of this plan holds: everything when hot;
        when warm (context freed, weights kept) its weights only."""
        m = self.memory
        if not warm:
            return dict(m.by_device)
        # what the context holds (KV cells, compute buffers, the logits buffer) is freed
        freed = {d: m.kv.get(d, 0) + m.compute.get(d, 0) for d in m.by_device}
        freed["CPU"] = freed.get("CPU", 0) + m.output
        return {d: max(0, b - freed.get(d, 0)) for d, b in m.by_device.items()}

    # -- presentation ---------------------------------------------------------------------

    def summary(self) -> str:
        """One line, for `run`: context, KV, placement, threads, memory, as loaded: the
        llama parameters after any override (optimize's stored best), not the planner's
        own picks before them."""
        c, p = self.ctx, self.params()
        where = (
            f"{self.placement.gpu_layers}/{len(self.placement.dense)} layers on "
            f"{', '.join(self.accelerators)}{self.placement.ffn_in_ram}"
            if self.placement.gpu_layers
            else "CPU only"
        )
        mem = ", ".join(f"{d} {format_bytes(b)}" for d, b in self.memory.by_device.items())
        flags = " · disk-bound (mmap)" if self.disk_bound else ""
        if self.accelerators and not p.op_offload:  # footprint.estimate: it did not fit
            flags += " · op_offload off (no room for its compute buffer)"
        if self.projector is not None:
            pp = self.projector
            flags += f" · projector {pp.kind} on {pp.device} ({format_bytes(pp.bytes)})"
        if self.memory.adapters:
            flags += " · LoRA " + ", ".join(
                f"{format_bytes(b)} on {d}" for d, b in self.memory.adapters.items())
        if self.draft is not None and (self.draft.drafter or self.draft.asked == "auto"):
            flags += f" · {self.draft.line()}"
        fa = {-1: "auto", 0: "off", 1: "on"}.get(p.flash_attn, str(p.flash_attn))
        t, tb = p.n_threads, p.n_threads_batch
        threads = f"{t} thread{'s' if t != 1 else ''}" + (
            f" ({tb} for prompts)" if tb and tb != t else "")
        return (
            f"plan: ctx {c.n_ctx} · KV {p.type_k}/{p.type_v} · flash-attn {fa} · "
            f"ubatch {p.n_ubatch} · {where} · {threads} · {mem}{flags}"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model_path,
            "name": self.model_name,
            "feasible": self.feasible,
            "disk_bound": self.disk_bound,
            "reason": self.reason,
            "changes": [{"what": ch.what, "why": ch.why} for ch in self.changes],
            "context": self.ctx.to_json(),
            "llama_params": self.llama_params(),
            "memory": self.memory.to_json(),
            "budgets": self.budgets,
            "placement": self.placement.to_json(),
            "projector": self.projector.to_json() if self.projector is not None else None,
            "alternatives": list(self.alternatives),
            "draft": self.draft.to_json() if self.draft is not None else None,
        }

    def save(self, path: str | Path) -> None:
        write_json_atomic(Path(path), self.to_json())

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2)
