"""LoRA adapter GGUFs written with `gguf.GGUFWriter` for a base model file.

llama.cpp's format (src/llama-adapter.cpp): `general.type = "adapter"`, the base's
`general.architecture`, `adapter.type = "lora"`, `adapter.lora.alpha`, and per adapted
matrix W (ggml shape [n_in, n_out]) the tensors `<W's name>.lora_a` (ggml [n_in, r])
and `<W's name>.lora_b` (ggml [r, n_out]); the layer computes W x + s * alpha / r * B A x.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from gguf import GGUFWriter

from inferenceos.model.gguf_file import read_gguf

DEFAULT_TARGETS = ("attn_q", "attn_v", "ffn_up")


def write_lora(
    path: Path, base: Path, seed: int = 0, rank: int = 4, alpha: float = 4.0,
    magnitude: float = 0.1, targets: Sequence[str] = DEFAULT_TARGETS,
    layers: Sequence[int] | None = None,
) -> Path:
    """Write a LoRA adapter for the model file `base` to `path`: seeded random A and B
    (standard normal times `magnitude`) of rank `rank` for the `targets` matrices of
    `layers` (default: every layer). Returns `path`."""
    g = read_gguf(base)
    arch = str(g.metadata["general.architecture"])
    shapes = {t.name: t.shape for t in g.tensors}
    n_layer = int(g.metadata[f"{arch}.block_count"])
    rng = np.random.default_rng(seed)
    w = GGUFWriter(str(path), arch)
    w.add_string("general.type", "adapter")
    w.add_string("adapter.type", "lora")
    w.add_float32("adapter.lora.alpha", alpha)
    for i in layers if layers is not None else range(n_layer):
        for t in targets:
            name = f"blk.{i}.{t}.weight"
            n_in, n_out = shapes[name][0], shapes[name][1]
            a = (rng.standard_normal((rank, n_in)) * magnitude).astype(np.float32)
            b = (rng.standard_normal((n_out, rank)) * magnitude).astype(np.float32)
            w.add_tensor(f"{name}.lora_a", a)  # numpy shapes are ggml's reversed
            w.add_tensor(f"{name}.lora_b", b)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
