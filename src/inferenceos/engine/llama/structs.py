"""The plan's `LlamaParams` as llama.cpp's own parameter structs: the one builder.

Every load of a model from a plan goes through here: `LoadedModel` (engine/session.py)
and `measure_load` (engine/llama/memory_report.py, the memory model's ground truth), so what
is measured is the load the engine makes (issue 27: the measuring copy had lost the
devices, tensor split and buffer-type overrides of a multi-device plan).

- `model_params(s)` → `ModelParams`: `llama_model_params` plus the ctypes buffers its
  pointers lead into (tensor split, buffer-type overrides, device list). Keep the
  `ModelParams` alive until `llama_model_load_from_file` has returned.
- `context_params(s)` → `llama_context_params` for the model's main context.
- `embedding_context_params(s, n_ctx, n_seq_max)` → the pooled-embeddings context.
- `file_check_params()`, `vocab_only_params()`: loads that are no plan's (a dry load
  of a file on the CPU; its vocabulary alone).
- `describe_model_params` / `describe_context_params`: a struct as plain values with
  pointers followed (device and buffer-type names, split shares), to compare or log.

Fields not set here keep llama.cpp's defaults (split_mode LAYER, lazy_mode AUTO,
offload_kqv, RoPE from the model). `LlamaParams` has no mlock: the load mode
is AUTO (map the file where every device can) or NONE (read into buffers).
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass, field
from typing import Any

from inferenceos import interrupt
from inferenceos.engine.llama.lib import lib, stop_callbacks
from inferenceos.plan.llama_params import KV_CACHE_TYPES, LlamaParams

# llama_load_mode (llama.h): AUTO maps the file where every device supports it; NONE
# reads tensors into buffers (needed by no_alloc, which asserts with a mapping)
LOAD_MODE_AUTO = -1
LOAD_MODE_NONE = 0

# llama.cpp reads tensor_split[i] for each of its devices, up to llama_max_devices()
_MAX_DEVICES = 16


def default_threads() -> int:
    """CPU threads to compute with: the cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


@dataclass
class ModelParams:
    """A `llama_model_params` and the buffers it points into (`keep`): they must live
    until llama_model_load_from_file returns, so hold this object until then."""

    struct: Any
    keep: list[Any] = field(default_factory=list)


def model_params(s: LlamaParams, *, dry_run: bool = False) -> ModelParams:
    """llama_model_params for loading a model as `s` places it.

    `dry_run`: llama.cpp's no_alloc, which sizes every buffer without allocating (it
    logs model and KV buffers as 0 MiB); it needs load mode NONE. The progress callback
    lets a Ctrl-C stop the load (interrupt.py). Naming an RPC worker's device connects
    to it now (engine/llama/devices.py): a worker that is down is a ModelLoadError here.
    """
    ll = lib()
    params = ll.llama_model_default_params()
    params.n_gpu_layers = s.n_gpu_layers
    params.main_gpu = s.main_gpu
    # llama_model_params has no use_mmap field in 0.3.36 (setting it was a silent
    # no-op): the load mode says it
    params.load_mode = LOAD_MODE_AUTO if s.use_mmap and not dry_run else LOAD_MODE_NONE
    params.use_extra_bufts = s.use_extra_bufts  # no CPU_REPACK copies when False
    params.no_alloc = dry_run
    params.progress_callback = stop_callbacks()[0]
    return ModelParams(params, _placement(params, s))


def file_check_params() -> Any:
    """llama_model_params for asking whether llama.cpp can load a file at all (the
    registry's load check): a no_alloc dry load on the CPU, whatever the placement."""
    params = lib().llama_model_default_params()
    params.n_gpu_layers = 0  # the question is the file, not the placement
    params.no_alloc = True
    params.load_mode = LOAD_MODE_NONE  # with a mapping, no_alloc asserts
    return params


def vocab_only_params() -> Any:
    """llama_model_params that load a file's vocabulary and no weights (tokenizing
    without a loaded model: the server's llama.cpp-compatible routes)."""
    params = lib().llama_model_default_params()
    params.vocab_only = True
    params.n_gpu_layers = 0
    return params


def _placement(params: Any, s: LlamaParams) -> list[Any]:
    """Fill buffer-type overrides, tensor split and devices; returns the buffers
    llama.cpp will point into."""
    keep: list[Any] = []
    if s.tensor_buft_overrides:
        from inferenceos.engine.llama.devices import TensorBuftOverride, buffer_type

        n = len(s.tensor_buft_overrides)
        arr = (TensorBuftOverride * (n + 1))()  # NULL-terminated
        for i, (pattern, device) in enumerate(s.tensor_buft_overrides):
            raw = pattern.encode()
            keep.append(raw)
            arr[i].pattern = raw
            arr[i].buft = buffer_type(device)
        params.tensor_buft_overrides = ctypes.cast(arr, ctypes.c_void_p)
        keep.append(arr)
    if s.tensor_split:
        split = (ctypes.c_float * max(len(s.tensor_split), _MAX_DEVICES))(*s.tensor_split)
        params.tensor_split = split
        keep.append(split)
    if s.devices:
        from inferenceos.engine.llama.devices import device_array, install_abort_note

        devices = device_array(s.devices)  # None: llama.cpp's default (every local device)
        if devices is not None:
            install_abort_note()
            params.devices = ctypes.cast(devices, ctypes.c_void_p)
            keep.append(devices)
    return keep


def _abortable(params: Any) -> None:
    """Make a context's decodes stop when a Ctrl-C asks (interrupt.py): llama.cpp polls
    the flag between graph nodes, in C."""
    params.abort_callback = stop_callbacks()[1]
    params.abort_callback_data = interrupt.flag_address()


def context_params(s: LlamaParams, eval_callback: Any = None) -> Any:
    """llama_context_params for the main (logits) context `s` sizes. `eval_callback` is
    a ctypes cb_eval (an AttentionProbe's, the prefetcher's) and must outlive the
    context. n_ubatch is capped at n_batch, as llama.cpp itself would."""
    params = lib().llama_context_default_params()
    params.n_ctx = s.n_ctx
    params.n_batch = s.n_batch
    params.n_ubatch = min(s.n_ubatch, s.n_batch)
    params.n_seq_max = s.n_seq_max
    params.kv_unified = s.kv_unified
    params.swa_full = s.swa_full
    params.type_k = KV_CACHE_TYPES[s.type_k]
    params.type_v = KV_CACHE_TYPES[s.type_v]
    params.n_threads = s.n_threads or default_threads()
    params.n_threads_batch = s.n_threads_batch or params.n_threads
    params.flash_attn_type = s.flash_attn
    params.op_offload = s.op_offload
    params.no_perf = True
    if eval_callback is not None:
        params.cb_eval = eval_callback
    _abortable(params)
    return params


def embedding_context_params(s: LlamaParams, n_ctx: int, n_seq_max: int,
                             rank: bool = False) -> Any:
    """llama_context_params for a second context that pools hidden states (mean; with
    `rank`, a reranker's classification head: one score per sequence) of up to
    `n_seq_max` texts in `n_ctx` cells. A pooled embedding needs each text whole in one
    micro-batch, so n_batch = n_ubatch = n_ctx."""
    ll = lib()
    params = ll.llama_context_default_params()
    params.n_ctx = params.n_batch = params.n_ubatch = n_ctx
    params.n_seq_max = n_seq_max
    params.kv_unified = True
    params.n_threads = params.n_threads_batch = s.n_threads or default_threads()
    params.embeddings = True
    params.pooling_type = ll.LLAMA_POOLING_TYPE_RANK if rank else ll.LLAMA_POOLING_TYPE_MEAN
    params.no_perf = True
    _abortable(params)
    return params


# -- the structs as plain values ------------------------------------------------------


def _address(value: Any) -> int:
    """A ctypes pointer or function field's address (0 when NULL)."""
    return ctypes.cast(value, ctypes.c_void_p).value or 0


def describe_model_params(p: Any) -> dict[str, Any]:
    """Every llama_model_params field as plain values: the device list and the
    overrides by llama.cpp's names, the tensor split as its first llama_max_devices()
    shares, callbacks as set or not. Call it while the pointed-to buffers live."""
    from inferenceos.engine.llama.devices import ggml

    g = ggml()  # its names of devices and buffer types
    out: dict[str, Any] = {}
    for name, _ in type(p)._fields_:
        out[name] = getattr(p, name)
    devices: list[str] = []
    if p.devices:
        arr = ctypes.cast(p.devices, ctypes.POINTER(ctypes.c_void_p))
        while arr[len(devices)]:
            devices.append(g.ggml_backend_dev_name(arr[len(devices)]).decode())
    out["devices"] = devices
    overrides: list[tuple[str, str]] = []
    if p.tensor_buft_overrides:
        from inferenceos.engine.llama.devices import TensorBuftOverride

        ov = ctypes.cast(p.tensor_buft_overrides, ctypes.POINTER(TensorBuftOverride))
        while ov[len(overrides)].pattern:
            o = ov[len(overrides)]
            overrides.append((o.pattern.decode(), g.ggml_backend_buft_name(o.buft).decode()))
    out["tensor_buft_overrides"] = overrides
    out["tensor_split"] = list(p.tensor_split[:_MAX_DEVICES]) if p.tensor_split else []
    out["progress_callback"] = _address(p.progress_callback)
    out["kv_overrides"] = _address(p.kv_overrides)
    return out


def describe_context_params(p: Any) -> dict[str, Any]:
    """Every llama_context_params field as plain values (pointers and callbacks as
    addresses; floats as they are, NaN included)."""
    out: dict[str, Any] = {}
    for name, _ in type(p)._fields_:
        value = getattr(p, name)
        out[name] = value if isinstance(value, (int, float, bool)) else _address(value)
    return out
