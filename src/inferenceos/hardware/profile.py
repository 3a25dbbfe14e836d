"""The HardwareProfile record: what this machine is, as one typed, JSON-able value.

Every part is a frozen dataclass whose fields are plain JSON types (str, int, float,
bool, None, lists and dicts of those). `HardwareProfile.to_json()` and
`HardwareProfile.from_json()` round-trip exactly; unknown keys in stored JSON are ignored
and missing ones take their defaults, so a profile written by an older version still loads
(the cache then refreshes it anyway when `SCHEMA_VERSION` changed).

Sizes are bytes, bandwidths GB/s (10^9 bytes per second), as the keys say.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, TypeVar

SCHEMA_VERSION = 2  # 2: llama_speed (the probe the perf model calibrates on)


@dataclass(frozen=True)
class CpuInfo:
    """The CPU as llama.cpp cares about it.

    `flags` is every feature flag the OS reports (as /proc/cpuinfo spells them);
    `isa` is the normalised subset that matters to llama.cpp kernels (avx2, avx512f,
    avx512_vnni, avx512_bf16, amx_int8, f16c, fma, neon, sve, ...).
    `cores` counts physical cores, `threads` logical CPUs online (what `nproc --all`
    says); `usable_threads` is what this process may run on (affinity, cgroup quota).
    """

    model: str = "unknown"
    arch: str = "unknown"
    cores: int = 1
    threads: int = 1
    usable_threads: int = 1
    sockets: int = 1
    numa_nodes: int = 1
    flags: list[str] = field(default_factory=list)
    isa: list[str] = field(default_factory=list)
    cache_bytes: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class MemoryInfo:
    """System RAM, swap, huge pages and the container's limit if there is one.

    `usable_bytes` is what a model may use now: min(available, cgroup limit - usage).
    """

    total_bytes: int = 0
    available_bytes: int = 0
    usable_bytes: int = 0
    swap_total_bytes: int = 0
    swap_free_bytes: int = 0
    hugepages_total: int = 0
    hugepage_size_bytes: int = 0
    cgroup_limit_bytes: int | None = None
    cgroup_usage_bytes: int | None = None


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as its vendor's tool (or the kernel) reports it.

    `integrated` GPUs share system RAM: `memory_total_bytes` is then the share of RAM
    they may use (`shared_memory_fraction` of it), `unified_memory` is true on Apple.
    `compute` is the compute capability ("8.9") on NVIDIA, the gfx target ("gfx1100")
    on AMD, the Metal family on Apple; None when unknown. `source` names where the
    figures came from ("nvml", "nvidia-smi", "rocm-smi", "sysfs", "system_profiler",
    "xpu-smi").
    """

    vendor: str
    name: str
    index: int = 0
    memory_total_bytes: int | None = None
    memory_free_bytes: int | None = None
    compute: str | None = None
    driver_version: str | None = None
    pci_bus_id: str | None = None
    pcie_gen: int | None = None
    pcie_width: int | None = None
    integrated: bool = False
    unified_memory: bool = False
    shared_memory_fraction: float | None = None
    source: str = "unknown"


@dataclass(frozen=True)
class LlamaDevice:
    """One ggml backend device, as llama.cpp's own `ggml_backend_dev_*` report it."""

    name: str
    description: str
    type: str  # cpu | gpu | igpu | accel | meta
    backend: str
    memory_total_bytes: int
    memory_free_bytes: int
    # measured by `hardware` (device_speed.py) on a machine's one GPU: GB/s of weights a
    # decoded token reads, and of copies from host memory into the device's buffers
    read_gbps: float | None = None
    host_copy_gbps: float | None = None
    # a GPU's largest tensor its ops accept (llama_probe.max_tensor_bytes; None: no
    # limit found, or a profile cached before the probe asked): llama.cpp keeps a
    # larger weight, and its op, on the CPU
    max_tensor_bytes: int | None = None


# llama.cpp asks a device for a weight's product over this many columns before placing
# the weight there (llama-model-loader.cpp, weight_buft_supported)
WEIGHT_TEST_COLUMNS = 512


def takes_weight(n_bytes: int, rows: int, max_tensor_bytes: int | None) -> bool:
    """Whether a device whose ops take tensors up to `max_tensor_bytes` (None or 0: any)
    holds a weight of `n_bytes` and `rows` rows: the weight and its product over
    WEIGHT_TEST_COLUMNS f32 columns must both fit; llama.cpp keeps a weight the device
    refuses, and computes its product, on the CPU."""
    return not max_tensor_bytes or max(n_bytes, rows * WEIGHT_TEST_COLUMNS * 4) <= (
        max_tensor_bytes)


@dataclass(frozen=True)
class LlamaInfo:
    """What the installed llama.cpp library is and sees.

    `loaded` is false when the library is missing or failed to load; `error` says why.
    `backends` are the compiled-in (or dynamically loaded) ggml backend registries.
    """

    loaded: bool = False
    error: str | None = None
    package_version: str | None = None
    ggml_version: str | None = None
    ggml_commit: str | None = None
    lib_dir: str | None = None
    backends: list[str] = field(default_factory=list)
    devices: list[LlamaDevice] = field(default_factory=list)
    system_info: str | None = None


@dataclass(frozen=True)
class Bandwidth:
    """Measured bandwidths in GB/s, and how they were measured.

    `disk_method` says how the page cache was kept out of the disk figure: "o_direct",
    "fadvise" (pages dropped with posix_fadvise DONTNEED before reading) or "cached"
    (could not bypass it: the figure may be RAM speed). `disk_fs` is the filesystem
    type of the measured directory (tmpfs means RAM).
    """

    ram_read_gbps: float | None = None
    ram_threads: int = 0
    ram_buffer_bytes: int = 0
    disk_read_gbps: float | None = None  # sequential, cold
    disk_random_read_gbps: float | None = None  # 64 KiB blocks at random offsets, cold
    disk_path: str | None = None
    disk_method: str | None = None
    disk_fs: str | None = None
    disk_bytes: int = 0
    host_to_device_gbps: float | None = None
    seconds: float = 0.0


@dataclass(frozen=True)
class LlamaSpeed:
    """llama.cpp's own prefill and decode time on the probe model (`llama_speed.py`).

    `model_path` is the probe model: the built-in model itself, or the header copy of
    the written stand-in (its tensor data a sparse hole); `probe` says which. The times
    are the best of a few rounds at `threads` threads, flash attention as `flash_attn`,
    one ubatch of `n_ubatch` for the `prompt_tokens` prefill.
    """

    model_path: str
    threads: int
    prompt_tokens: int
    prefill_s: float
    decode_tokens: int
    decode_s: float
    n_ctx: int = 1024
    n_ubatch: int = 512
    flash_attn: bool = True
    seconds: float = 0.0
    probe: str = "synthetic"  # or "built-in model FILE" (see hardware/llama_speed.py)
    decode_s_1thread: float | None = None  # the same decode at one thread (threads > 1)
    # CPUs that other processes kept busy when it was timed (cpu_load.CpuLoad): a probe
    # beside a busy neighbour measures the contention, and is redone once it is quiet
    busy_others: float = 0.0

    @property
    def decode_tps(self) -> float:
        return self.decode_tokens / self.decode_s if self.decode_s > 0 else 0.0

    @property
    def prefill_tps(self) -> float:
        return self.prompt_tokens / self.prefill_s if self.prefill_s > 0 else 0.0


@dataclass(frozen=True)
class Recommendation:
    """The backend to use and the quantizations that fit, with the reason."""

    backend: str = "cpu"
    reason: str = ""
    compiled: bool = True
    reinstall_hint: str | None = None
    memory_budget_bytes: int = 0
    quantizations: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class HardwareProfile:
    """Everything InferenceOS knows about this machine.

    `fingerprint` identifies the hardware and software configuration it describes (see
    `inferenceos.hardware.fingerprint`); `warnings` lists every tool that was missing
    or produced output we could not read, and every disagreement between llama.cpp and
    the vendor tools. A profile is never incomplete by crashing: a part that could not
    be read keeps its defaults and adds a warning.
    """

    fingerprint: str
    created_at: float
    cpu: CpuInfo
    memory: MemoryInfo
    gpus: list[GpuInfo]
    llama: LlamaInfo
    bandwidth: Bandwidth
    recommendation: Recommendation
    platform: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    collect_seconds: float = 0.0
    schema_version: int = SCHEMA_VERSION
    llama_speed: LlamaSpeed | None = None

    @property
    def recommended_backend(self) -> str:
        return self.recommendation.backend

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict; `llama_devices` and `recommended_backend` are top-level too."""
        data = dataclasses.asdict(self)
        data["llama_devices"] = data["llama"]["devices"]
        data["recommended_backend"] = self.recommendation.backend
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> HardwareProfile:
        """Rebuild a profile from `to_json()` output; raises (KeyError, TypeError,
        ValueError) when `data` is not a profile."""
        llama = dict(data["llama"])
        llama["devices"] = [_build(LlamaDevice, d) for d in llama.get("devices", [])]
        return cls(
            fingerprint=str(data["fingerprint"]),
            created_at=float(data["created_at"]),
            cpu=_build(CpuInfo, data["cpu"]),
            memory=_build(MemoryInfo, data["memory"]),
            gpus=[_build(GpuInfo, g) for g in data["gpus"]],
            llama=_build(LlamaInfo, llama),
            bandwidth=_build(Bandwidth, data["bandwidth"]),
            recommendation=_build(Recommendation, data["recommendation"]),
            platform=dict(data.get("platform", {})),
            warnings=list(data.get("warnings", [])),
            collect_seconds=float(data.get("collect_seconds", 0.0)),
            schema_version=int(data.get("schema_version", 0)),
            llama_speed=(
                _build(LlamaSpeed, data["llama_speed"]) if data.get("llama_speed") else None
            ),
        )


_T = TypeVar("_T")


def _build(cls: type[_T], data: Any) -> _T:
    """`cls(**data)` keeping only the fields `cls` declares."""
    if not isinstance(data, dict):
        raise TypeError(f"expected an object for {cls.__name__}, got {type(data).__name__}")
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    return cls(**{k: v for k, v in data.items() if k in names})
