"""`inferenceos worker`: serve this machine's devices to other machines.

`run_worker(cfg)` refuses a non-loopback bind without `allow_remote` (and then warns
once: RPC traffic is neither authenticated nor encrypted), starts the info endpoint on
`info_port` and llama.cpp's RPC server on `port` (in a thread: the C call blocks for
as long as it serves; ctypes releases the GIL), and returns on SIGINT or SIGTERM.

llama.cpp's server takes one client at a time: a second client's connection waits in
the listen backlog until the first disconnects. The info endpoint therefore reports
`busy` while a client holds the server, and the planner leaves a busy worker out.

Least privilege: no cache directory is passed (the RPC server writes no files), the
process sets PR_SET_NO_NEW_PRIVS and a 077 umask, and stdin is closed. Run it as an
unprivileged user; it needs no root.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass

from inferenceos.cluster import ggml
from inferenceos.cluster.info import RemoteDevice, WorkerInfo, host_id, rpc_clients, serve_info
from inferenceos.endpoint import DEFAULT_PORT, INFO_PORT_OFFSET, is_loopback
from inferenceos.errors import InferenceOSError, UsageError
from inferenceos.hardware.openmp import bounded_spin
from inferenceos.version import __version__

REMOTE_WARNING = (
    "WARNING: the RPC port {addr} is reachable from other machines. llama.cpp's RPC "
    "traffic is neither authenticated nor encrypted: anyone who can connect can run "
    "computations and read or write this worker's memory buffers. Prefer a loopback "
    "bind with an SSH tunnel (docs/cluster.md)."
)
PR_SET_NO_NEW_PRIVS = 38


@dataclass(frozen=True)
class WorkerConfig:
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    mem: int | None = None  # bytes offered at most, over all served devices
    threads: int = 0  # 0: every core this process may run on
    device: str | None = None  # comma-separated ggml device names
    allow_remote: bool = False
    info_port: int = 0  # 0: port + 1

    @property
    def info(self) -> int:
        return self.info_port or self.port + INFO_PORT_OFFSET


def check_bind(cfg: WorkerConfig) -> str | None:
    """UsageError for a bind we refuse; the warning to print once for a remote one."""
    if not 1 <= cfg.port <= 65535 or not 1 <= cfg.info <= 65535:
        raise UsageError(f"ports out of range: {cfg.port} (RPC), {cfg.info} (info)")
    if cfg.info == cfg.port:
        raise UsageError("the info port must differ from the RPC port")
    if cfg.mem is not None and cfg.mem <= 0:
        raise UsageError("--mem must be a positive size (e.g. 4GiB)")
    if cfg.threads < 0:
        raise UsageError("--threads must be >= 0 (0: all cores)")
    if is_loopback(cfg.host):
        return None
    if not cfg.allow_remote:
        raise UsageError(
            f"refusing to serve RPC on {cfg.host}: llama.cpp's RPC protocol has no "
            "authentication or encryption. Bind 127.0.0.1 and tunnel over SSH "
            "(docs/cluster.md), or pass --allow-remote to expose it anyway"
        )
    return REMOTE_WARNING.format(addr=f"{cfg.host}:{cfg.port}")


def _port_free(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _least_privilege() -> None:
    os.umask(0o077)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux
        pass


def _ram_gbps() -> float | None:
    """This machine's measured RAM bandwidth from the cached profile, if any."""
    try:
        from inferenceos.hardware.cache import load_cached

        cached = load_cached()
        return cached.bandwidth.ram_read_gbps if cached else None
    except Exception:  # a stale or foreign cache must not stop the worker
        return None


def describer(cfg: WorkerConfig, devices: list[ggml.LocalDevice], threads: int
              ) -> Callable[[], WorkerInfo]:
    """The INFO answer, read fresh each time (free memory changes)."""
    ram_gbps = _ram_gbps()
    here = host_id()

    def describe() -> WorkerInfo:
        left = cfg.mem
        out = []
        for d in devices:
            free, total = ggml.device_memory(d)
            offered = free if left is None else min(free, left)
            if left is not None:
                left -= offered
            out.append(RemoteDevice(d.index, d.name, d.description, d.type, free, total, offered))
        return WorkerInfo(
            rpc_port=cfg.port, devices=out, threads=threads, mem_cap_bytes=cfg.mem,
            ram_read_gbps=ram_gbps, busy=rpc_clients(cfg.port) > 0, version=__version__,
            host_id=here,
        )

    return describe


def run_worker(cfg: WorkerConfig, say: Callable[[str], None] = print) -> int:
    """Serve until SIGINT/SIGTERM; returns the exit status (0 on a signal)."""
    warning = check_bind(cfg)
    bounded_spin()  # before ggml (and its libgomp) is loaded: hardware/openmp.py
    if not ggml.has_rpc():
        raise UsageError(f"llama.cpp was built without its RPC backend: {ggml.REINSTALL}")
    devices = ggml.choose_devices(ggml.local_devices(), cfg.device)
    for port in (cfg.port, cfg.info):
        if not _port_free(cfg.host, port):
            raise UsageError(f"port {port} on {cfg.host} is in use (pick another with --port)")
    if warning:
        say(warning)
    _least_privilege()
    threads = cfg.threads or len(os.sched_getaffinity(0))
    info = serve_info((cfg.host, cfg.info), describer(cfg, devices, threads))
    stop = threading.Event()
    failed: list[str] = []

    def serve_rpc() -> None:
        ggml.start_rpc_server(f"{cfg.host}:{cfg.port}", devices, threads)
        failed.append("llama.cpp's RPC server stopped (could it bind the port?)")
        stop.set()

    def on_signal(signum: int, _frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    threading.Thread(target=serve_rpc, name="rpc", daemon=True).start()
    names = ", ".join(d.name for d in devices)
    cap = f", offering at most {cfg.mem} bytes" if cfg.mem else ""
    say(f"worker ready: RPC on {cfg.host}:{cfg.port}, info on {cfg.host}:{cfg.info}, "
        f"devices {names}, {threads} threads{cap}")
    sys.stdout.flush()
    while not stop.wait(0.5):
        pass
    info.shutdown()
    info.server_close()
    if failed:
        raise InferenceOSError(failed[0])
    say("worker stopped")
    sys.stdout.flush()
    # The RPC thread is inside llama.cpp's accept loop, which has no stop call: leave
    # without running finalizers that could wait on it (the kernel closes the sockets).
    os._exit(0)
