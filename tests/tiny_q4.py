"""A small Q4_0 llama (8 layers of 1024 wide, ~52 MB) for the memory-limit tests.

Q4_0 matrices with rows divisible by 8 are what llama.cpp's CPU backend repacks on
AVX2 (plan/memory.py `_REPACK_RULES`), so this model shows the difference between
weights left in the mapped file and weights copied into anonymous CPU_REPACK memory,
at a size a test can put under a cgroup limit. The vocabulary is tiny_models' one.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import quantize

from tiny_models import TinyShape, _add_metadata, _vocab

SHAPE = TinyShape(n_layer=8, n_embd=1024, n_head=8, n_head_kv=4, n_ff=2816, n_ctx=2048)


def write_q4_model(path: Path, seed: int = 0) -> Path:
    """Write the model to `path` (once: an existing file of the right name is kept)."""
    if path.exists():
        return path
    s = SHAPE
    rng = np.random.default_rng(seed)
    n_vocab = len(_vocab()[0])
    tmp = path.with_suffix(".part")
    w = GGUFWriter(str(tmp), s.arch)
    _add_metadata(w, s, n_vocab, None)

    def q4(name: str, rows: int, cols: int) -> None:
        data = (rng.standard_normal((rows, cols)) * 0.05).astype(np.float32)
        w.add_tensor(name, quantize(data, GGMLQuantizationType.Q4_0),
                     raw_dtype=GGMLQuantizationType.Q4_0)

    def ones(name: str) -> None:
        w.add_tensor(name, np.ones(s.n_embd, dtype=np.float32))

    w.add_tensor("token_embd.weight",
                 (rng.standard_normal((n_vocab, s.n_embd)) * 0.1).astype(np.float32))
    hd = s.n_embd // s.n_head
    for i in range(s.n_layer):
        b = f"blk.{i}."
        ones(b + "attn_norm.weight")
        q4(b + "attn_q.weight", s.n_head * hd, s.n_embd)
        q4(b + "attn_k.weight", s.n_head_kv * hd, s.n_embd)
        q4(b + "attn_v.weight", s.n_head_kv * hd, s.n_embd)
        q4(b + "attn_output.weight", s.n_embd, s.n_head * hd)
        ones(b + "ffn_norm.weight")
        q4(b + "ffn_gate.weight", s.n_ff, s.n_embd)
        q4(b + "ffn_up.weight", s.n_ff, s.n_embd)
        q4(b + "ffn_down.weight", s.n_embd, s.n_ff)
    ones("output_norm.weight")
    w.add_tensor("output.weight",
                 (rng.standard_normal((n_vocab, s.n_embd)) * 0.1).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tmp.rename(path)
    return path
