"""The machine as the planner sees it: a list of Devices with budgets and speeds.

The planner never reads a HardwareProfile directly; it reads `Machine`, built from
- a HardwareProfile-shaped JSON dict (`machine_from_profile_json`), i.e. what
  `inferenceos hardware --json` prints or the cached profile holds;
- a profile file (`load_profile_file`, for `--hardware PROFILE.json`);
- this machine (`local_machine`: the cached profile when there is one, else a cheap
  probe of CPU and RAM without bandwidth measurement);
- CLI overrides (`apply_overrides`: `--gpu-memory 4GiB --ram 32GiB ...`) that describe
  hypothetical machines.

Figures that were not measured are marked `assumed` and named in `Machine.notes`, so a
report can say which of its numbers rest on an assumption.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from inferenceos.errors import UsageError
from inferenceos.units import parse_size as parse_size  # re-exported: callers of old

GB = 1e9

# Used only when nothing better is known; every use is reported in Machine.notes.
ASSUMED_RAM_GBPS = 20.0
ASSUMED_DISK_GBPS = 1.0
ASSUMED_GPU_GBPS = 300.0
ASSUMED_GPU_TFLOPS = 20.0
# the share of a GPU's bandwidth decode reaches (plan/perf.py), an assumption until GPU
# runs are calibrated; a rate `hardware` measured is what was reached (_gpu)
GPU_BW_EFFICIENCY = 0.8
ASSUMED_LINK_GBPS = 12.0  # PCIe 4.0 x16 as achieved, roughly
# RAM the OS and other processes keep when a budget comes from the total, not "available"
RAM_RESERVE_FRACTION = 0.1
GPU_RESERVE_FRACTION = 0.05  # driver/context overhead kept free on each accelerator


@dataclass(frozen=True)
class Device:
    """One place tensors can live and be computed on.

    `memory_bytes` is the budget the planner may fill; `bandwidth_gbps` the memory
    bandwidth a matrix-vector product sees (GB/s = 1e9 B/s); `tflops` a compute
    estimate (GPU only: CPU compute comes from the calibrated per-thread rates of
    `perf.Calibration`); `link_gbps` the host link activations cross (0 for the CPU).
    `llama_name` is the ggml backend device name (CPU, CUDA0, Vulkan0, RPC[host:port]).
    """

    name: str
    kind: str  # cpu | gpu | igpu | rpc
    memory_bytes: int
    bandwidth_gbps: float
    tflops: float = 0.0
    link_gbps: float = 0.0
    threads: int = 1
    isa: tuple[str, ...] = ()
    assumed: tuple[str, ...] = ()  # which figures are assumptions
    llama_name: str = ""
    # RPC devices (kind "rpc", served by an `inferenceos worker`): the measured round
    # trip to the worker and what the device is over there ("cpu", "gpu"); link_gbps
    # is then the network bandwidth to it
    rtt_s: float = 0.0
    remote_kind: str = ""
    # an RPC device served from this very machine (same kernel boot id: loopback or a
    # network namespace): its compute takes this machine's cores, its memory this RAM
    co_located: bool = False
    # the largest tensor an op on this device accepts (0: no limit known); llama.cpp
    # keeps a larger weight on the CPU, and computes its op there (lavapipe: 128 MiB,
    # under Gemma 3's 170 MiB tied output head)
    max_tensor_bytes: int = 0  # see hardware.profile.takes_weight

    @property
    def is_remote(self) -> bool:
        return self.kind == "rpc"

    @property
    def computes_like_cpu(self) -> bool:
        """A CPU here or a worker's CPU: the perf model's CPU rates apply."""
        return self.kind == "cpu" or (self.kind == "rpc" and self.remote_kind == "cpu")

    @property
    def is_cpu(self) -> bool:
        return self.kind == "cpu"

    def to_json(self) -> dict[str, Any]:
        """The fields, tuples as lists and `llama_name` defaulting to `name`; a remote
        device's own fields only for one, `max_tensor_bytes` only where known."""
        skip = set() if self.is_remote else {"rtt_s", "remote_kind", "co_located"}
        if not self.max_tensor_bytes:
            skip.add("max_tensor_bytes")
        out = {k: v for k, v in asdict(self).items() if k not in skip}
        return {**out, "isa": list(self.isa), "assumed": list(self.assumed),
                "llama_name": self.llama_name or self.name}


@dataclass(frozen=True)
class Machine:
    """The CPU (always first) and the accelerators, plus the disk models stream from."""

    devices: tuple[Device, ...]
    disk_gbps: float = ASSUMED_DISK_GBPS
    notes: tuple[str, ...] = field(default_factory=tuple)
    source: str = "unknown"
    lost: tuple[str, ...] = ()  # workers asked for but left out, each with the reason
    # cold random reads of 64 KiB (hardware/disk.py), shown beside the sequential
    # figure; streamed weights are read at the sequential one (`disk_gbps`): mmap faults
    # on contiguous tensors are served by the kernel's read-around window (read_ahead_kb)
    disk_random_gbps: float | None = None

    @property
    def cpu(self) -> Device:
        return self.devices[0]

    @property
    def accelerators(self) -> tuple[Device, ...]:
        return self.devices[1:]

    @property
    def total_memory(self) -> int:
        """RAM plus dedicated accelerator memory (an iGPU shares RAM: not added)."""
        return sum(d.memory_bytes for d in self.devices if d.kind != "igpu")

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "disk_gbps": self.disk_gbps,
            "disk_random_gbps": self.disk_random_gbps,
            "notes": list(self.notes),
            "devices": [d.to_json() for d in self.devices],
            **({"lost_workers": list(self.lost)} if self.lost else {}),
        }




def device_budgets(machine: Machine) -> dict[str, int]:
    """Bytes the plan may fill per device (accelerators keep a driver reserve)."""
    out = {"CPU": machine.cpu.memory_bytes}
    for d in machine.accelerators:
        out[d.name] = int(d.memory_bytes * (1 - GPU_RESERVE_FRACTION))
    return out


def _cpu_from_json(data: dict[str, Any], notes: list[str]) -> Device:
    cpu = data.get("cpu") or {}
    mem = data.get("memory") or {}
    bw = data.get("bandwidth") or {}
    ram = int(mem.get("usable_bytes") or 0)
    if not ram:
        ram = int(int(mem.get("total_bytes") or 0) * (1 - RAM_RESERVE_FRACTION))
    assumed = []
    gbps = bw.get("ram_read_gbps")
    if not gbps:
        gbps = ASSUMED_RAM_GBPS
        assumed.append("bandwidth")
        notes.append(
            f"RAM bandwidth not measured: assumed {ASSUMED_RAM_GBPS:g} GB/s "
            "(run `inferenceos hardware` to measure it)"
        )
    return Device(
        name="CPU",
        kind="cpu",
        memory_bytes=ram,
        bandwidth_gbps=float(gbps),
        threads=int(cpu.get("usable_threads") or cpu.get("threads") or 1),
        isa=tuple(cpu.get("isa") or ()),
        assumed=tuple(assumed),
        llama_name="CPU",
    )


def _gpu_devices(data: dict[str, Any], notes: list[str]) -> list[Device]:
    """GPUs from llama.cpp's own device list when present (its names are what the
    tensor overrides need), else from the vendor-tool list."""
    link = (data.get("bandwidth") or {}).get("host_to_device_gbps") or ASSUMED_LINK_GBPS
    out: list[Device] = []
    llama_devs = [d for d in data.get("llama_devices") or [] if d.get("type") in ("gpu", "igpu")]
    gpus = data.get("gpus") or []
    for i, d in enumerate(llama_devs or gpus):
        if llama_devs:
            name, kind = str(d.get("name")), str(d.get("type"))
            mem = int(d.get("memory_free_bytes") or d.get("memory_total_bytes") or 0)
        else:
            name, kind = f"GPU{i}", "igpu" if d.get("integrated") else "gpu"
            mem = int(d.get("memory_free_bytes") or d.get("memory_total_bytes") or 0)
        gpu = _gpu(name, kind, mem, float(link), notes, measured=d)
        # probed by `hardware` (llama_probe.max_tensor_bytes); absent in older profiles
        out.append(replace(gpu, max_tensor_bytes=int(d.get("max_tensor_bytes") or 0)))
    return out


def _gpu(name: str, kind: str, mem: int, link: float, notes: list[str],
         measured: dict[str, Any] | None = None) -> Device:
    """A local GPU, its compute assumed. Its decode read rate and its copy rate from the
    host are `measured`'s where `hardware` measured them (hardware/device_speed.py:
    the rate a token's weights are read at there; the perf model scales a bandwidth by
    GPU_BW_EFFICIENCY, divided out here), else assumed; each assumption is in `notes`."""
    read = float((measured or {}).get("read_gbps") or 0)
    assumed: tuple[str, ...]
    if read:
        notes.append(f"{name}: {ASSUMED_GPU_TFLOPS:g} TFLOPS assumed (decode read rate "
                     f"{read:g} GB/s measured)")
        gbps, assumed = read / GPU_BW_EFFICIENCY, ("tflops",)
        link = float((measured or {}).get("host_copy_gbps") or link)
    else:
        notes.append(f"{name}: bandwidth {ASSUMED_GPU_GBPS:g} GB/s and "
                     f"{ASSUMED_GPU_TFLOPS:g} TFLOPS assumed (not measured; override with "
                     "--gpu-bandwidth)")
        gbps, assumed = ASSUMED_GPU_GBPS, ("bandwidth", "tflops")
    return Device(name=name, kind=kind, memory_bytes=mem, bandwidth_gbps=gbps,
                  tflops=ASSUMED_GPU_TFLOPS, link_gbps=link, assumed=assumed,
                  llama_name=name)


def machine_from_profile_json(data: dict[str, Any], source: str = "profile") -> Machine:
    """Build a Machine from a HardwareProfile's JSON (missing parts take assumptions)."""
    if not isinstance(data, dict):
        raise UsageError(f"{source}: a hardware profile must be a JSON object")
    notes: list[str] = []
    cpu = _cpu_from_json(data, notes)
    disk = (data.get("bandwidth") or {}).get("disk_read_gbps")
    rnd = (data.get("bandwidth") or {}).get("disk_random_read_gbps")
    if not disk:
        notes.append(f"disk bandwidth not measured: assumed {ASSUMED_DISK_GBPS:g} GB/s")
    return Machine(
        devices=(cpu, *_gpu_devices(data, notes)),
        disk_gbps=float(disk or ASSUMED_DISK_GBPS),
        disk_random_gbps=float(rnd) if rnd else None,
        notes=tuple(notes),
        source=source,
    )


def load_profile_file(path: str | Path) -> Machine:
    """Machine from a `--hardware PROFILE.json` file; UsageError when unreadable."""
    p = Path(path).expanduser()
    try:
        data = json.loads(p.read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read hardware profile {p}: {exc}") from None
    return machine_from_profile_json(data, source=str(p))


def _probe_json() -> dict[str, Any]:
    """A profile-shaped dict for this machine without measuring anything: the cached
    HardwareProfile if there is one, else the hardware package's cheap CPU/RAM probes,
    else /proc directly."""
    try:
        from inferenceos.hardware.cache import load_cached
        from inferenceos.hardware.cpu import detect_cpu
        from inferenceos.hardware.memory import detect_memory

        cached = load_cached()
        if cached is not None:
            # memory is read now, never from the cache: the profile may have been taken
            # outside the memory cgroup this process runs in (a stale budget OOMs)
            return {**cached.to_json(), "memory": asdict(detect_memory())}

        return {"cpu": asdict(detect_cpu()), "memory": asdict(detect_memory())}
    except Exception:  # the hardware package is optional to the planner
        return _proc_json()


def _proc_json() -> dict[str, Any]:
    mem: dict[str, int] = {}
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            key, _, rest = line.partition(":")
            if rest.strip().endswith("kB"):
                mem[key] = int(rest.split()[0]) * 1024
    except OSError:
        pass
    threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
    return {
        "cpu": {"usable_threads": threads},
        "memory": {
            "total_bytes": mem.get("MemTotal", 0),
            "usable_bytes": mem.get("MemAvailable", 0),
        },
    }


def local_machine() -> Machine:
    """This machine, cheaply (no bandwidth measurement)."""
    data = _probe_json()
    return machine_from_profile_json(data, source="this machine")


@dataclass(frozen=True)
class Overrides:
    """CLI overrides; None keeps the profile's figure. A `gpu_memory` list replaces the
    accelerators with that many hypothetical GPUs."""

    ram: int | None = None
    gpu_memory: tuple[int, ...] | None = None
    threads: int | None = None
    ram_gbps: float | None = None
    gpu_gbps: float | None = None
    gpu_tflops: float | None = None
    link_gbps: float | None = None
    disk_gbps: float | None = None


def apply_overrides(machine: Machine, o: Overrides) -> Machine:
    """Machine with `o` applied; overridden figures are no longer 'assumed'."""
    cpu = machine.cpu
    if o.ram is not None:
        cpu = replace(cpu, memory_bytes=o.ram)
    if o.threads:
        cpu = replace(cpu, threads=o.threads)
    if o.ram_gbps:
        cpu = replace(
            cpu,
            bandwidth_gbps=o.ram_gbps,
            assumed=tuple(a for a in cpu.assumed if a != "bandwidth"),
        )
    notes = list(machine.notes)
    remote = [d for d in machine.accelerators if d.is_remote]  # workers stay as they are
    gpus = [d for d in machine.accelerators if not d.is_remote]
    if o.gpu_memory is not None and len(o.gpu_memory) == len(gpus):
        # this machine's GPUs, each given that budget: their names stay llama.cpp's
        # (Vulkan0, CUDA0), which the memory budget, the caps and a plan's devices use
        gpus = [replace(g, memory_bytes=m) for g, m in zip(gpus, o.gpu_memory, strict=True)]
    elif o.gpu_memory is not None:
        notes = [n for n in notes if not n.startswith(("GPU", "CUDA", "Vulkan", "ROCm"))]
        gpus = [
            _gpu(f"GPU{i}", "gpu", m, ASSUMED_LINK_GBPS, notes) for i, m in enumerate(o.gpu_memory)
        ]
    gpus = [*remote, *(_override_gpu(g, o) for g in gpus)]
    if o.gpu_gbps or o.gpu_tflops:
        notes = [n for n in notes if "assumed (not measured" not in n]
    if o.ram_gbps:
        notes = [n for n in notes if not n.startswith("RAM bandwidth")]
    if o.disk_gbps:
        notes = [n for n in notes if not n.startswith("disk bandwidth")]
    return Machine(
        devices=(cpu, *gpus),
        disk_gbps=o.disk_gbps or machine.disk_gbps,
        # an asked disk speed is the one to stream at
        disk_random_gbps=None if o.disk_gbps else machine.disk_random_gbps,
        notes=tuple(notes),
        source=machine.source + (" + overrides" if o != Overrides() else ""),
        lost=machine.lost,
    )


def _override_gpu(g: Device, o: Overrides) -> Device:
    assumed = set(g.assumed)
    if o.gpu_gbps:
        g = replace(g, bandwidth_gbps=o.gpu_gbps)
        assumed.discard("bandwidth")
    if o.gpu_tflops:
        g = replace(g, tflops=o.gpu_tflops)
        assumed.discard("tflops")
    if o.link_gbps:
        g = replace(g, link_gbps=o.link_gbps)
    return replace(g, assumed=tuple(sorted(assumed)))


# -- remote devices (inferenceos worker, llama.cpp RPC) ----------------------------------

ASSUMED_NET_GBPS = 0.1  # ~1 Gbit/s Ethernet, when the link was not measured
ASSUMED_RTT_S = 0.5e-3


def with_workers(machine: Machine, rpc: Any, refresh: bool = False) -> Machine:
    """`machine` plus the devices of the workers at `rpc` (`"host:port,..."` or a list),
    asked now through their info endpoints. Each worker device becomes a `Device` of
    kind "rpc" named `RPC[host:port]` (`#i` for its device i > 0), with the memory the
    worker offers (its `--mem` cap, or `host:port=SIZE`), the worker's RAM bandwidth
    and threads, and the measured link. Workers that do not answer, are busy with
    another client or serve nothing are left out and listed in `Machine.lost`.

    Remote devices come before local GPUs: llama.cpp gives the first devices of its list
    the first offloaded layers, and the planner keeps the fastest devices for the last
    layers and the output head (see placement.py)."""
    from inferenceos.cluster.probe import probe_workers
    from inferenceos.endpoint import parse_endpoints

    endpoints = parse_endpoints(rpc)
    if not endpoints:
        return machine
    remote: list[Device] = []
    notes, lost = list(machine.notes), list(machine.lost)
    for probe in probe_workers(endpoints, refresh=refresh):
        if not probe.usable or probe.info is None:
            lost.append(probe.error)
            notes.append(f"left out: {probe.error}")
            continue
        remote += _worker_devices(probe, notes)
    local_gpus = [d for d in machine.accelerators if not d.is_remote]
    asked = {ep.device_name() for ep in endpoints}  # asked again: their old entries go
    old_remote = [d for d in machine.accelerators
                  if d.is_remote and d.name.split("#")[0] not in asked]
    return replace(
        machine, devices=(machine.cpu, *old_remote, *remote, *local_gpus),
        notes=tuple(notes), lost=tuple(lost),
    )


def _worker_devices(probe: Any, notes: list[str]) -> list[Device]:
    from inferenceos.cluster.info import host_id

    info, ep, link = probe.info, probe.endpoint, probe.link
    here = bool(info.host_id) and info.host_id == host_id()
    if here:
        notes.append(f"worker {ep.address} runs on this machine: its memory is this "
                     "machine's RAM and its compute takes this machine's cores")
    out = []
    left = ep.mem_cap
    for pos, d in enumerate(info.devices):  # RPC device numbers are positions
        memory = d.offered_bytes if left is None else min(d.offered_bytes, left)
        if left is not None:
            left -= memory
        assumed = []
        if d.type == "cpu":
            gbps, tflops = info.ram_read_gbps, 0.0
            if not gbps:
                gbps = ASSUMED_RAM_GBPS
                assumed.append("bandwidth")
        else:
            gbps, tflops = ASSUMED_GPU_GBPS, ASSUMED_GPU_TFLOPS
            assumed += ["bandwidth", "tflops"]
        if link is None:
            assumed.append("link")
        name = ep.device_name(pos)
        out.append(Device(
            name=name, kind="rpc", memory_bytes=max(0, memory), bandwidth_gbps=float(gbps),
            tflops=tflops, link_gbps=link.bandwidth_gbps if link else ASSUMED_NET_GBPS,
            threads=info.threads, assumed=tuple(assumed), llama_name=name,
            rtt_s=link.rtt_s if link else ASSUMED_RTT_S, remote_kind=d.type, co_located=here,
        ))
        if assumed:
            notes.append(f"{name}: {', '.join(assumed)} assumed (not measured)")
    return out
