"""Child-process probe of the llama.cpp libraries that llama-cpp-python ships.

Run as a script (`python llama_probe.py LIB_DIR`), it loads libggml-base, libggml and
libllama from LIB_DIR with ctypes and prints one JSON object on stdout: ggml version and
commit, the backend registries compiled in (or loadable), every backend device with its
type and free / total memory (a GPU's also with the largest tensor its ops accept:
`max_tensor_bytes`), and `llama_print_system_info()`. It imports nothing but
the standard library, so it runs whatever sys.path holds. It runs in a child because
initialising a GPU backend can crash or hang inside a driver; the parent survives that.
Signatures follow ggml/include/ggml-backend.h of llama.cpp as vendored in 0.3.36.
"""

from __future__ import annotations

import ctypes
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEVICE_TYPES = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel", 4: "meta"}
_P = ctypes.c_void_p


def find_library(lib_dir: Path, stem: str) -> Path | None:
    """libSTEM.so / libSTEM.dylib / STEM.dll in `lib_dir`, or None."""
    for name in (f"lib{stem}.so", f"lib{stem}.dylib", f"{stem}.dll", f"lib{stem}.dll"):
        if (lib_dir / name).is_file():
            return lib_dir / name
    return None


def _load(lib_dir: Path, stem: str) -> ctypes.CDLL:
    path = find_library(lib_dir, stem)
    if path is None:
        raise OSError(f"lib{stem} not found in {lib_dir}")
    return ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)


def bind(lib: ctypes.CDLL, name: str, restype: Any, *argtypes: Any) -> Any:
    """`lib`'s function `name`, with its C signature set."""
    fn = getattr(lib, name)
    fn.restype, fn.argtypes = restype, list(argtypes)
    return fn


def _s(raw: bytes | None) -> str | None:
    return raw.decode("utf-8", "replace") if raw is not None else None


def probe(lib_dir: Path) -> dict[str, Any]:
    """What llama.cpp in `lib_dir` sees; raises OSError when a library will not load."""
    base = _load(lib_dir, "ggml-base")
    ggml = _load(lib_dir, "ggml")
    result: dict[str, Any] = {
        "ggml_version": _s(bind(base, "ggml_version", ctypes.c_char_p)()),
        "ggml_commit": _s(bind(base, "ggml_commit", ctypes.c_char_p)()),
    }
    reg_count = bind(ggml, "ggml_backend_reg_count", ctypes.c_size_t)
    if reg_count() == 0:  # a GGML_BACKEND_DL build: backends are separate plugins
        bind(ggml, "ggml_backend_load_all_from_path", None, ctypes.c_char_p)(
            str(lib_dir).encode())
    reg_get = bind(ggml, "ggml_backend_reg_get", _P, ctypes.c_size_t)
    reg_name = bind(ggml, "ggml_backend_reg_name", ctypes.c_char_p, _P)
    result["backends"] = [_s(reg_name(reg_get(i))) for i in range(reg_count())]
    result["devices"] = _devices(ggml, reg_name)
    llama = _load(lib_dir, "llama")
    result["system_info"] = _s(bind(llama, "llama_print_system_info", ctypes.c_char_p)())
    return result


@dataclass(frozen=True)
class GgmlDevice:
    """One entry of ggml's device list, as ggml reports it."""

    handle: int  # ggml_backend_dev_t
    name: str | None
    description: str | None
    type: int  # enum ggml_backend_dev_type (DEVICE_TYPES)
    memory_free_bytes: int
    memory_total_bytes: int


def ggml_devices(ggml: ctypes.CDLL) -> list[GgmlDevice]:
    """Every ggml backend device of the loaded libggml `ggml`, in ggml's order, with its
    free and total memory now (the probe's list, and a worker's)."""
    count = bind(ggml, "ggml_backend_dev_count", ctypes.c_size_t)
    get = bind(ggml, "ggml_backend_dev_get", _P, ctypes.c_size_t)
    name = bind(ggml, "ggml_backend_dev_name", ctypes.c_char_p, _P)
    desc = bind(ggml, "ggml_backend_dev_description", ctypes.c_char_p, _P)
    dtype = bind(ggml, "ggml_backend_dev_type", ctypes.c_int, _P)
    devices = []
    for i in range(count()):
        dev = get(i)
        free, total = device_memory(ggml, dev)
        devices.append(GgmlDevice(int(dev), _s(name(dev)), _s(desc(dev)), dtype(dev),
                                  free, total))
    return devices


def device_memory(ggml: ctypes.CDLL, dev: int) -> tuple[int, int]:
    """(free, total) bytes of the ggml device `dev` (a ggml_backend_dev_t) now."""
    size_p = ctypes.POINTER(ctypes.c_size_t)
    memory = bind(ggml, "ggml_backend_dev_memory", None, _P, size_p, size_p)
    free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
    memory(dev, ctypes.byref(free), ctypes.byref(total))
    return free.value, total.value


def _devices(ggml: ctypes.CDLL, reg_name: Any) -> list[dict[str, Any]]:
    reg = bind(ggml, "ggml_backend_dev_backend_reg", _P, _P)
    out = []
    for i, d in enumerate(ggml_devices(ggml)):
        kind = DEVICE_TYPES.get(d.type, f"type{d.type}")
        out.append({
            "name": d.name or f"dev{i}", "description": d.description or "",
            "type": kind, "backend": _s(reg_name(reg(d.handle))) or "",
            "memory_free_bytes": d.memory_free_bytes,
            "memory_total_bytes": d.memory_total_bytes,
            **({"max_tensor_bytes": max_tensor_bytes(ggml, d.handle)}
               if kind in ("gpu", "igpu") else {}),
        })
    return out


class _InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", _P), ("no_alloc", ctypes.c_bool)]


MIB = 1 << 20
_SEARCH_TOP = 1 << 44  # 16 TiB: "no limit" above it


def max_tensor_bytes(ggml: ctypes.CDLL, dev: int) -> int | None:
    """The largest tensor (to 1 MiB) an op on device `dev` may read or write, None when
    it accepts any: the smaller of its buffer type's largest allocation
    (`ggml_backend_buft_get_max_size`) and what `ggml_backend_dev_supports_op` accepts
    for an f32 ADD, found by bisection on metadata-only tensors. ggml-vulkan refuses an
    op on a tensor over `maxStorageBufferRange` (128 MiB on lavapipe; 4 GiB and more on
    discrete GPUs), and llama.cpp then keeps such a weight, and its op, on the CPU."""
    buft = bind(ggml, "ggml_backend_dev_buffer_type", _P, _P)(dev)
    alloc = bind(ggml, "ggml_backend_buft_get_max_size", ctypes.c_size_t, _P)(buft) or _SEARCH_TOP
    init = bind(ggml, "ggml_init", _P, _InitParams)
    free = bind(ggml, "ggml_free", None, _P)
    new_1d = bind(ggml, "ggml_new_tensor_1d", _P, _P, ctypes.c_int, ctypes.c_int64)
    add = bind(ggml, "ggml_add", _P, _P, _P, _P)
    supports = bind(ggml, "ggml_backend_dev_supports_op", ctypes.c_bool, _P, _P)

    def accepts(n_bytes: int) -> bool:
        ctx = init(_InitParams(64 * 1024, None, True))
        try:
            a = new_1d(ctx, 0, n_bytes // 4)  # GGML_TYPE_F32
            return bool(supports(dev, add(ctx, a, a)))
        finally:
            free(ctx)

    lo, hi = 0, min(alloc, _SEARCH_TOP) // MIB  # in MiB: lo accepted (or 0), hi the top
    if accepts(hi * MIB):
        return None if hi * MIB >= _SEARCH_TOP else hi * MIB
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if accepts(mid * MIB) else (lo, mid)
    return lo * MIB


def main(argv: list[str]) -> int:
    """Print the probe result as JSON; on a load failure print {"error": ...}, exit 1."""
    try:
        print(json.dumps(probe(Path(argv[1]))))
    except (OSError, AttributeError) as exc:  # missing library or missing symbol
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
