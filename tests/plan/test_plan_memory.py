"""The analytical memory model: KV geometry, padding, cache types, compute phases —
and, on the tiny fixtures, agreement with the buffers llama.cpp itself reports."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferenceos.errors import UsageError
from inferenceos.plan.memory import (
    ContextSettings,
    compute_buffer_bytes,
    effective_context,
    kv_layer_bytes,
    output_buffer_bytes,
    repacked,
    row_bytes,
)
from inferenceos.plan.model_facts import load_model_facts
from plan_factories import make_facts

MiB = 1024 * 1024


def test_row_bytes_of_cache_types() -> None:
    assert row_bytes("f16", 128) == 256
    assert row_bytes("q8_0", 128) == 4 * 34
    assert row_bytes("q4_0", 128) == 4 * 18
    with pytest.raises(UsageError):
        row_bytes("q8_0", 16)


def test_context_is_padded_and_batches_clamped() -> None:
    e = effective_context(ContextSettings(n_ctx=1000, n_batch=4096, n_ubatch=2048))
    assert (e.n_ctx, e.n_ctx_seq, e.n_batch, e.n_ubatch) == (1024, 1024, 1024, 1024)
    e = effective_context(ContextSettings(n_ctx=4096, n_seq=3))
    assert e.n_ctx_seq == 1536 and e.n_ctx == 4608 and e.n_stream == 3


def test_kv_gqa_and_quantized_types() -> None:
    facts = make_facts(n_layer=2)  # 8 KV heads of 128
    f16 = kv_layer_bytes(facts, 0, ContextSettings(n_ctx=4096))
    assert f16 == 4096 * 2 * 8 * 128 * 2
    q8 = kv_layer_bytes(
        facts, 0, ContextSettings(n_ctx=4096, type_k="q8_0", type_v="q8_0", flash_attn=True)
    )
    assert q8 == f16 * 34 // 64


def test_swa_layers_keep_their_window(tiny_swa: Path) -> None:
    facts = load_model_facts(tiny_swa)
    full = ContextSettings(n_ctx=4096, swa_full=True)
    windowed = ContextSettings(n_ctx=4096, swa_full=False)
    swa = [i for i, layer in enumerate(facts.spec.layers) if layer.is_swa]
    assert kv_layer_bytes(facts, swa[0], full) == kv_layer_bytes(facts, 1, full)
    # window 32 + ubatch 512 padded to 256 cells
    assert kv_layer_bytes(facts, swa[0], windowed) * 4096 == kv_layer_bytes(facts, 1, full) * 768


def test_quantized_v_needs_flash_attention() -> None:
    with pytest.raises(UsageError, match="flash attention"):
        ContextSettings(type_v="q8_0", flash_attn=False).validate()


def test_compute_grows_with_ubatch_and_kq_without_flash_attention() -> None:
    facts = make_facts(n_layer=2, n_vocab=1000)
    small = compute_buffer_bytes(facts, ContextSettings(n_ctx=8192, n_ubatch=128))
    big = compute_buffer_bytes(facts, ContextSettings(n_ctx=8192, n_ubatch=512))
    fa = compute_buffer_bytes(facts, ContextSettings(n_ctx=8192, n_ubatch=512, flash_attn=True))
    assert big == pytest.approx(4 * small, rel=0.05)
    assert fa < big / 4  # K·Q (8192 × 512 × 32 heads × 4 B) is gone


def test_repack_rules() -> None:
    assert repacked("q4_k", 1024, 2, ("avx2",))
    assert not repacked("q4_k", 1020, 2, ("avx2",))
    assert not repacked("q6_k", 1024, 2, ("avx2",))
    assert not repacked("q4_0", 1024, 1, ("avx2",))


@pytest.mark.parametrize("kind", ["tiny_llama", "tiny_swa", "tiny_moe"])
@pytest.mark.parametrize(("n_ctx", "n_ubatch", "fa"), [(512, 32, False), (4096, 512, True)])
def test_prediction_matches_llama_cpp(
    request: pytest.FixtureRequest, kind: str, n_ctx: int, n_ubatch: int, fa: bool
) -> None:
    from inferenceos.engine.llama.memory_report import measure_load
    from inferenceos.plan.llama_params import LlamaParams

    path = request.getfixturevalue(kind)
    facts = load_model_facts(path)
    s = ContextSettings(n_ctx=n_ctx, n_ubatch=n_ubatch, flash_attn=fa, swa_full=False)
    r = measure_load(
        path,
        LlamaParams(n_ctx=n_ctx, n_ubatch=n_ubatch, flash_attn=int(fa), swa_full=False,
                    kv_unified=False, n_threads=1),
    )
    kv = sum(kv_layer_bytes(facts, i, s) for i in range(facts.spec.block_count))
    assert abs(r.kind("KV") - kv) < 0.02 * MiB  # llama.cpp prints MiB to 2 decimals
    assert abs(r.kind("compute") - compute_buffer_bytes(facts, s)) < max(
        0.05 * r.kind("compute"), MiB
    )
    assert abs(r.kind("output") - output_buffer_bytes(facts, s)) < 0.01 * MiB
