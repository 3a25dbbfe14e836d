"""Start a real uvicorn server on 127.0.0.1 (a free port) in a background thread.

Used by the server tests (and `SLOW` / `long_stream`, a stream that lasts seconds, by
the live-metrics and monitor tests). The server serves tiny fixture models under the
names given, with small contexts and one thread so tests stay fast.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from inferenceos.plan.entry import LoadRequest
from inferenceos.plan.llama_params import LlamaParams
from inferenceos.registry.catalog import Catalog
from inferenceos.registry.manager import ModelManager
from inferenceos.registry.store import ModelStore
from inferenceos.server.app import create_app
from inferenceos.server.runner import GracefulServer, make_server
from inferenceos.server.settings import ServerSettings
from inferenceos.server.state import ServerState

TINY_SETTINGS = LlamaParams(n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1)
# what the servers' managers plan tiny models with: small contexts, one thread
TINY_REQUEST = LoadRequest(n_ctx=256, n_batch=64, threads=1)


@dataclass
class Harness:
    url: str
    port: int
    server: GracefulServer
    thread: threading.Thread
    state: ServerState
    catalog: Catalog
    manager: ModelManager

    @property
    def v1(self) -> str:
        return self.url + "/v1"

    def stop(self, timeout: float = 30) -> None:
        self.server.begin_shutdown()
        self.thread.join(timeout)


def start_server(
    models: dict[str, Path],
    root: Path,
    settings: ServerSettings | None = None,
    manager_kw: dict[str, Any] | None = None,
) -> Harness:
    """Serve `models` ({name: path}) from a store under `root`; wait until it listens."""
    store = ModelStore(root / "models")
    catalog = Catalog(store)
    for name, path in models.items():
        catalog.add_file(path, name)
    kw = {"base": TINY_REQUEST, "context_hint": None, **(manager_kw or {})}
    manager = ModelManager(catalog.resolve, **kw)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    base = settings or ServerSettings()
    settings = replace(base, host="127.0.0.1", port=port,
                       default_model=base.default_model or next(iter(models), ""))
    app = create_app(settings, catalog, manager)
    server = make_server(app, "127.0.0.1", port, grace_s=settings.shutdown_grace_s)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    return Harness(f"http://127.0.0.1:{port}", port, server, thread, app.state.ios, catalog,
                   manager)


@contextlib.contextmanager
def serving(models: dict[str, Path], root: Path, **kw: Any) -> Iterator[Harness]:
    """`start_server` with INFERENCEOS_HOME under `root` for its lifetime; stops it after."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("INFERENCEOS_HOME", str(root / "home"))
        h = start_server(models, root, **kw)
        try:
            yield h
        finally:
            h.stop()


# a 4096-token context on the wide tiny model: a stream that lasts seconds
SLOW = LoadRequest(n_ctx=4096, n_batch=64, threads=1)


class LongStream:
    """One long streamed /api/generate in a thread; `lines` counts what came so far."""

    def __init__(self, url: str, model: str, n_predict: int = 3000) -> None:
        self.url, self.model, self.n = url, model, n_predict
        self.lines = 0
        self.flowing = threading.Event()  # a few tokens have come
        self.ended = threading.Event()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        body = {"model": self.model, "prompt": "go", "stream": True,
                "options": {"num_predict": self.n, "temperature": 0}}
        try:
            with httpx.stream("POST", self.url + "/api/generate", json=body,
                              timeout=120) as r:
                for line in r.iter_lines():
                    self.lines += bool(line)
                    if self.lines >= 5:
                        self.flowing.set()
                    if self.stop.is_set():
                        break
        finally:
            self.ended.set()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(60)


@contextlib.contextmanager
def long_stream(url: str, model: str) -> Iterator[LongStream]:
    s = LongStream(url, model)
    try:
        assert s.flowing.wait(60), "the stream did not start"
        yield s
    finally:
        s.close()
