"""The worker's view of ggml through ctypes: local devices and the RPC server entry point.

Signatures follow ggml-backend.h and ggml-rpc.h of llama.cpp as vendored in
llama-cpp-python 0.3.36. The libraries are the ones llama-cpp-python installed; the RPC
backend (`libggml-rpc`) is there only when it was built with `-DGGML_RPC=ON`.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass

from inferenceos.errors import UsageError
from inferenceos.hardware.llama_devices import llama_lib_dir
from inferenceos.hardware.llama_probe import DEVICE_TYPES, bind, find_library, ggml_devices
from inferenceos.hardware.llama_probe import device_memory as ggml_device_memory
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


@functools.cache
def _ggml() -> ctypes.CDLL:
    _load("ggml-base")
    g = _load("ggml")
    if bind(g, "ggml_backend_reg_count", ctypes.c_size_t)() == 0:  # GGML_BACKEND_DL build
        bind(g, "ggml_backend_load_all", None)()
    return g


def local_devices() -> list[LocalDevice]:
    """Every ggml device of this machine, with its free and total memory now."""
    return [LocalDevice(i, d.name or "", d.description or "",
                        DEVICE_TYPES.get(d.type, "other"), d.memory_free_bytes,
                        d.memory_total_bytes, d.handle)
            for i, d in enumerate(ggml_devices(_ggml()))]


def device_memory(dev: LocalDevice) -> tuple[int, int]:
    """(free, total) bytes of `dev` now."""
    return ggml_device_memory(_ggml(), dev.handle)


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
    start = bind(rpc, "ggml_backend_rpc_start_server", None,
                 ctypes.c_char_p, ctypes.c_char_p, size, size, _P)
    arr = (ctypes.c_void_p * len(devices))(*[d.handle for d in devices])
    start(endpoint.encode(), None, max(1, threads), len(devices), ctypes.cast(arr, _P))


def has_rpc() -> bool:
    lib_dir = llama_lib_dir()
    return bool(lib_dir and find_library(lib_dir, "ggml-rpc"))
