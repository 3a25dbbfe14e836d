"""Loopback `inferenceos worker` processes for the multi-node tests (tests/cluster/):
two workers offering less memory than the model needs, and the RAM cap that makes the
planner split the model over this machine and both."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterable
from pathlib import Path

from inferenceos.cluster.spawn import free_port, spawn_worker, stop_worker
from inferenceos.plan.devices import Device, Machine

# the "deeper" tiny model: 12 layers of ~1 MiB, 12.1 MB of weights. A worker offering
# 3 MiB takes at most 2 layers (after its compute reserve); 10.5 MiB of RAM here holds at
# most 8 (beside the embeddings and the output head), so the plan needs all three. With
# one worker lost, the rest runs from what is left with some weights on disk: 10.5 MiB
# holds the anonymous bytes and a disk-bound plan's streaming room (two layers and the
# decode's code pages, plan/footprint.stream_room), which the 6-layer "deep" model at
# 5 MiB could not. (From 13 MiB on, one worker is enough.)
WORKER_MEM = "3MiB"
WORKER_BYTES = 3 << 20
RAM = 21 << 19
RAM_ARG = "10.5MiB"


class Workers:
    """Two loopback workers that a test may kill and start again."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.ports = [free_port(), free_port()]
        while self.ports[1] in (self.ports[0], self.ports[0] + 1, self.ports[0] - 1):
            self.ports[1] = free_port()
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        for p in self.ports:
            self.start(p)

    def start(self, port: int) -> None:
        self.procs[port] = spawn_worker(port, mem=WORKER_MEM, threads=1,
                                        log=self.logs / f"worker-{port}.log")

    @property
    def addresses(self) -> tuple[str, ...]:
        return tuple(f"127.0.0.1:{p}" for p in self.ports)

    def names(self) -> list[str]:
        return [f"RPC[{a}]" for a in self.addresses]

    def close(self) -> None:
        for proc in self.procs.values():
            stop_worker(proc)


# -- injected machines (the planner's view, links fixed) -----------------------------


def injected_machine(ram: int, *remote: Device) -> Machine:
    """This machine as the planner sees it: a 2-thread CPU with `ram`, and `remote`."""
    cpu = Device(name="CPU", kind="cpu", memory_bytes=ram, bandwidth_gbps=20.0, threads=2,
                 llama_name="CPU")
    return Machine(devices=(cpu, *remote), source="test")


def rpc_device(address: str, mem: int, kind: str = "cpu", rtt: float = 1e-4,
               gbps: float = 20.0, link: float = 1.0) -> Device:
    """A worker at `address` ("host:port") offering `mem`, on a link of `rtt` seconds
    and `link` GB/s: fixed, where a probe would measure it (a busy machine moves it)."""
    return Device(name=f"RPC[{address}]", kind="rpc", memory_bytes=mem, bandwidth_gbps=gbps,
                  threads=2, llama_name=f"RPC[{address}]", rtt_s=rtt, remote_kind=kind,
                  link_gbps=link, tflops=20.0 if kind == "gpu" else 0.0)


def worker_buffer_mib(log_lines: Iterable[str], address: str) -> float:
    """The model buffer llama.cpp logged for the worker at `address`, in MiB (its
    "RPC0[host:port] model buffer size = X MiB" line); AssertionError without one."""
    for line in log_lines:
        found = re.search(rf"RPC\d*\[{re.escape(address)}\] model buffer size =\s*([\d.]+) MiB",
                          line)
        if found:
            return float(found.group(1))
    raise AssertionError(f"no model buffer logged for {address}")

