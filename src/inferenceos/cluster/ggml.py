"""The worker's view of ggml through ctypes: local devices and the RPC server entry point.

Signatures follow ggml-backend.h and ggml-rpc.h of llama.cpp as vendored in
llama-cpp-python 0.3.36. The libraries are the ones llama-cpp-python installed; the RPC
backend (`libggml-rpc`) is there only when it was built with `-DGGML_RPC=ON`.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
from typing import Any

from inferenceos.errors import UsageError
from inferenceos.hardware.llama_devices import llama_lib_dir
from inferenceos.hardware.llama_probe import DEVICE_TYPES, find_library
from inferenceos.hardware.openmp import bounded_spin

_P = ctypes.c_void_p
REINSTALL = (
    "reinstall llama-cpp-python with its RPC backend: CMAKE_ARGS='-DGGML_RPC=ON' pip install "
    "--force-reinstall --no-cache-dir llama-cpp-python==0.3.36 (or scripts/install.sh)"
)


@dataclass(frozen=True)
class LocalDevice:
    """One ggml device of this machine, as a worker may serve it."""

    index: int  # position in ggml's device list
    name: str
    description: str
    type: str  # cpu | gpu | igpu | accel
    memory_free_bytes: int
    memory_total_bytes: int
    handle: int  # ggml_backend_dev_t


def _load(stem: str) -> ctypes.CDLL:
    lib_dir = llama_lib_dir()
    path = find_library(lib_dir, stem) if lib_dir else None
    if path is None:
        if stem == "ggml-rpc":
            raise UsageError(f"llama.cpp was built without its RPC backend: {REINSTALL}")
        raise UsageError("llama-cpp-python is not installed (no llama_cpp/lib found)")
    bounded_spin()  # before ggml's CPU backend loads libgomp (hardware/openmp.py)
    return ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)


def _sig(lib: ctypes.CDLL, name: str, restype: Any, *argtypes: Any) -> Any:
    fn = getattr(lib, name)
    fn.restype, fn.argtypes = restype, list(argtypes)
    return fn


@functools.cache
def _ggml() -> ctypes.CDLL:
    _load("ggml-base")
    g = _load("ggml")
    if _sig(g, "ggml_backend_reg_count", ctypes.c_size_t)() == 0:  # GGML_BACKEND_DL build
        _sig(g, "ggml_backend_load_all", None)()
    return g


def local_devices() -> list[LocalDevice]:
    """Every ggml device of this machine, with its free and total memory now."""
    g = _ggml()
    count = _sig(g, "ggml_backend_dev_count", ctypes.c_size_t)
    get = _sig(g, "ggml_backend_dev_get", _P, ctypes.c_size_t)
    name = _sig(g, "ggml_backend_dev_name", ctypes.c_char_p, _P)
    desc = _sig(g, "ggml_backend_dev_description", ctypes.c_char_p, _P)
    dtype = _sig(g, "ggml_backend_dev_type", ctypes.c_int, _P)
    size_p = ctypes.POINTER(ctypes.c_size_t)
    memory = _sig(g, "ggml_backend_dev_memory", None, _P, size_p, size_p)
    out = []
    for i in range(count()):
        dev = get(i)
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        memory(dev, ctypes.byref(free), ctypes.byref(total))
        out.append(LocalDevice(
            i, (name(dev) or b"").decode(), (desc(dev) or b"").decode(),
            DEVICE_TYPES.get(dtype(dev), "other"), free.value, total.value, int(dev),
        ))
    return out


def device_memory(dev: LocalDevice) -> tuple[int, int]:
    """(free, total) bytes of `dev` now."""
    size_p = ctypes.POINTER(ctypes.c_size_t)
    memory = _sig(_ggml(), "ggml_backend_dev_memory", None, _P, size_p, size_p)
    free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
    memory(ctypes.c_void_p(dev.handle), ctypes.byref(free), ctypes.byref(total))
    return free.value, total.value


def choose_devices(devices: list[LocalDevice], wanted: str | None) -> list[LocalDevice]:
    """The devices a worker serves: those named in `wanted` (comma-separated ggml names,
    e.g. "CUDA0,CUDA1" or "CPU"), else every GPU, else the CPU (as llama.cpp's own
    rpc-server does). UsageError names the devices there are."""
    if wanted:
        names = [w.strip() for w in wanted.split(",") if w.strip()]
        by_name = {d.name.lower(): d for d in devices}
        missing = [n for n in names if n.lower() not in by_name]
        if missing:
            have = ", ".join(d.name for d in devices) or "none"
            raise UsageError(f"no device named {missing[0]!r} here (devices: {have})")
        return [by_name[n.lower()] for n in names]
    gpus = [d for d in devices if d.type in ("gpu", "igpu")]
    return gpus or [d for d in devices if d.type == "cpu"][:1]


def start_rpc_server(endpoint: str, devices: list[LocalDevice], threads: int) -> None:
    """Run llama.cpp's RPC server on `endpoint` ("host:port") for `devices`; blocks for
    as long as it serves (forever, unless it cannot bind: then it returns). No cache
    directory is given: the server writes no files."""
    rpc = _load("ggml-rpc")
    size = ctypes.c_size_t
    start = _sig(rpc, "ggml_backend_rpc_start_server", None,
                 ctypes.c_char_p, ctypes.c_char_p, size, size, _P)
    arr = (ctypes.c_void_p * len(devices))(*[d.handle for d in devices])
    start(endpoint.encode(), None, max(1, threads), len(devices), ctypes.cast(arr, _P))


def has_rpc() -> bool:
    lib_dir = llama_lib_dir()
    return bool(lib_dir and find_library(lib_dir, "ggml-rpc"))
