"""Start `inferenceos worker` processes on this machine (tests, benchmarks, scripts).

`spawn_worker` runs the real command in a child process (optionally behind a command
prefix such as `ip netns exec NS`) and waits until its info endpoint answers;
`free_port` finds a port whose next port (the info endpoint's) is free as well.
"""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from inferenceos.cluster.info import WorkerUnreachable, query_info
from inferenceos.endpoint import Endpoint

# Where free_port looks: below the kernel's ephemeral range, which every outgoing
# connection and every bind to port 0 draws from. A pair taken from that range (as
# bind(0) gives) was free when checked and then taken as the local port of another
# process's HTTP client before the worker bound it: "port 51956 on 127.0.0.1 is in use"
# failed a whole cluster test file in a parallel suite run.
_LOWEST_PORT = 20000
_EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (32768 where it cannot be read)."""
    try:
        return int(_EPHEMERAL.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _pair_free(host: str, port: int) -> bool:
    for p in (port, port + 1):
        with socket.socket() as s:
            try:
                s.bind((host, p))
            except OSError:
                return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port p with p and p + 1 free on `host` now, drawn at random from below the
    ephemeral range (so no outgoing connection takes either before a server binds it),
    else from the ephemeral range as bind(0) gives."""
    # the OS's randomness: `random`'s may be seeded alike in every test process
    draw = random.SystemRandom()
    high = _ephemeral_low() - 2
    if high > _LOWEST_PORT:
        for _ in range(200):
            port = draw.randint(_LOWEST_PORT, high)
            if _pair_free(host, port):
                return port
    for _ in range(200):
        with socket.socket() as s:
            s.bind((host, 0))
            port = int(s.getsockname()[1])
        if port < 65535 and _pair_free(host, port):
            return port
    raise OSError("no free port pair found")


def spawn_worker(
    port: int,
    host: str = "127.0.0.1",
    mem: str | None = None,
    threads: int = 0,
    prefix: Sequence[str] = (),
    log: Path | None = None,
    timeout: float = 60.0,
    extra: Sequence[str] = (),
) -> subprocess.Popen[bytes]:
    """A running worker on `host:port`, ready (its info endpoint answers); raises
    RuntimeError with the worker's output when it exits or does not answer in time."""
    src = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [src, env.get("PYTHONPATH")]))
    cmd = [*prefix, sys.executable, "-m", "inferenceos", "worker", "--host", host,
           "--port", str(port), "--threads", str(threads), *extra]
    if mem:
        cmd += ["--mem", mem]
    out = open(log, "wb") if log else subprocess.DEVNULL  # noqa: SIM115 - the child owns it
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                            stdin=subprocess.DEVNULL)
    ep = Endpoint(host, port)
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            text = log.read_text(errors="replace")[-2000:] if log else ""
            raise RuntimeError(f"worker on {host}:{port} exited ({proc.returncode}): {text}")
        try:
            query_info(ep, timeout=1.0)
            return proc
        except WorkerUnreachable:
            if time.monotonic() > deadline:
                proc.kill()
                why = f"worker {host}:{port} did not answer in {timeout:g} s"
                raise RuntimeError(why) from None
            time.sleep(0.1)


def stop_worker(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> int:
    """SIGTERM, then SIGKILL if it does not stop in `timeout`; the exit status."""
    if proc.poll() is None:
        proc.terminate()
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait()
