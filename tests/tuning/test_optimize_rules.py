"""The optimizer's pure parts: the knobs and search space, the stopping and adoption
rules, and how tuned settings are applied to a plan's parameters (no llama.cpp)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from inferenceos.plan.llama_params import LlamaParams
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


def test_a_best_is_confirmed_only_when_it_beats_the_defaults_on_both_phases() -> None:
    assert stopping.confirmed(1.05, 1.0) and stopping.confirmed(1.0, 1.03)
    assert not stopping.confirmed(0.999, 0.994)  # a tie within the noise (seen here)
    assert not stopping.confirmed(1.009, 0.978)  # faster prefill, slower decode
    assert not stopping.confirmed(1.004, 1.0)  # no phase lost, but no real gain either


# -- applying tuned settings ---------------------------------------------------------------


def _best(**kw: object) -> dict:
    settings = {"n_threads": 2, "n_threads_batch": 2, "n_batch": 1024, "n_ubatch": 256,
                "flash_attn": 1, "type_k": "q8_0", "type_v": "q8_0",
                "n_gpu_layers": 10}
    settings.update(kw)
    return {"settings": settings, "measured": {"ratios": {"prefill": 1.1, "decode": 1.02}},
            "ts": 0}


def test_apply_best_moves_only_what_cannot_break_the_plan() -> None:
    plan = LlamaParams(n_ctx=4096, n_batch=512, n_ubatch=512, n_threads=4, n_threads_batch=4,
                       flash_attn=1, n_gpu_layers=20)
    got = apply_best(plan, _best())
    assert (got.n_threads, got.n_batch, got.n_ubatch) == (2, 1024, 256)
    assert (got.type_k, got.type_v, got.n_gpu_layers, got.n_ctx) == ("q8_0", "q8_0", 10, 4096)


def test_apply_best_never_raises_threads_ubatch_or_gpu_layers() -> None:
    plan = LlamaParams(n_batch=512, n_ubatch=128, n_threads=1, n_threads_batch=1,
                       n_gpu_layers=5)
    got = apply_best(plan, _best(n_threads=8, n_threads_batch=8, n_ubatch=512, n_gpu_layers=99))
    assert (got.n_threads, got.n_threads_batch, got.n_ubatch, got.n_gpu_layers) == (1, 1, 128, 5)


def test_apply_best_keeps_a_quantized_cache_and_pinned_fields() -> None:
    plan = LlamaParams(type_k="q4_0", type_v="q4_0", flash_attn=1, n_threads=4)
    got = apply_best(plan, _best(type_k="f16", type_v="f16", flash_attn=0))
    assert (got.type_k, got.type_v, got.flash_attn) == ("q4_0", "q4_0", 1)
    pinned = apply_best(LlamaParams(n_threads=4, n_batch=64, n_ubatch=64), _best(),
                        pinned={"n_batch", "n_threads"})
    assert (pinned.n_threads, pinned.n_batch, pinned.n_ubatch) == (4, 64, 64)


def test_describe_names_the_source_and_ratios() -> None:
    text = describe(_best())
    assert text.startswith("tuned by optimize")
    assert "t2/2 b1024/u256 fa:on kv:q8_0/q8_0" in text and "1.10x" in text


# -- the search on a machine with known rates --------------------------------------------


class FakeRunner:
    """A machine whose rates are a function of the settings (no noise): the search's rules
    decide alone. The real trials are tested in test_optimize.py."""

    def __init__(self, rates) -> None:  # rates(knobs) -> (prefill t/s, decode t/s)
        self.rates = rates
        self.seen: list[tuple[str, Knobs]] = []

    def run(self, knobs: Knobs, phase: str, stop=None, skip_decode=None, dimension=""):
        from inferenceos.tuning.trials import TrialResult

        self.seen.append((phase, knobs))
        pre, dec = self.rates(knobs)
        res = TrialResult(knobs, phase, pre, dec, 512, 64, dimension=dimension,
                          elapsed_s=0.001)
        if skip_decode is not None and skip_decode(pre):
            res.decode_tps, res.decode_tokens, res.stopped_early = 0.0, 0, True
        elif stop is not None and stop(dec):
            res.decode_tokens, res.stopped_early = 16, True
        return res

    def close(self) -> None:
        pass


def _search(rates, monkeypatch: pytest.MonkeyPatch, max_threads: int = 4):
    from inferenceos.tuning import space
    from inferenceos.tuning.search import optimize

    monkeypatch.setattr(space, "physical_cores", lambda: 4)  # the defaults: 4 threads
    runner = FakeRunner(rates)
    result = optimize(Path("m.gguf"), budget_s=60, max_threads=max_threads, runner=runner)
    return result, runner


def test_search_finds_separate_thread_counts_and_a_faster_ubatch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def rates(k: Knobs) -> tuple[float, float]:
        # decode peaks at 2 threads (bandwidth), prefill scales with threads; ubatch 256
        # is 20 % faster at prefill; a q8_0 cache costs 10 % decode
        dec = {1: 40, 2: 60, 3: 55, 4: 50}[k.n_threads] * (0.9 if k.type_k == "q8_0" else 1)
        pre = 100 * k.n_threads_batch * (1.2 if k.n_ubatch == 256 else 1)
        return pre, dec

    result, runner = _search(rates, monkeypatch)
    assert (result.baseline.n_threads, result.baseline.n_threads_batch) == (4, 4)
    assert (result.best.n_threads, result.best.n_threads_batch) == (2, 4)
    assert result.best.n_ubatch == 256 and result.best.type_k == "f16"
    base_pre, base_dec = rates(result.baseline)
    assert result.ratios["prefill"] == pytest.approx(480 / base_pre)
    assert result.ratios["decode"] == pytest.approx(60 / base_dec)
    assert result.ended == "searched" and result.confirm_rounds == 3
    phases = [p for p, _ in runner.seen]
    assert phases[0] == "baseline" and "duel" in phases and phases[-1] == "confirm"
    # the thread sweep measures 4 threads first (decode 50), so 1 thread (40 < 0.85 x 50)
    # is hopeless and stops early; in the batch sweep ubatch 128 (prefill 400 after 480
    # at ubatch 256) skips its decode; a q8_0 cache (90 % of 60) is not hopeless
    stopped = [t.knobs for t in result.trials if t.stopped_early]
    assert [(k.n_threads, k.n_ubatch) for k in stopped] == [(1, 512), (2, 128)]
    assert all(k.type_k == "f16" for k in stopped)


def test_a_trade_off_is_not_adopted_and_defaults_stay_best(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def rates(k: Knobs) -> tuple[float, float]:
        # flash attention off: 30 % faster prefill but 5 % slower decode: not adopted
        fa_off = k.flash_attn == 0
        return (130.0 if fa_off else 100.0), (47.5 if fa_off else 50.0)

    result, _ = _search(rates, monkeypatch, max_threads=4)
    assert result.best == result.baseline
    assert result.ratios == {"prefill": 1.0, "decode": 1.0}
    assert "defaults" in result.notes[0]


def test_defaults_are_kept_and_stored_when_the_confirmation_does_not_confirm(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # ubatch 256 wins the batch sweep decisively, but in the final paired rounds against
    # the defaults its decode is 0.6 % slower (what a search here once recommended)
    def rates(k: Knobs) -> tuple[float, float]:
        return (130.0, 52.0) if k.n_ubatch == 256 else (100.0, 50.0)

    confirming = {"on": False}

    class Confirming(FakeRunner):
        def run(self, knobs: Knobs, phase: str, **kw):  # type: ignore[no-untyped-def]
            res = super().run(knobs, phase, **kw)
            if phase == "confirm" and knobs.n_ubatch == 256:
                confirming["on"] = True
                res.prefill_tps, res.decode_tps = 100.1, 49.7
            return res

    from inferenceos.tuning import space
    from inferenceos.tuning.search import optimize

    monkeypatch.setattr(space, "physical_cores", lambda: 4)
    result = optimize(Path("m.gguf"), budget_s=60, max_threads=4, runner=Confirming(rates))
    assert confirming["on"], "the search never confirmed its best"
    assert result.best == result.baseline
    assert result.ratios == {"prefill": 1.0, "decode": 1.0}
    assert result.best_measured == result.baseline_measured
    assert any("did not beat the defaults" in n for n in result.notes)
    # what is stored for run / serve (records.best) is the result's best: the defaults
    assert result.to_json()["best"] == result.baseline.to_json()


def test_a_decisive_win_skips_the_duel(monkeypatch: pytest.MonkeyPatch) -> None:
    def rates(k: Knobs) -> tuple[float, float]:
        # a busy neighbour: every thread past the first fights it for a core
        return (180.0, 38.0) if k.n_threads == 1 else (40.0, 1.7)

    assert stopping.decisive(4.5, 22.0) and not stopping.decisive(1.1, 1.1)
    assert not stopping.decisive(3.0, 0.9)  # a large win on one phase, a loss on the other
    result, runner = _search(rates, monkeypatch)
    assert (result.best.n_threads, result.best.n_threads_batch) == (1, 1)
    assert not any(phase == "duel" for phase, _ in runner.seen)
    assert result.ratios["decode"] == pytest.approx(38 / 1.7, rel=1e-4)


def test_flash_attention_on_can_beat_auto(monkeypatch: pytest.MonkeyPatch) -> None:
    # "auto" (the defaults' value) is not among the sweep's values: it is still measured
    # first, as the reference the others must beat
    def rates(k: Knobs) -> tuple[float, float]:
        return (150.0, 52.0) if k.flash_attn == 1 else (100.0, 50.0)

    result, _ = _search(rates, monkeypatch)
    assert result.best.flash_attn == 1
    assert result.ratios == pytest.approx({"prefill": 1.5, "decode": 1.04})


def test_thread_counts_transfer_only_under_the_same_load() -> None:
    # optimize ran while a neighbour held one of two cores (1 CPU free): its 1-thread
    # pick must not hold the plan back once both cores are free again
    busy = _best(n_threads=1, n_threads_batch=1)
    busy["measured"]["free_threads"] = 1
    idle_plan = LlamaParams(n_threads=2, n_threads_batch=2)
    assert apply_best(idle_plan, busy).n_threads == 2
    assert apply_best(LlamaParams(n_threads=1, n_threads_batch=1), busy).n_threads == 1
    idle = _best(n_threads=2, n_threads_batch=1)
    idle["measured"]["free_threads"] = 2
    got = apply_best(idle_plan, idle)
    assert (got.n_threads, got.n_threads_batch) == (2, 1)


def test_a_budget_that_pays_for_the_baseline_only_says_nothing_was_compared(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`optimize --budget 5` on a model whose trial takes 1.5 s: the baseline alone fits.
    The result must not claim the defaults were "the fastest settings tried"."""
    import time as _time

    from inferenceos.tuning import space
    from inferenceos.tuning.search import optimize

    class Slow(FakeRunner):
        def run(self, knobs: Knobs, phase: str, **kw):  # type: ignore[no-untyped-def]
            _time.sleep(0.3)
            res = super().run(knobs, phase, **kw)
            res.elapsed_s = 0.3
            return res

    monkeypatch.setattr(space, "physical_cores", lambda: 4)
    runner = Slow(lambda k: (100.0, 50.0))
    result = optimize(Path("m.gguf"), budget_s=1.0, max_threads=4, runner=runner)
    assert [p for p, _ in runner.seen] == ["baseline"]
    assert not any("fastest" in n for n in result.notes), result.notes
    assert result.compared == 0 and result.ended == "budget"
    assert any("baseline" in n and "nothing was compared" in n for n in result.notes)
    assert result.to_json()["compared"] == 0


def test_describe_shows_the_values_the_plan_applies() -> None:
    """The plan line said `1 thread` and then `tuned by optimize: t2/2`: the stored
    thread counts (found with 2 CPUs free) were not applied with 1 free."""
    best = _best(n_threads=2, n_threads_batch=2)
    best["measured"]["free_threads"] = 2
    plan = LlamaParams(n_batch=512, n_ubatch=512, n_threads=1, n_threads_batch=1)
    applied = apply_best(plan, best)
    assert applied.n_threads == 1
    text = describe(best, applied)
    assert "t1/1 b1024/u256" in text and "t2/2 b" not in text
    assert "optimize found t2/2 with 2 CPUs free" in text
    assert "t2/2 b1024/u256" in describe(best)  # the stored best alone, as before
