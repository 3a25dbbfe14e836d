"""What a GPU achieves under llama.cpp: its decode read rate and its copy rate from host.

The planner's GPU figures were assumptions (300 GB/s, plan/devices.py). `hardware`, when
it measures, now times the one local GPU llama.cpp enumerates (a machine with several
keeps the assumption): a child process (`python -m inferenceos.hardware.device_speed
MODEL DEVICE`: a driver crash must not take the parent down) loads the CPU speed probe's
model (the built-in model when assembled, else the stand-in: llama_speed.py) with every
layer on the device, decodes a few tokens to warm up (on lavapipe the first use of each
shader is compiled), then times DECODE tokens, best of ROUNDS. `read_gbps` is the
device's bytes a token reads (every tensor, the token embeddings only when they are
also the output head, as the planner counts them; not a tensor over the device's
largest, which llama.cpp keeps and computes on the CPU: Gemma 3's 170 MiB head on
lavapipe) over the seconds a token took: what the
device achieves on llama.cpp's kernels, its overheads included (on lavapipe the kernels'
fixed cost dominates: ~2 ms an op). `host_copy_gbps` is `ggml_backend_tensor_set` of
COPY_BYTES into a buffer of the device's type, best of ROUNDS.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

DECODE = 6
ROUNDS = 2
COPY_BYTES = 64 << 20
TIMEOUT_S = 240.0
GGML_TYPE_I8 = 24


def model_read_bytes(path: Path, max_tensor_bytes: int | None = None) -> int:
    """Bytes of weights a decoded token reads on a device whose ops take tensors up to
    `max_tensor_bytes` (None: any): every tensor, the token embeddings only where no
    separate output head exists (then they are the head); a weight over the limit, or
    whose product over 512 columns is, stays on the CPU and is not counted."""
    from gguf import GGUFReader

    from inferenceos.hardware.profile import takes_weight

    def rows(shape: Any) -> int:
        return int(shape[1]) if len(shape) > 1 else 1

    sizes = {t.name: (int(t.n_bytes), rows(t.shape)) for t in GGUFReader(str(path)).tensors}
    if "output.weight" in sizes:
        sizes.pop("token_embd.weight", None)
    return sum(n for n, r in sizes.values() if takes_weight(n, r, max_tensor_bytes))


def measure_device_speed(model: Path, device: str, warnings: list[str],
                         max_tensor_bytes: int | None = None,
                         timeout: float = TIMEOUT_S) -> dict[str, float] | None:
    """{"read_gbps", "host_copy_gbps", "decode_s"} of `device` (whose ops take tensors
    up to `max_tensor_bytes`: `model_read_bytes`), or None with a warning."""
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "inferenceos.hardware.device_speed", str(model), device],
            capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        warnings.append(f"{device} speed probe: {exc}")
        return None
    lines = proc.stdout.strip().splitlines()
    try:
        data = json.loads(lines[-1]) if proc.returncode == 0 and lines else None
    except json.JSONDecodeError:
        data = None
    if not isinstance(data, dict):
        why = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        warnings.append(f"{device} speed probe failed: {why}")
        return None
    per_token = float(data["decode_s"]) / DECODE
    read = model_read_bytes(model, max_tensor_bytes)
    return {"read_gbps": round(read / per_token / 1e9, 4),
            "host_copy_gbps": round(float(data["host_copy_gbps"]), 3),
            "decode_s": round(per_token, 5)}


def _copy_rate(lib_dir: Path, device: str) -> float:
    """GB/s of ggml_backend_tensor_set from host memory into a buffer on `device`."""
    from inferenceos.hardware.llama_probe import bind, find_library

    def load(stem: str) -> ctypes.CDLL:
        return ctypes.CDLL(str(find_library(lib_dir, stem)), mode=ctypes.RTLD_GLOBAL)

    base, ggml = load("ggml-base"), load("ggml")
    p = ctypes.c_void_p

    class InitParams(ctypes.Structure):
        _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", p), ("no_alloc", ctypes.c_bool)]

    dev = bind(ggml, "ggml_backend_dev_by_name", p, ctypes.c_char_p)(device.encode())
    if not dev:
        raise RuntimeError(f"llama.cpp has no device {device}")
    buft = bind(ggml, "ggml_backend_dev_buffer_type", p, p)(dev)
    ctx = bind(base, "ggml_init", p, InitParams)(InitParams(1 << 16, None, True))
    tensor = bind(base, "ggml_new_tensor_1d", p, p, ctypes.c_int, ctypes.c_int64)(
        ctx, GGML_TYPE_I8, COPY_BYTES)
    buf = bind(base, "ggml_backend_alloc_ctx_tensors_from_buft", p, p, p)(ctx, buft)
    tensor_set = bind(base, "ggml_backend_tensor_set", None, p, p, ctypes.c_size_t,
                      ctypes.c_size_t)
    src = (ctypes.c_uint8 * COPY_BYTES)()
    best = float("inf")
    for _ in range(ROUNDS + 1):  # the first also pages the buffers in
        t0 = time.perf_counter()
        tensor_set(tensor, src, 0, COPY_BYTES)
        best = min(best, time.perf_counter() - t0)
    bind(base, "ggml_backend_buffer_free", None, p)(buf)
    bind(base, "ggml_free", None, p)(ctx)
    return COPY_BYTES / best / 1e9


def _child(path: str, device: str) -> dict[str, Any]:
    """Load `path` with every layer on the GPU, time decode and the copy (in the child)."""
    from inferenceos.hardware.llama_devices import llama_lib_dir
    from inferenceos.hardware.openmp import bounded_spin
    from inferenceos.hardware.vulkan import vulkan_environment

    bounded_spin()
    lib_dir = llama_lib_dir()
    vulkan_environment(lib_dir)  # lavapipe where it is the only device (vulkan.py)
    import llama_cpp.llama_cpp as ll

    @ll.llama_log_callback
    def _quiet(level: int, text: bytes, user: ctypes.c_void_p) -> None:
        pass

    ll.llama_log_set(_quiet, ctypes.c_void_p(0))
    ll.llama_backend_init()
    mp = ll.llama_model_default_params()
    mp.n_gpu_layers = 999
    model = ll.llama_model_load_from_file(path.encode(), mp)
    if not model:
        raise RuntimeError(f"llama.cpp could not load {path}")
    cp = ll.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch = 256, 64, 64
    cp.n_threads = cp.n_threads_batch = os.cpu_count() or 1
    cp.flash_attn_type = 1
    cp.no_perf = True
    ctx = ll.llama_init_from_model(model, cp)
    if not ctx:
        raise RuntimeError("llama.cpp could not create a context")

    def decode(tokens: list[int]) -> None:
        arr = (ll.llama_token * len(tokens))(*tokens)
        if ll.llama_decode(ctx, ll.llama_batch_get_one(arr, len(tokens))) != 0:
            raise RuntimeError("llama_decode failed")

    decode([3 + i for i in range(8)])
    for i in range(2):  # warm-up: every shader of a decode step compiled
        decode([20 + i])
    best = float("inf")
    for r in range(ROUNDS):
        t0 = time.perf_counter()
        for i in range(DECODE):
            decode([30 + (r * DECODE + i) % 200])
            ll.llama_get_logits_ith(ctx, -1)
        best = min(best, time.perf_counter() - t0)
    ll.llama_free(ctx)
    ll.llama_model_free(model)
    assert lib_dir is not None
    return {"decode_s": best, "host_copy_gbps": _copy_rate(lib_dir, device)}


if __name__ == "__main__":
    print(json.dumps(_child(sys.argv[1], sys.argv[2])))
