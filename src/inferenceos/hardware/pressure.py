"""The pressure sensor: free memory per device, sampled at a fixed cadence, and the
hysteresis that turns a noisy signal into rare, deliberate transitions.

Sources are callables returning `{device name: DeviceMemory}` with llama.cpp device
names (`CPU`, `CUDA0`, `RPC[127.0.0.1:50052]`): RAM and the cgroup limit
(`ram_source`), NVML where `pynvml` is importable (`nvml_source`), RPC workers' offered
memory through their info endpoints (`rpc_source`). A source that fails is skipped for
that sample (a lost worker is the cluster code's to report, not a reason to stop
sampling the rest).

`PressureSensor.inject(device, free_bytes)` is the test hook: it overrides one device's
free memory in every later sample until lifted with `None`, so tests and benchmarks can
play a pressure signal without filling real memory.

`Hysteresis` is the anti-flapping rule (the contract): a signal at or above `high`
continuously for `dwell_s` enters the pressured state; at or below `low` continuously
for `dwell_s` leaves it; and two transitions are never closer than `dwell_s`. An
oscillating signal around one watermark therefore causes at most one transition per
dwell period (none at all when it never stays on one side for a whole dwell).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

DOWN, UP = "down", "up"  # transitions: into pressure (migrate down), out of it (back up)


@dataclass(frozen=True)
class DeviceMemory:
    """One device's memory as sampled: what is free now, and its size."""

    free_bytes: int
    total_bytes: int


Source = Callable[[], Mapping[str, DeviceMemory]]


@dataclass(frozen=True)
class Sample:
    """One reading of every source at monotonic time `t`."""

    t: float
    devices: dict[str, DeviceMemory]
    injected: frozenset[str] = frozenset()  # devices whose figure came from inject()


def ram_source() -> dict[str, DeviceMemory]:
    """The CPU device: RAM usable now (MemAvailable within the cgroup limit)."""
    from inferenceos.hardware.memory import detect_memory

    mem = detect_memory()
    total = mem.total_bytes
    if mem.cgroup_limit_bytes is not None:
        total = min(total, mem.cgroup_limit_bytes) if total else mem.cgroup_limit_bytes
    return {"CPU": DeviceMemory(max(0, mem.usable_bytes), max(0, total))}


_NO_NVML: list[bool] = []  # set once NVML proved absent: not looked for every second


def nvml_source() -> dict[str, DeviceMemory]:
    """NVIDIA GPUs through NVML as CUDA0, CUDA1... ({} without pynvml or a driver)."""
    if _NO_NVML:
        return {}
    try:
        import pynvml
    except ImportError:
        _NO_NVML.append(True)
        return {}
    try:
        pynvml.nvmlInit()
    except Exception:  # no driver now (it may come back): nothing this sample
        return {}
    try:
        out = {}
        for i in range(pynvml.nvmlDeviceGetCount()):
            info = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i))
            out[f"CUDA{i}"] = DeviceMemory(int(info.free), int(info.total))
        return out
    finally:
        pynvml.nvmlShutdown()


class PressureSensor:
    """Samples its sources (thread-safe); `inject` overrides a device (test hook)."""

    def __init__(self, sources: Iterable[Source] = (ram_source,),
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.sources = list(sources)
        self._clock = clock
        self._injected: dict[str, DeviceMemory] = {}
        self._lock = threading.Lock()
        self.last: Sample | None = None

    def inject(self, device: str, free_bytes: int | None, total_bytes: int = 0) -> None:
        """Report `free_bytes` free on `device` from now on (None: real readings again)."""
        with self._lock:
            if free_bytes is None:
                self._injected.pop(device, None)
            else:
                self._injected[device] = DeviceMemory(max(0, free_bytes), total_bytes)

    def sample(self) -> Sample:
        """Read every source now; injected figures replace (or add) their devices."""
        devices: dict[str, DeviceMemory] = {}
        for source in self.sources:
            try:
                devices.update(source())
            except Exception:  # one broken source must not blind the others
                continue
        with self._lock:
            for name, mem in self._injected.items():
                total = mem.total_bytes or devices.get(name, mem).total_bytes
                devices[name] = DeviceMemory(mem.free_bytes, total)
            injected = frozenset(self._injected)
        self.last = Sample(self._clock(), devices, injected)
        return self.last


@dataclass
class Hysteresis:
    """High / low watermarks with a dwell time (see the module contract)."""

    high: float
    low: float
    dwell_s: float
    pressured: bool = False
    _since: float | None = field(default=None, repr=False)  # first sample past the mark
    _last_change: float = field(default=float("-inf"), repr=False)

    def __post_init__(self) -> None:
        if self.low > self.high:
            raise ValueError(f"low watermark {self.low} is above the high one {self.high}")

    def update(self, value: float, now: float) -> str | None:
        """Feed one sample; DOWN when entering pressure, UP when leaving, else None."""
        beyond = value <= self.low if self.pressured else value >= self.high
        if not beyond:
            self._since = None
            return None
        if self._since is None:
            self._since = now
        if now - self._since < self.dwell_s or now - self._last_change < self.dwell_s:
            return None
        self.pressured = not self.pressured
        self._since = None
        self._last_change = now
        return DOWN if self.pressured else UP

    def force(self, pressured: bool, now: float) -> None:
        """Set the state after an action taken outside `update` (a failed migration
        leaves it as it was; a manual one counts as a transition)."""
        self.pressured = pressured
        self._since = None
        self._last_change = now
