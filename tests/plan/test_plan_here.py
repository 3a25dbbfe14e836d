"""The one call for this machine now (`plan.here.plan_here`): every caller gets
optimize's stored best (and says so), the request's policy, and what the request pins
stays pinned."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferenceos import telemetry
from inferenceos.errors import UsageError
from inferenceos.plan.entry import LoadRequest
from inferenceos.plan.here import plan_here
from inferenceos.plan.model_facts import load_model_facts
from plan_factories import GiB, machine


def _store_best(path: Path) -> None:
    rec = telemetry.recorder()
    rec.best(path, settings={"n_threads": 1, "n_threads_batch": 1, "n_batch": 64,
                             "n_ubatch": 32, "flash_attn": 0, "type_k": "f16",
                             "type_v": "f16", "n_gpu_layers": 0},
             measured={"prefill_tps": 100.0, "decode_tps": 50.0})
    rec.flush(timeout=10)


def test_stored_best_reaches_the_plan_and_its_changes(tiny_llama: Path) -> None:
    facts = load_model_facts(tiny_llama)
    m = machine(ram=8 * GiB, threads=1)
    plain = plan_here(facts, m, LoadRequest(threads=1), sense_load=False).plan
    assert not any("tuned by optimize" in c.what for c in plain.changes)
    _store_best(tiny_llama)
    tuned = plan_here(facts, m, LoadRequest(threads=1), sense_load=False).plan
    params = tuned.params()
    assert params.n_ubatch == 32 and params.flash_attn == 0 and params.n_batch == 64
    assert any("tuned by optimize" in c.what for c in tuned.changes)
    # what the request sets itself is never overridden
    pinned = plan_here(facts, m, LoadRequest(threads=1, n_batch=128, flash_attn=True),
                       sense_load=False).plan.params()
    assert pinned.n_batch == 128 and pinned.flash_attn == 1


def test_policy_comes_with_the_request_and_is_validated(tiny_llama: Path) -> None:
    facts = load_model_facts(tiny_llama)
    here = plan_here(facts, machine(ram=8 * GiB), LoadRequest(policy="capacity"),
                     sense_load=False)
    assert here.policy.resolved == "capacity"
    with pytest.raises(UsageError, match="unknown policy"):
        plan_here(facts, machine(ram=8 * GiB), LoadRequest(policy="fastest"), sense_load=False)


def _store(path: Path, free_threads: int, **settings: object) -> None:
    base = {"n_threads": 2, "n_threads_batch": 2, "n_batch": 2048, "n_ubatch": 512,
            "flash_attn": -1, "type_k": "f16", "type_v": "f16", "n_gpu_layers": 0}
    rec = telemetry.recorder()
    rec.best(path, settings={**base, **settings},
             measured={"free_threads": free_threads, "ratios": {"prefill": 1.0,
                                                                "decode": 1.0}})
    rec.flush(timeout=10)


def test_the_plan_line_names_the_threads_it_runs_with(tiny_llama: Path) -> None:
    """After `optimize` ran with 2 CPUs free, a plan made with 1 free said `1 thread` and
    then `tuned by optimize: t2/2`: the phrase now shows what the plan applies."""
    facts = load_model_facts(tiny_llama)
    _store(tiny_llama, free_threads=2)
    plan = plan_here(facts, machine(ram=8 * GiB, threads=1), LoadRequest(),
                     sense_load=False).plan
    p = plan.params()
    assert (p.n_threads, p.n_threads_batch) == (1, 1)
    (phrase,) = [c.what for c in plan.changes if "tuned by optimize" in c.what]
    assert "t1/1 " in phrase and "1 thread ·" in plan.summary()
    assert "found t2/2 with 2 CPUs free" in phrase


def test_the_summary_shows_tuned_thread_counts(tiny_llama: Path) -> None:
    """Tuned decode and prompt threads differ (t1/2): the summary says so, not the
    planner's own count."""
    facts = load_model_facts(tiny_llama)
    _store(tiny_llama, free_threads=2, n_threads=1, n_threads_batch=2, n_ubatch=256)
    plan = plan_here(facts, machine(ram=8 * GiB, threads=2), LoadRequest(),
                     sense_load=False).plan
    p = plan.params()
    assert (p.n_threads, p.n_threads_batch) == (1, 2) and plan.threads == 2
    assert "1 thread (2 for prompts)" in plan.summary()
    assert f"ubatch {p.n_ubatch} ·" in plan.summary()
