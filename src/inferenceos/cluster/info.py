"""The info endpoint beside a worker's RPC port, and its client.

llama.cpp's RPC protocol reports a device's real free memory and nothing else; a
worker's `--mem` cap, its threads, its memory bandwidth and whether another client holds
it must reach the planner by another route. This is that route: a line protocol on TCP
(`port + 1` by default), one request per line, ASCII, at most 64 bytes:

    INFO        → one JSON line (see `WorkerInfo`)
    PING        → "PONG"            (round-trip time)
    SINK n      → reads n bytes, then "OK"   (bandwidth, client → worker; n ≤ 64 MiB)

It serves facts the RPC port would give anyone who connects anyway, reads no files and
accepts nothing but these three requests; a connection idle for 10 s is closed.
"""

from __future__ import annotations

import json
import socket
import socketserver
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from inferenceos.endpoint import Endpoint

PROTOCOL = 1
MAX_LINE = 64
MAX_SINK = 64 << 20
IDLE_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class RemoteDevice:
    """One device a worker serves; `offered_bytes` is its free memory within the cap."""

    index: int
    name: str
    description: str
    type: str
    memory_free_bytes: int
    memory_total_bytes: int
    offered_bytes: int


@dataclass(frozen=True)
class WorkerInfo:
    """What a worker's INFO answers."""

    rpc_port: int
    devices: list[RemoteDevice]
    threads: int
    mem_cap_bytes: int | None = None
    ram_read_gbps: float | None = None  # the worker machine's measured RAM bandwidth
    busy: bool = False  # another client holds the RPC connection
    version: str = ""
    protocol: int = PROTOCOL
    warnings: list[str] = field(default_factory=list)
    # the worker host's kernel boot id: equal to the client's when both run on one
    # machine (network namespaces included), whose cores and RAM they then share
    host_id: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> WorkerInfo:
        """Rebuild from JSON; raises (KeyError, TypeError, ValueError) on a bad answer."""
        devices = [RemoteDevice(**d) for d in data["devices"]]
        keep = {k: data[k] for k in cls.__dataclass_fields__ if k in data and k != "devices"}
        return cls(devices=devices, **keep)


def host_id() -> str:
    """This machine's kernel boot id ("" where there is none): processes that report the
    same one run on the same machine, whatever network namespace they are in."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


# -- server ----------------------------------------------------------------------------


class InfoServer(socketserver.ThreadingTCPServer):
    """Answers INFO / PING / SINK; `describe()` is called for each INFO."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], describe: Callable[[], WorkerInfo]) -> None:
        self.describe = describe
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.address_family = family
        super().__init__(address, _Handler)


class _Handler(socketserver.StreamRequestHandler):
    server: InfoServer

    def handle(self) -> None:
        self.connection.settimeout(IDLE_TIMEOUT_S)
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while True:
                line = self.rfile.readline(MAX_LINE + 1)
                if not line or len(line) > MAX_LINE:
                    return
                cmd, _, arg = line.decode("ascii", "replace").strip().partition(" ")
                if cmd == "PING":
                    self.wfile.write(b"PONG\n")
                elif cmd == "INFO":
                    self.wfile.write(json.dumps(self.server.describe().to_json()).encode() + b"\n")
                elif cmd == "SINK" and arg.isdigit() and int(arg) <= MAX_SINK:
                    left = int(arg)
                    while left > 0:
                        chunk = self.rfile.read(min(left, 1 << 20))
                        if not chunk:
                            return
                        left -= len(chunk)
                    self.wfile.write(b"OK\n")
                else:
                    self.wfile.write(b"ERR unknown request\n")
                    return
                self.wfile.flush()
        except OSError:
            return


def serve_info(address: tuple[str, int], describe: Callable[[], WorkerInfo]) -> InfoServer:
    """Start the info endpoint in a daemon thread; OSError when the port is taken."""
    server = InfoServer(address, describe)
    threading.Thread(target=server.serve_forever, name="info", daemon=True).start()
    return server


def rpc_clients(port: int) -> int:
    """Established TCP connections whose local port is `port` (this network namespace):
    how the worker knows a client holds its RPC server, which llama.cpp does not say."""
    n = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f, None)
                for row in f:
                    cols = row.split()
                    established = len(cols) > 3 and cols[3] == "01"
                    if established and int(cols[1].rsplit(":", 1)[1], 16) == port:
                        n += 1
        except OSError:
            continue
    return n


# -- client ----------------------------------------------------------------------------


class WorkerUnreachable(Exception):
    """The worker's info endpoint did not answer (message says how)."""


class _Conn:
    def __init__(self, ep: Endpoint, timeout: float) -> None:
        host, port = ep.info_address
        try:
            self.sock = socket.create_connection((host, port), timeout=timeout)
        except OSError as exc:
            raise WorkerUnreachable(f"no answer from {host}:{port} ({_why(exc)})") from None
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.file = self.sock.makefile("rb")
        self.where = f"{host}:{port}"

    def ask(self, line: bytes, payload: bytes = b"") -> bytes:
        try:
            self.sock.sendall(line + b"\n" + payload)
            answer = self.file.readline(1 << 20)
        except OSError as exc:
            raise WorkerUnreachable(f"{self.where} stopped answering ({_why(exc)})") from None
        if not answer:
            raise WorkerUnreachable(f"{self.where} closed the connection")
        return answer.strip()

    def close(self) -> None:
        self.file.close()
        self.sock.close()


def _why(exc: OSError) -> str:
    return "timed out" if isinstance(exc, socket.timeout) else (exc.strerror or str(exc))


def query_info(ep: Endpoint, timeout: float = 2.0) -> WorkerInfo:
    """The worker's INFO; WorkerUnreachable when it does not answer sensibly."""
    conn = _Conn(ep, timeout)
    try:
        raw = conn.ask(b"INFO")
    finally:
        conn.close()
    try:
        return WorkerInfo.from_json(json.loads(raw))
    except (ValueError, KeyError, TypeError):
        why = f"{conn.where} is not an inferenceos worker's info endpoint"
        raise WorkerUnreachable(why) from None


@dataclass(frozen=True)
class LinkMeasure:
    """The measured path to a worker: median round trip and client → worker bandwidth."""

    rtt_s: float
    bandwidth_gbps: float
    measured_at: float


def measure_link(ep: Endpoint, pings: int = 30, sink_bytes: int = 8 << 20,
                 timeout: float = 5.0) -> LinkMeasure:
    """Round trip (median of `pings`) and bandwidth (one `sink_bytes` transfer, less one
    round trip) over the info endpoint's TCP path to the worker's host."""
    conn = _Conn(ep, timeout)
    try:
        conn.ask(b"PING")  # warm up (connection, server thread)
        rtts = []
        for _ in range(pings):
            t0 = time.perf_counter()
            conn.ask(b"PING")
            rtts.append(time.perf_counter() - t0)
        rtt = statistics.median(rtts)
        payload = bytes(sink_bytes)
        t0 = time.perf_counter()
        conn.ask(f"SINK {sink_bytes}".encode(), payload)
        seconds = max(time.perf_counter() - t0 - rtt, 1e-6)
    finally:
        conn.close()
    return LinkMeasure(rtt, sink_bytes / seconds / 1e9, time.time())
