"""llama.cpp's backend devices by name, for placing tensors (ggml-backend registry)."""

from __future__ import annotations

import ctypes
import functools
from typing import Any

from inferenceos.engine.llama_lib import lib, library_dir
from inferenceos.errors import ModelLoadError


class TensorBuftOverride(ctypes.Structure):
    """`struct llama_model_tensor_buft_override` (llama.h); the bindings only declare
    the params field as a void pointer."""

    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


@functools.cache
def _ggml() -> Any:
    lib()  # backends are registered when llama.cpp initialises
    g = ctypes.CDLL(str(library_dir() / "libggml.so"))
    g.ggml_backend_dev_by_name.argtypes = [ctypes.c_char_p]
    g.ggml_backend_dev_by_name.restype = ctypes.c_void_p
    g.ggml_backend_dev_buffer_type.argtypes = [ctypes.c_void_p]
    g.ggml_backend_dev_buffer_type.restype = ctypes.c_void_p
    return g


def buffer_type(device: str) -> int:
    """The default buffer type of llama.cpp device `device` ("CPU", "CUDA0", ...)."""
    g = _ggml()
    dev = g.ggml_backend_dev_by_name(device.encode())
    if not dev:
        raise ModelLoadError(f"llama.cpp has no device named {device!r}")
    buft = g.ggml_backend_dev_buffer_type(dev)
    if not buft:
        raise ModelLoadError(f"llama.cpp device {device!r} has no buffer type")
    return int(buft)


@functools.cache
def _rpc() -> Any:
    _ggml()
    path = library_dir() / "libggml-rpc.so"
    if not path.exists():
        raise ModelLoadError(
            "the plan uses RPC workers but llama.cpp was built without its RPC backend; "
            "reinstall with CMAKE_ARGS='-DGGML_RPC=ON' (scripts/install.sh)"
        )
    r = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
    r.ggml_backend_rpc_add_server.argtypes = [ctypes.c_char_p]
    r.ggml_backend_rpc_add_server.restype = ctypes.c_void_p
    g = _ggml()
    g.ggml_backend_reg_dev_count.argtypes = [ctypes.c_void_p]
    g.ggml_backend_reg_dev_count.restype = ctypes.c_size_t
    g.ggml_backend_reg_dev_get.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    g.ggml_backend_reg_dev_get.restype = ctypes.c_void_p
    return r


def _rpc_device(address: str, index: int) -> int:
    """The ggml device for worker `address`'s device `index`, connecting to it.

    llama.cpp aborts the whole process when an RPC server cannot be reached or does
    not answer the handshake, so the worker is asked first through its info endpoint:
    a worker that is down or held by another client is a ModelLoadError here."""
    from inferenceos.cluster.endpoint import parse_endpoint
    from inferenceos.cluster.probe import probe_worker

    ep = parse_endpoint(address)
    probe = probe_worker(ep, timeout=3.0, measure=False)
    if not probe.usable:
        raise ModelLoadError(f"{probe.error}; plan again without it")
    r, g = _rpc(), _ggml()
    reg = r.ggml_backend_rpc_add_server(address.encode())
    if not reg or index >= g.ggml_backend_reg_dev_count(reg):
        raise ModelLoadError(f"worker {address} has no device {index}")
    return int(g.ggml_backend_reg_dev_get(reg, index))


def device_array(names: tuple[str, ...]) -> Any:
    """The NULL-terminated `ggml_backend_dev_t` array llama_model_params.devices takes,
    for llama.cpp device names ("CUDA0") and RPC worker devices ("RPC[host:port]",
    "RPC[host:port]#1"); None when no name is an RPC device (llama.cpp then uses every
    local device, as before). ModelLoadError names a device that cannot be found."""
    from inferenceos.cluster.endpoint import parse_device_name

    if not any(parse_device_name(n) for n in names):
        return None
    g = _ggml()
    handles = []
    for name in names:
        rpc = parse_device_name(name)
        if rpc is not None:
            handles.append(_rpc_device(*rpc))
            continue
        dev = g.ggml_backend_dev_by_name(name.encode())
        if not dev:
            raise ModelLoadError(f"llama.cpp has no device named {name!r}")
        handles.append(int(dev))
    return (ctypes.c_void_p * (len(handles) + 1))(*handles, None)
