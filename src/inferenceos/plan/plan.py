"""The Plan: how to load a model here, as one printable, JSON-saveable record, and its
translation into llama.cpp parameters."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inferenceos.atomic import write_json_atomic
from inferenceos.plan.memory import ContextSettings, MemoryEstimate
from inferenceos.plan.placement import Placement
from inferenceos.units import format_bytes

EXPERT_TENSORS = r"ffn_(up|down|gate|gate_up)_exps"


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

    # -- llama.cpp parameters ------------------------------------------------------------

    @property
    def n_gpu_layers(self) -> int:
        """llama.cpp offloads the last n_gpu_layers layers; one more means the output head."""
        out = 1 if self.placement.output_device != "CPU" else 0
        return self.placement.gpu_layers + out

    @property
    def tensor_split(self) -> list[float]:
        """Fraction of offloaded layers per accelerator, in device order."""
        counts = [sum(1 for d in self.placement.dense if d == a) for a in self.accelerators]
        total = sum(counts)
        return [c / total for c in counts] if total else []

    @property
    def main_gpu(self) -> int:
        split = self.tensor_split
        return max(range(len(split)), key=lambda i: split[i]) if split else 0

    @property
    def tensor_overrides(self) -> list[tuple[str, str]]:
        """(regex, buffer type) pairs for llama.cpp's tensor_buft_overrides: routed
        experts of offloaded layers that stay in RAM."""
        layers = self.placement.cpu_expert_layers
        if not layers:
            return []
        alt = "|".join(str(i) for i in layers)
        return [(rf"blk\.({alt})\.{EXPERT_TENSORS}", "CPU")]

    def llama_params(self) -> dict[str, Any]:
        c = self.ctx
        return {
            "n_ctx": c.n_ctx,
            "n_batch": c.n_batch,
            "n_ubatch": c.n_ubatch,
            "n_seq_max": c.n_seq,
            "type_k": c.type_k,
            "type_v": c.type_v,
            "flash_attn": c.flash_attn,
            "swa_full": c.swa_full,
            "n_threads": self.threads,
            "n_threads_batch": self.threads,
            "n_gpu_layers": self.n_gpu_layers,
            "tensor_split": self.tensor_split,
            "main_gpu": self.main_gpu,
            "devices": list(self.accelerators),
            "tensor_buft_overrides": [f"{p}={b}" for p, b in self.tensor_overrides],
            "use_mmap": self.use_mmap,
        }

    def load_settings(self) -> Any:
        """The engine's LoadSettings for this plan.

        Forward-compatible: the KV types, swa_full, n_seq_max, tensor overrides,
        tensor_split and main_gpu are passed when LoadSettings has fields of those names;
        `lost_in_load_settings()` lists what the current LoadSettings cannot carry.
        """
        import dataclasses

        from inferenceos.engine.session import LoadSettings

        c = self.ctx
        names = {f.name for f in dataclasses.fields(LoadSettings)}
        extra = {k: v for k, v in self._extra_settings().items() if k in names}
        return LoadSettings(
            n_ctx=c.n_ctx,
            n_batch=c.n_batch,
            n_ubatch=c.n_ubatch,
            n_threads=self.threads,
            n_threads_batch=self.threads,
            n_gpu_layers=self.n_gpu_layers,
            flash_attn=1 if c.flash_attn else 0,
            use_mmap=self.use_mmap,
            **extra,
        )

    def _extra_settings(self) -> dict[str, Any]:
        c = self.ctx
        return {
            "type_k": c.type_k,
            "type_v": c.type_v,
            "swa_full": c.swa_full,
            "n_seq_max": c.n_seq,
            "tensor_buft_overrides": tuple(self.tensor_overrides),
            "tensor_split": tuple(self.tensor_split),
            "main_gpu": self.main_gpu,
        }

    def lost_in_load_settings(self) -> list[str]:
        """Settings of this plan that differ from llama.cpp's defaults but that the
        engine's LoadSettings has no field for (the load would not honour them)."""
        import dataclasses

        from inferenceos.engine.session import LoadSettings

        names = {f.name for f in dataclasses.fields(LoadSettings)}
        defaults = {
            "type_k": "f16",
            "type_v": "f16",
            "swa_full": True,
            "n_seq_max": 1,
            "tensor_buft_overrides": (),
            "tensor_split": (),
            "main_gpu": 0,
        }
        return [
            k
            for k, v in self._extra_settings().items()
            if k not in names and v != defaults[k] and not (k == "tensor_split" and len(v) <= 1)
        ]

    # -- presentation ---------------------------------------------------------------------

    def summary(self) -> str:
        """One line, for `run`: context, KV, placement, memory."""
        c = self.ctx
        where = (
            f"{self.placement.gpu_layers}/{len(self.placement.dense)} layers on "
            f"{', '.join(self.accelerators)}"
            if self.placement.gpu_layers
            else "CPU only"
        )
        mem = ", ".join(f"{d} {format_bytes(b)}" for d, b in self.memory.by_device.items())
        flags = " · disk-bound (mmap)" if self.disk_bound else ""
        return (
            f"plan: ctx {c.n_ctx} · KV {c.type_k}/{c.type_v} · flash-attn "
            f"{'on' if c.flash_attn else 'off'} · ubatch {c.n_ubatch} · {where} · "
            f"{self.threads} thread{'s' if self.threads != 1 else ''} · {mem}{flags}"
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
        }

    def save(self, path: str | Path) -> None:
        write_json_atomic(Path(path), self.to_json())

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2)
