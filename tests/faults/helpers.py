"""Shared pieces of the fault tests: a two-model server, requests, child processes."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

from server_harness import Harness


def generate(h: Harness, model: str, n: int = 3, timeout: float = 60,
             **extra: Any) -> httpx.Response:
    """A non-streamed Ollama generate of `n` tokens."""
    return httpx.post(h.url + "/api/generate", timeout=timeout, json={
        "model": model, "prompt": "ab", "stream": False, "options": {"num_predict": n},
        **extra})


def unload(h: Harness, model: str) -> None:
    r = httpx.post(h.url + "/api/generate", json={"model": model, "keep_alive": 0}, timeout=60)
    assert r.status_code == 200, r.text


def tags(h: Harness) -> list[str]:
    r = httpx.get(h.url + "/api/tags", timeout=30)
    assert r.status_code == 200, r.text
    return sorted(m["name"] for m in r.json()["models"])


def ps(h: Harness) -> dict[str, dict[str, Any]]:
    r = httpx.get(h.url + "/api/ps", timeout=30)
    return {m["name"].split(":")[0]: m for m in r.json()["models"]}


def children() -> set[int]:
    """This process's child pids (the model workers among them)."""
    kids: set[int] = set()
    for task in Path(f"/proc/{os.getpid()}/task").glob("*"):
        with contextlib.suppress(OSError):
            kids |= {int(k) for k in (task / "children").read_text().split()}
    return kids


def worker_pid(h: Harness, model: str) -> int:
    """The pid of `model`'s engine worker (the model must be loaded)."""
    lm = next(m for m in h.manager.loaded() if m.model.name.split(":")[0] == model)
    engine: Any = lm.engine  # the real Engine, which has a worker process
    return int(engine.worker_pid)


@contextlib.contextmanager
def kill_next_child(before: set[int], model: Path | None = None) -> Iterator[list[int]]:
    """SIGKILL the first model worker that appears (a child running multiprocessing's
    `spawn_main`: a worker being started, before it has loaded its model), as soon as
    it has exec'd; yields the list the killed pid is put in. Other children (a probe's
    subprocess) are left alone: killing the first child of any kind let a worker load
    undisturbed once in a parallel run (the answer was 200 with a pid in `killed`).
    With `model`, only a worker that has that file open or mapped (it is loading it):
    in a full parallel run the first new worker was once another engine's, and the
    model's own loaded undisturbed again (200, a pid in `killed`)."""
    killed: list[int] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set() and not killed:
            # every new child is looked at again on each pass: one read while it was
            # between fork and exec must not rule it out (a parallel run once killed
            # nothing: "no worker was started")
            for pid in children() - before:
                if _child_kind(pid) == "worker" and (model is None or _loading(pid, model)):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                        killed.append(pid)
                        return
            time.sleep(0.001)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    try:
        yield killed
    finally:
        stop.set()
        t.join(5)


def _loading(pid: int, model: Path) -> bool:
    """Whether process `pid` has `model` open or mapped."""
    target = str(model.resolve())
    with contextlib.suppress(OSError):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                if os.readlink(fd) == target:
                    return True
        return target in Path(f"/proc/{pid}/maps").read_text(errors="replace")
    return False


def _child_kind(pid: int) -> str:
    """"worker" (multiprocessing's spawn_main), "other" (or gone), or "" while it has
    not exec'd yet (its command line is still ours, or empty during the exec)."""
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "other"
    if b"spawn_main" in cmd:
        return "worker"
    return "" if cmd in (b"", _OWN_CMDLINE) else "other"  # b"": inside its exec


_OWN_CMDLINE = Path("/proc/self/cmdline").read_bytes()


def in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    t.start()
    return t, out
