"""Start `inferenceos worker` processes on this machine (tests, benchmarks, scripts).

`spawn_worker` runs the real command in a child process (optionally behind a command
prefix such as `ip netns exec NS`) and waits until its info endpoint answers;
`free_port` finds a port whose next port (the info endpoint's) is free as well.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from inferenceos.cluster.info import WorkerUnreachable, query_info
from inferenceos.endpoint import Endpoint


def free_port(host: str = "127.0.0.1") -> int:
    """A port p with p and p + 1 free on `host` now."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind((host, 0))
            port = int(s.getsockname()[1])
        if port >= 65535:
            continue
        with socket.socket() as s:
            try:
                s.bind((host, port + 1))
            except OSError:
                continue
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
