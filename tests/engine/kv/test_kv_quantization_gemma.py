"""KV cache quantization as llama.cpp reports it, on the real Gemma."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferenceos.engine.llama.lib import log
from inferenceos.engine.llama.memory_report import parse_buffer_lines
from inferenceos.engine.session import LoadedModel
from inferenceos.plan.llama_params import LlamaParams


def kv_bytes(path: Path, kv_type: str) -> int:
    mark = log().mark()
    settings = LlamaParams(n_ctx=4096, type_k=kv_type, type_v=kv_type, flash_attn=1)
    with LoadedModel(path, settings):
        pass
    buffers = parse_buffer_lines(log().since(mark))
    return sum(v for (kind, _), v in buffers.items() if kind == "KV")


@pytest.mark.slow
def test_q8_0_kv_is_at_most_55_percent_of_f16(gemma_path: Path) -> None:
    f16, q8, q4 = (kv_bytes(gemma_path, t) for t in ("f16", "q8_0", "q4_0"))
    print(f"\nKV bytes at n_ctx 4096: f16 {f16}, q8_0 {q8} ({q8 / f16:.1%}), "
          f"q4_0 {q4} ({q4 / f16:.1%})")
    assert f16 > 0
    assert q8 / f16 <= 0.55  # 34 bytes per 32 values against 64
    assert q4 / f16 <= 0.30  # 18 bytes per 32 values
