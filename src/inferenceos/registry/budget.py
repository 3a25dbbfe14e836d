"""The memory budget per device: what the planner says is usable now.

Free memory is read again before each load (not 90 % of what was free when the server
started): RAM from /proc/meminfo and the cgroup limit (`hardware.memory`), accelerators
from the profile. RAM read now counts the models this manager already holds as used, so
its capacity for our models is `free now + our own charges`; an accelerator's figure is
the cached profile's, which our models' allocations never lowered, so it is already the
capacity for all of them together (adding our charges to it again had let two models
that each fill a GPU both be planned onto it). `serve --memory-budget SIZE` caps the sum
over all devices further.

Caps per device change at run time (`set_cap`: `inferenceos budget DEVICE SIZE`,
`POST /api/budget`): a cap is the most our models may hold on that device (llama.cpp's
device name: CPU, CUDA0, RPC[host:port]); a lowered cap is memory pressure, and the
pressure reactor (registry.pressure) migrates models down to fit it.

Tests inject a `machine` callable with fixed figures.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace

from inferenceos.plan.devices import Machine, local_machine

# devices whose free memory is read before each load (machine_now: RAM from /proc), so
# that what our models hold there already counts as used
LIVE = frozenset({"CPU"})


def machine_now() -> Machine:
    """This machine with RAM as usable right now (the rest of the profile cached)."""
    machine = local_machine()
    try:
        from inferenceos.hardware.memory import detect_memory

        usable = detect_memory().usable_bytes
    except Exception:  # an unreadable /proc keeps the profile's figure
        return machine
    if usable <= 0:
        return machine
    cpu = replace(machine.cpu, memory_bytes=usable)
    return replace(machine, devices=(cpu, *machine.accelerators))


class MemoryBudget:
    """Capacity per device for the models one manager holds (see the module doc)."""

    def __init__(
        self,
        machine: Callable[[], Machine] = machine_now,
        total_cap: int | None = None,
    ) -> None:
        self._machine = machine
        self.total_cap = total_cap
        self.caps: dict[str, int] = {}  # device name → bytes our models may hold there

    def set_cap(self, device: str, cap: int | None) -> None:
        """Cap what our models may hold on `device` (None lifts the cap)."""
        # a new dict each time: readers on other threads never see a half edit
        if cap is None:
            self.caps = {d: b for d, b in self.caps.items() if d != device}
        elif cap < 0:
            raise ValueError(f"a memory cap must not be negative, got {cap}")
        else:
            self.caps = {**self.caps, device: int(cap)}

    def cap_machine(self, machine: Machine) -> Machine:
        """`machine` with every device held to its cap (devices without one unchanged)."""
        caps = self.caps
        if not caps:
            return machine
        return replace(machine, devices=tuple(
            replace(d, memory_bytes=min(d.memory_bytes, caps[d.name])) if d.name in caps else d
            for d in machine.devices))

    def now(self) -> Machine:
        """The machine's devices with their memory free now (a read of the cached
        hardware profile and /proc): what `machine` and `capacity` start from. A caller
        holding a lock that others wait on reads it first, outside that lock."""
        return self._machine()

    def machine(self, ours: Mapping[str, int], now: Machine | None = None,
                held: Mapping[str, int] | None = None) -> Machine:
        """The machine as a new model may see it: the memory of each device our loaded
        models could give back included (RAM's free memory plus what they hold there;
        an accelerator's profile figure, see the module doc), within the caps. `held`:
        bytes per accelerator that our models hold and cannot give back now (in use or
        pinned), left out, so that a new model is placed beside them (its layers in
        RAM) rather than waiting for them. `now`: a reading of `now()` to start from
        (None: read it here)."""
        m = self._machine() if now is None else now
        devices = tuple(
            replace(d, memory_bytes=d.memory_bytes + ours.get(d.name, 0)) if d.name in LIVE
            else d for d in m.devices
        )
        if self.total_cap is not None:  # no device holds more than the whole cap
            devices = tuple(
                replace(d, memory_bytes=min(d.memory_bytes, self.total_cap)) for d in devices
            )
        capped = self.cap_machine(replace(m, devices=devices))
        if not held:
            return capped
        return replace(capped, devices=tuple(
            d if d.name in LIVE else replace(d, memory_bytes=max(0, d.memory_bytes
                                                                 - held.get(d.name, 0)))
            for d in capped.devices))

    def capacity(self, ours: Mapping[str, int], now: Machine | None = None) -> dict[str, int]:
        """Bytes per device our models may hold in all (a capped device that is not
        part of this machine, an RPC worker's, is held to its cap); `now` as `machine`."""
        cap = {d.name: d.memory_bytes for d in self.machine(ours, now).devices}
        return {**{d: b for d, b in self.caps.items() if d not in cap}, **cap}
