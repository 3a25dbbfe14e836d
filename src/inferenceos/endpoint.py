"""Worker addresses: `host:port`, optionally `host:port=SIZE` (a client-side memory cap).

The RPC server listens on `port`; the info endpoint listens on `port + 1` unless the
worker was started with another `--info-port` (then say `host:port/INFO_PORT`).
The ggml device a worker's device `i` becomes on the client is named
`RPC[host:port]` (`RPC[host:port]#i` for i > 0): that is the planner's device name and
the key of `simulate --json`'s `peak_memory_bytes`.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Iterable
from dataclasses import dataclass

from inferenceos.errors import UsageError
from inferenceos.units import parse_size

DEFAULT_PORT = 50052
INFO_PORT_OFFSET = 1

_NAME = re.compile(r"^RPC\[(?P<addr>[^\]]+)\](?:#(?P<index>\d+))?$")


@dataclass(frozen=True)
class Endpoint:
    """One worker as the client names it."""

    host: str
    port: int
    mem_cap: int | None = None  # client-side cap (`host:port=SIZE`), bytes
    info_port: int = 0  # 0: port + 1

    @property
    def address(self) -> str:
        """`host:port`, the string llama.cpp's RPC client connects to."""
        return f"{self.host}:{self.port}"

    @property
    def info_address(self) -> tuple[str, int]:
        return self.host, self.info_port or self.port + INFO_PORT_OFFSET

    def device_name(self, index: int = 0) -> str:
        """The planner's (and engine's) name of this worker's device `index`."""
        return f"RPC[{self.address}]" + (f"#{index}" if index else "")


def parse_endpoint(text: str) -> Endpoint:
    """`host:port[/info_port][=SIZE]` → Endpoint; UsageError with the bad text otherwise."""
    raw = text.strip()
    cap = None
    if "=" in raw:
        raw, size = raw.split("=", 1)
        cap = parse_size(size)
    info = 0
    if "/" in raw:
        raw, info_text = raw.split("/", 1)
        info = _port(info_text, text)
    host, sep, port = raw.rpartition(":")
    if not sep or not host:
        raise UsageError(f"not a worker address: {text!r} (use host:port, e.g. 127.0.0.1:50052)")
    if any(c.isspace() for c in host) or "," in host:
        raise UsageError(f"not a worker address: {text!r}")
    return Endpoint(host.strip("[]"), _port(port, text), cap, info)


def _port(value: str, text: str) -> int:
    try:
        port = int(value)
    except ValueError:
        raise UsageError(f"not a port in {text!r}: {value!r}") from None
    if not 1 <= port <= 65535:
        raise UsageError(f"port out of range in {text!r}: {port}")
    return port


def parse_endpoints(values: str | Iterable[str] | None) -> tuple[Endpoint, ...]:
    """`"h:p,h:p"` or a list of such strings (repeated `--rpc`, a config list) →
    endpoints, duplicates removed, order kept."""
    if not values:
        return ()
    items = [values] if isinstance(values, str) else list(values)
    out: dict[str, Endpoint] = {}
    for item in items:
        for part in str(item).split(","):
            if part.strip():
                ep = parse_endpoint(part)
                out.setdefault(ep.address, ep)
    return tuple(out.values())


def parse_device_name(name: str) -> tuple[str, int] | None:
    """`RPC[host:port]#i` → ("host:port", i); None for a local device name."""
    m = _NAME.match(name)
    if not m:
        return None
    return m.group("addr"), int(m.group("index") or 0)


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and names that resolve only to those."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(i[4][0]).is_loopback for i in infos)
