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
