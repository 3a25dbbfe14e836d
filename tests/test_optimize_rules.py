"""The optimizer's pure parts: the knobs and search space, the stopping and adoption
rules, and how tuned settings are applied to a plan's parameters (no llama.cpp)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from inferenceos.engine.session import LoadSettings
from inferenceos.plan.tuned import apply_best, describe
from inferenceos.tuning import stopping
from inferenceos.tuning.space import (
    GPU_ALL_LAYERS,
    Knobs,
    llama_defaults,
    physical_cores,
    search_space,
    thread_values,
)

# -- space ---------------------------------------------------------------------------------


def test_llama_defaults_are_llama_cpp_tools_defaults() -> None:
    k = llama_defaults(has_gpu=False, cores=6)
    assert (k.n_threads, k.n_threads_batch, k.n_batch, k.n_ubatch) == (6, 6, 2048, 512)
    assert (k.flash_attn, k.type_k, k.type_v, k.n_gpu_layers) == (-1, "f16", "f16", 0)
    assert llama_defaults(has_gpu=True, cores=6).n_gpu_layers == GPU_ALL_LAYERS


def test_physical_cores_counts_distinct_sibling_sets(tmp_path: Path) -> None:
    # 4 logical CPUs, two hyper-threads per core: llama.cpp counts 2 cores
    for cpu, siblings in enumerate(["0,2", "1,3", "0,2", "1,3"]):
        topo = tmp_path / f"cpu{cpu}" / "topology"
        topo.mkdir(parents=True)
        (topo / "thread_siblings").write_text(siblings + "\n")
    assert physical_cores(tmp_path) == 2


def test_keys_group_what_shares_a_context_and_a_model() -> None:
    a = Knobs(n_threads=1, n_threads_batch=1)
    assert a.context_key() == replace(a, n_threads=4, n_threads_batch=2).context_key()
    assert a.context_key() != replace(a, n_ubatch=256).context_key()
    assert a.model_key() == replace(a, type_k="q8_0").model_key()
    assert a.model_key() != replace(a, n_gpu_layers=10).model_key()


def test_invalid_combinations() -> None:
    k = Knobs(n_threads=2, n_threads_batch=2)
    assert k.valid()
    assert not replace(k, type_v="q8_0", flash_attn=0).valid()  # quantized V needs FA
    assert not replace(k, n_batch=256, n_ubatch=512).valid()
    assert Knobs.from_json({**k.to_json(), "unknown": 1}) == k


def test_thread_values_and_search_space() -> None:
    assert thread_values(2) == [1, 2]
    assert thread_values(64) == [16, 32, 48, 63, 64]
    names = [d.name for d in search_space(has_gpu=False, n_layers=18, max_threads=4)]
    assert names == ["threads", "flash_attn", "batch", "kv"]
    gpu = search_space(has_gpu=True, n_layers=18, max_threads=4)
    assert gpu[0].name == "gpu_layers" and gpu[0].values[0] == GPU_ALL_LAYERS
    assert 0 in gpu[0].values
    best = Knobs(n_threads=2, n_threads_batch=2)
    kv = next(d for d in gpu if d.name == "kv")
    assert kv.apply(best, ("q8_0", "q8_0")).type_v == "q8_0"


# -- stopping --------------------------------------------------------------------------


def test_score_is_the_geometric_mean_of_phase_ratios() -> None:
    assert stopping.score(200, 50, 100, 50) == pytest.approx(2**0.5)
    assert stopping.score(0, 50, 100, 50) == 0.0


def test_hopeless_rules() -> None:
    assert stopping.stop_decode(40, 50)  # 0.8 of the best
    assert not stopping.stop_decode(45, 50)
    assert not stopping.stop_decode(1, 0)  # nothing to compare with yet
    assert stopping.skip_decode(80, 100, separable=False)
    assert not stopping.skip_decode(80, 100, separable=True)  # threads: decode may still win


def test_adoption_needs_a_gain_and_no_phase_lost() -> None:
    assert stopping.paired_ratios([110, 90, 100], [100, 100, 100]) == pytest.approx(1.0)
    assert stopping.adopt(1.05, 1.0)
    assert not stopping.adopt(1.2, 0.95)  # faster prefill does not buy slower decode
    assert not stopping.adopt(1.005, 1.0)  # within noise


# -- applying tuned settings ---------------------------------------------------------------


def _best(**kw: object) -> dict:
    settings = {"n_threads": 2, "n_threads_batch": 2, "n_batch": 1024, "n_ubatch": 256,
                "flash_attn": 1, "type_k": "q8_0", "type_v": "q8_0",
                "n_gpu_layers": 10}  # fmt: skip
    settings.update(kw)
    return {"settings": settings, "measured": {"ratios": {"prefill": 1.1, "decode": 1.02}},
            "ts": 0}  # fmt: skip


def test_apply_best_moves_only_what_cannot_break_the_plan() -> None:
    plan = LoadSettings(n_ctx=4096, n_batch=512, n_ubatch=512, n_threads=4, n_threads_batch=4,
                        flash_attn=1, n_gpu_layers=20)  # fmt: skip
    got = apply_best(plan, _best())
    assert (got.n_threads, got.n_batch, got.n_ubatch) == (2, 1024, 256)
    assert (got.type_k, got.type_v, got.n_gpu_layers, got.n_ctx) == ("q8_0", "q8_0", 10, 4096)


def test_apply_best_never_raises_threads_ubatch_or_gpu_layers() -> None:
    plan = LoadSettings(n_batch=512, n_ubatch=128, n_threads=1, n_threads_batch=1,
                        n_gpu_layers=5)  # fmt: skip
    got = apply_best(plan, _best(n_threads=8, n_threads_batch=8, n_ubatch=512, n_gpu_layers=99))
    assert (got.n_threads, got.n_threads_batch, got.n_ubatch, got.n_gpu_layers) == (1, 1, 128, 5)


def test_apply_best_keeps_a_quantized_cache_and_pinned_fields() -> None:
    plan = LoadSettings(type_k="q4_0", type_v="q4_0", flash_attn=1, n_threads=4)
    got = apply_best(plan, _best(type_k="f16", type_v="f16", flash_attn=0))
    assert (got.type_k, got.type_v, got.flash_attn) == ("q4_0", "q4_0", 1)
    pinned = apply_best(LoadSettings(n_threads=4, n_batch=64, n_ubatch=64), _best(),
                        pinned={"n_batch", "n_threads"})  # fmt: skip
    assert (pinned.n_threads, pinned.n_batch, pinned.n_ubatch) == (4, 64, 64)


def test_describe_names_the_source_and_ratios() -> None:
    text = describe(_best())
    assert text.startswith("tuned by optimize")
    assert "t2/2 b1024/u256 fa:on kv:q8_0/q8_0" in text and "1.10x" in text
