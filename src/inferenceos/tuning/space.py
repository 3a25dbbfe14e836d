"""The knobs `optimize` turns, llama.cpp's own defaults, and the values worth trying.

Pure: no llama.cpp, no files beyond sysfs for the core count. A `Knobs` value names
one configuration; `context_key()` groups the configurations that share a llama.cpp
context (threads can change on a live context with `llama_set_n_threads`, nothing else
can), `model_key()` those that share a loaded model (only layer placement needs a new
load).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

GPU_ALL_LAYERS = 999  # llama.cpp clamps n_gpu_layers to the model's layers (+ output)

# llama.cpp's defaults as its tools apply them (common/common.h, llama-bench): n_batch
# 2048, n_ubatch 512, flash attention "auto", an f16 KV cache, every layer on the GPU
# when there is one, and one thread per physical core (cpu_get_num_math)
LLAMA_N_BATCH = 2048
LLAMA_N_UBATCH = 512


@dataclass(frozen=True)
class Knobs:
    """One configuration of the settings `optimize` searches.

    `n_threads` computes decode steps, `n_threads_batch` prompt batches (llama.cpp
    keeps the two apart, and the best count differs: decode is bound by memory
    bandwidth, prefill by compute). `flash_attn` is llama_flash_attn_type (-1 auto,
    0 off, 1 on).
    """

    n_threads: int
    n_threads_batch: int
    n_batch: int = LLAMA_N_BATCH
    n_ubatch: int = LLAMA_N_UBATCH
    flash_attn: int = -1
    type_k: str = "f16"
    type_v: str = "f16"
    n_gpu_layers: int = 0

    def model_key(self) -> tuple[int]:
        """Configurations with equal keys share one loaded model."""
        return (self.n_gpu_layers,)

    def context_key(self) -> tuple[Any, ...]:
        """Configurations with equal keys share one llama.cpp context."""
        return (*self.model_key(), self.n_batch, self.n_ubatch, self.flash_attn,
                self.type_k, self.type_v)

    def valid(self) -> bool:
        """False for combinations llama.cpp refuses (a quantized V cache needs flash
        attention) or that make no sense (a micro-batch larger than the batch)."""
        if self.type_v != "f16" and self.flash_attn == 0:
            return False
        return self.n_ubatch <= self.n_batch and self.n_threads >= 1 and self.n_threads_batch >= 1

    def label(self) -> str:
        """A short human name, e.g. `t2/2 b512/u256 fa:on kv:q8_0/q8_0 ngl:0`."""
        fa = {-1: "auto", 0: "off", 1: "on"}.get(self.flash_attn, str(self.flash_attn))
        text = (f"t{self.n_threads}/{self.n_threads_batch} b{self.n_batch}/u{self.n_ubatch} "
                f"fa:{fa} kv:{self.type_k}/{self.type_v}")
        return text + (f" ngl:{self.n_gpu_layers}" if self.n_gpu_layers else "")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Knobs:
        """Inverse of `to_json` (unknown keys ignored; missing ones take defaults, but
        both thread counts are required)."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def physical_cores(sys_cpu: Path = Path("/sys/devices/system/cpu")) -> int:
    """Physical cores, as llama.cpp's `cpu_get_num_physical_cores` counts them (distinct
    thread-sibling sets of the online CPUs); the CPU count when sysfs says nothing."""
    siblings = set()
    for topo in sys_cpu.glob("cpu[0-9]*/topology/thread_siblings"):
        try:
            siblings.add(topo.read_text().strip())
        except OSError:
            continue
    return len(siblings) or max(1, os.cpu_count() or 1)


def usable_threads() -> int:
    """The CPUs this process may run on (affinity), the ceiling of every thread count."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def llama_defaults(has_gpu: bool, cores: int | None = None) -> Knobs:
    """The configuration llama.cpp's tools use when told nothing: the baseline."""
    n = cores or physical_cores()
    return Knobs(n_threads=n, n_threads_batch=n, n_gpu_layers=GPU_ALL_LAYERS if has_gpu else 0)


def thread_values(max_threads: int) -> list[int]:
    """Thread counts worth a trial: every count up to 8, then a spread (a quarter, half,
    three quarters, all but one, all) — beyond 8 the curve is smooth."""
    if max_threads <= 8:
        return list(range(1, max_threads + 1))
    picks = {max_threads // 4, max_threads // 2, 3 * max_threads // 4, max_threads - 1,
             max_threads}
    return sorted(p for p in picks if p >= 1)


def batch_values() -> list[tuple[int, int]]:
    """(n_batch, n_ubatch) pairs: llama.cpp's (2048, 512) and its neighbours. A smaller
    ubatch shrinks the compute buffer (Gemma's 262k-token logits) and can fit caches
    better; a larger one amortises weight reads over more tokens."""
    return [(2048, 512), (512, 512), (2048, 1024), (1024, 256), (512, 128), (256, 256)]


def kv_values() -> list[tuple[str, str]]:
    """KV cache types: f16 (llama.cpp's default), q8_0 both ways, and q8_0 K only."""
    return [("f16", "f16"), ("q8_0", "q8_0"), ("q8_0", "f16")]


def gpu_layer_values(n_layers: int) -> list[int]:
    """Layer placements for a GPU: all, three quarters, half, a quarter, none."""
    picks = [GPU_ALL_LAYERS, 3 * n_layers // 4, n_layers // 2, n_layers // 4, 0]
    return list(dict.fromkeys(p for p in picks if p >= 0))


@dataclass(frozen=True)
class Dimension:
    """One axis of the coordinate search: its name and the configurations it offers,
    each derived from the current best by `apply(best, value)`."""

    name: str
    values: tuple[Any, ...]

    def apply(self, best: Knobs, value: Any) -> Knobs:
        if self.name == "threads":
            return replace(best, n_threads=value, n_threads_batch=value)
        if self.name == "batch":
            return replace(best, n_batch=value[0], n_ubatch=value[1])
        if self.name == "flash_attn":
            return replace(best, flash_attn=value)
        if self.name == "kv":
            return replace(best, type_k=value[0], type_v=value[1])
        if self.name == "gpu_layers":
            return replace(best, n_gpu_layers=value)
        raise ValueError(f"unknown dimension {self.name!r}")


def search_space(has_gpu: bool, n_layers: int, max_threads: int | None = None) -> list[Dimension]:
    """The dimensions in the order the search visits them: placement first (it moves
    speed the most), then threads, flash attention, batch shape and KV types."""
    dims = []
    if has_gpu:
        dims.append(Dimension("gpu_layers", tuple(gpu_layer_values(n_layers))))
    dims += [
        Dimension("threads", tuple(thread_values(max_threads or usable_threads()))),
        Dimension("flash_attn", (1, 0)),
        Dimension("batch", tuple(batch_values())),
        Dimension("kv", tuple(kv_values())),
    ]
    return dims
