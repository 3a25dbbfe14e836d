"""llama.cpp's backend devices by name, for placing tensors (ggml-backend registry)."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from inferenceos.engine.llama.lib import lib, library_dir
from inferenceos.errors import ModelLoadError
from inferenceos.hardware.llama_probe import bind


class TensorBuftOverride(ctypes.Structure):
    """`struct llama_model_tensor_buft_override` (llama.h); the bindings only declare
    the params field as a void pointer."""

    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


@functools.cache
def ggml() -> Any:
    """libggml of the loaded llama.cpp, with the signatures of every ggml-backend
    function the engine calls set (device and buffer type by name, their names back)."""
    lib()  # backends are registered when llama.cpp initialises
    g = ctypes.CDLL(str(library_dir() / "libggml.so"))
    bind(g, "ggml_backend_dev_by_name", ctypes.c_void_p, ctypes.c_char_p)
    bind(g, "ggml_backend_dev_buffer_type", ctypes.c_void_p, ctypes.c_void_p)
    bind(g, "ggml_backend_dev_name", ctypes.c_char_p, ctypes.c_void_p)
    bind(g, "ggml_backend_buft_name", ctypes.c_char_p, ctypes.c_void_p)
    return g


def device_handle(device: str) -> int:
    """llama.cpp's `ggml_backend_dev_t` for device `device` ("CPU", "CUDA0", ...)."""
    dev = ggml().ggml_backend_dev_by_name(device.encode())
    if not dev:
        raise ModelLoadError(f"llama.cpp has no device named {device!r}")
    return int(dev)


def buffer_type(device: str) -> int:
    """The default buffer type of llama.cpp device `device` ("CPU", "CUDA0", ...)."""
    buft = ggml().ggml_backend_dev_buffer_type(device_handle(device))
    if not buft:
        raise ModelLoadError(f"llama.cpp device {device!r} has no buffer type")
    return int(buft)


def _soname(stem: str) -> Any:
    """lib{stem}.so.0 when present: the copy libllama.so links to. The wheel ships the
    .so and .so.0 names as separate files, and loading the other one would give a
    second instance with its own state (abort callback, RPC connections)."""
    lib_dir = library_dir()
    path = lib_dir / f"lib{stem}.so.0"
    return path if path.exists() else lib_dir / f"lib{stem}.so"


@functools.cache
def _rpc() -> Any:
    ggml()
    path = _soname("ggml-rpc")
    if not path.exists():
        raise ModelLoadError(
            "the plan uses RPC workers but llama.cpp was built without its RPC backend; "
            "reinstall with CMAKE_ARGS='-DGGML_RPC=ON' (scripts/install.sh)"
        )
    r = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
    bind(r, "ggml_backend_rpc_add_server", ctypes.c_void_p, ctypes.c_char_p)
    g = ggml()
    bind(g, "ggml_backend_reg_dev_count", ctypes.c_size_t, ctypes.c_void_p)
    bind(g, "ggml_backend_reg_dev_get", ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
    return r


def _rpc_device(address: str, index: int) -> int:
    """The ggml device for worker `address`'s device `index`, connecting to it.

    llama.cpp aborts the whole process when an RPC server cannot be reached or does
    not answer the handshake, so the worker is asked first through its info endpoint:
    a worker that is down or held by another client is a ModelLoadError here."""
    from inferenceos.cluster.probe import probe_worker
    from inferenceos.endpoint import parse_endpoint

    ep = parse_endpoint(address)
    probe = probe_worker(ep, timeout=3.0, measure=False)
    if not probe.usable:
        raise ModelLoadError(f"{probe.error}; plan again without it")
    r, g = _rpc(), ggml()
    reg = r.ggml_backend_rpc_add_server(address.encode())
    if not reg or index >= g.ggml_backend_reg_dev_count(reg):
        raise ModelLoadError(f"worker {address} has no device {index}")
    return int(g.ggml_backend_reg_dev_get(reg, index))


def device_array(names: tuple[str, ...]) -> Any:
    """The NULL-terminated `ggml_backend_dev_t` array llama_model_params.devices takes,
    for llama.cpp device names ("CUDA0") and RPC worker devices ("RPC[host:port]",
    "RPC[host:port]#1"); None when no name is an RPC device (llama.cpp then uses every
    local device, as before). ModelLoadError names a device that cannot be found."""
    from inferenceos.endpoint import parse_device_name

    if not any(parse_device_name(n) for n in names):
        return None
    ggml()  # llama.cpp initialised (its backends registered) before any lookup, as before
    handles = []
    for name in names:
        rpc = parse_device_name(name)
        if rpc is not None:
            handles.append(_rpc_device(*rpc))
            continue
        handles.append(device_handle(name))
    return (ctypes.c_void_p * (len(handles) + 1))(*handles, None)


# llama.cpp's RPC client aborts the process when a worker's connection breaks
# (RPC_STATUS_ASSERT → GGML_ABORT). In a model worker process that is the right end (the
# parent reports WorkerDiedError and the model is planned again), but "exit code -6"
# says nothing: the abort message is left in a note the parent reads (`abort_note`).
_abort_callback: Any = None


def _note_path(pid: int) -> Any:
    return Path(tempfile.gettempdir()) / f"inferenceos-abort-{pid}.txt"


def install_abort_note() -> None:
    """Make a ggml abort in this process leave its message for `abort_note(pid)`."""
    global _abort_callback
    if _abort_callback is not None:
        return
    base = ctypes.CDLL(str(_soname("ggml-base")))
    proto = ctypes.CFUNCTYPE(None, ctypes.c_char_p)
    path = str(_note_path(os.getpid()))

    def on_abort(message: bytes | None) -> None:
        text = (message or b"").decode("utf-8", "replace")
        try:
            with open(path, "w") as f:
                f.write(text)
        except OSError:
            pass
        sys.stderr.write(text + "\n")

    _abort_callback = proto(on_abort)
    base.ggml_set_abort_callback.argtypes = [proto]
    base.ggml_set_abort_callback.restype = ctypes.c_void_p
    base.ggml_set_abort_callback(_abort_callback)


def abort_note(pid: int) -> str:
    """Why process `pid` aborted inside llama.cpp, as a clause to append to a
    WorkerDiedError (empty when it left no note); the note is removed."""
    path = _note_path(pid)
    try:
        text = path.read_text().strip()
        path.unlink()
    except OSError:
        return ""
    if text.startswith("RPC worker"):  # the watchdog's note
        return f": {text}; the next request plans the model again without it"
    if "RPC" in text:
        return (f": a cluster worker was lost mid-request (llama.cpp: {text.split(': ', 1)[-1]});"
                " the next request plans the model again without it")
    return f": llama.cpp aborted ({text})"


class LinkWatchdog:
    """Ends this process when a worker holding part of the model stops answering.

    llama.cpp's RPC client blocks on a socket without a timeout: a worker that dies
    closes the connection and llama.cpp aborts (see above), but one that becomes
    unreachable (power lost, network cut, process frozen) would leave a request hanging
    forever. This thread asks each worker's info endpoint every `period_s`; after
    `misses` unanswered rounds in a row for one worker it leaves the abort note and
    aborts, so a model worker process dies (WorkerDiedError for its requests) instead.
    """

    def __init__(self, addresses: list[str], period_s: float = 2.0, misses: int = 3) -> None:
        from inferenceos.endpoint import parse_endpoint

        self._eps = [parse_endpoint(a) for a in addresses]
        self._period, self._misses = period_s, misses
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rpc-watchdog", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from inferenceos.cluster.info import WorkerUnreachable, query_info

        missed = dict.fromkeys((ep.address for ep in self._eps), 0)
        while not self._stop.wait(self._period):
            for ep in self._eps:
                try:
                    query_info(ep, timeout=self._period)
                    missed[ep.address] = 0
                except WorkerUnreachable:
                    missed[ep.address] += 1
                if missed[ep.address] >= self._misses and not self._stop.is_set():
                    self._abort(ep.address)

    def _abort(self, address: str) -> None:
        waited = self._misses * self._period
        text = (f"RPC worker {address} unreachable: no answer for {waited:.0f} s "
                "(lost power or network?)")
        with contextlib.suppress(OSError):
            _note_path(os.getpid()).write_text(text)

        sys.stderr.write(text + "\n")
        sys.stderr.flush()
        os.abort()

    def stop(self) -> None:
        self._stop.set()


def rpc_addresses(names: tuple[str, ...]) -> list[str]:
    """The worker addresses among llama.cpp device names."""
    from inferenceos.endpoint import parse_device_name

    out = []
    for n in names:
        parsed = parse_device_name(n)
        if parsed and parsed[0] not in out:
            out.append(parsed[0])
    return out
