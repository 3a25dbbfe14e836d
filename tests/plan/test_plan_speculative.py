"""The planner's model of speculative decoding: priors, what telemetry taught, and
`simulate --draft` (tiny models, real telemetry store)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from inferenceos import telemetry
from inferenceos.cli.main import app
from inferenceos.plan import speculative as spec
from inferenceos.plan.simulate import Workload, simulate, with_draft
from plan_factories import machine

runner = CliRunner()


def _drafted_metrics(draft: str, tokens: int, accepted: int, steps: int) -> dict[str, object]:
    """A run's metrics; its n-gram replay counted what its drafting did (for ngram the
    plan reads only replays: engine/spec/ngram_replay.py)."""
    counters = {"draft_tokens": tokens, "draft_accepted": accepted, "decode_steps": steps}
    return {"prompt_tokens": 40, "prompt_tps": 500.0, "ttft_s": 0.08,
            "completion_tokens": steps + accepted, "decode_tps": 400.0, "stop_reason": "length",
            "draft": draft, **counters, "ngram_replay": counters}


def test_priors_promise_a_gain_only_where_one_is_possible() -> None:
    copy = spec.predict_draft("ngram", "copy")
    free = spec.predict_draft("ngram", "free")
    assert copy.speedup > 2.5 and copy.k > 8  # long drafts of a quoted passage
    assert free.speedup < 1.05  # free text: about plain
    # a layer-skipped copy of Gemma costs a decode step per draft token: never pays
    assert spec.predict_draft("self", "copy").speedup == 1.0
    assert spec.predict_draft("self", "copy").k == 0
    # a draft model a tenth of the target's size, same family
    small = spec.predict_draft("d.gguf", "free", spec.model_draft_cost(100, 1000))
    assert 1.1 < small.speedup < 3 and small.k >= 1
    assert not spec.can_pay(spec.model_draft_cost(1000, 1000), 12)
    assert spec.can_pay(spec.model_draft_cost(100, 1000), 12)
    with pytest.raises(Exception, match="unknown task"):
        spec.predict_draft("ngram", "poetry")


def _replayed(tokens: int, accepted: int, steps: int) -> dict[str, object]:
    c = {"draft_tokens": tokens, "draft_accepted": accepted, "decode_steps": steps}
    return {"draft": "ngram", **c, "ngram_replay": c}


def test_evidence_pools_the_runs_of_one_drafter_kind() -> None:
    extras = [
        _replayed(40, 30, 10),
        _replayed(10, 0, 10),
        {"draft": "ngram", "draft_tokens": 7, "draft_accepted": 7, "decode_steps": 1},  # no
        # replay (interrupted, or recorded before replays): not in ngram's measure
        {"draft": "self", "draft_tokens": 99, "draft_accepted": 1, "decode_steps": 9},
        {"draft": "/m/other.gguf", "draft_tokens": 8, "draft_accepted": 8, "decode_steps": 2},
        _replayed(5, 9, 1),  # bad
        {},  # a plain run
    ]
    ev = spec.pool_evidence(extras, "ngram")
    assert ev is not None and ev.runs == 2
    assert ev.acceptance == pytest.approx(30 / 50)
    assert ev.tokens_per_step == pytest.approx((20 + 30) / 20)
    assert ev.drafts_per_step == pytest.approx(50 / 20)
    model = spec.pool_evidence(extras, "/x/draft.gguf")  # any draft file is a 'model'
    assert model is not None and model.runs == 1
    assert spec.pool_evidence([{}], "ngram") is None
    learned = spec.predict_draft("ngram", None, 0.2, ev)
    assert learned.basis == "learned from 2 runs"
    assert learned.speedup == pytest.approx(2.5 / (1 + 0.2 * 2.5))


def test_simulate_learns_acceptance_from_recorded_drafted_runs(tiny_llama: Path) -> None:
    pred = simulate(tiny_llama, machine(), Workload(prompt_tokens=64, output_tokens=64))
    assert with_draft(pred, "ngram").draft.basis == "prior for free text"  # type: ignore[union-attr]
    rec = telemetry.recorder()
    for _ in range(3):  # copying runs: 4 drafts a step, nearly all accepted
        rec.generation(tiny_llama, source="run", settings={"n_threads": 2},
                       metrics=_drafted_metrics("ngram", 80, 76, 20))
    assert rec.flush()
    [row, *_] = telemetry.generations(model=tiny_llama)
    assert row.extra["draft"] == "ngram" and row.extra["draft_accepted"] == 76
    learned = with_draft(pred, "ngram")
    d = learned.draft
    assert d is not None and d.basis == "learned from 3 runs"
    assert d.acceptance == pytest.approx(0.95) and d.tokens_per_step == pytest.approx(96 / 20)
    assert learned.draft_decode_tps == pytest.approx(pred.decode_tps * d.speedup)
    assert d.speedup > 2
    # naming a task asks for its prior instead
    assert with_draft(pred, "ngram", "free").draft.speedup < 1.05  # type: ignore[union-attr]
    # a drafted run's decode speed does not teach the plain decode calibration
    from inferenceos.plan.calibration_load import load_calibration
    from inferenceos.plan.model_facts import load_model_facts

    facts = load_model_facts(tiny_llama)
    assert load_calibration(machine(), facts, 2).decode_scale == 1.0
    for _ in range(3):  # the same figures, not drafted: they do
        plain = {k: v for k, v in _drafted_metrics("", 0, 0, 96).items() if k != "draft"}
        rec.generation(tiny_llama, source="run", settings={"n_threads": 2}, metrics=plain)
    assert rec.flush()
    assert load_calibration(machine(), facts, 2).decode_scale != 1.0


def test_simulate_draft_on_the_command_line(tiny_llama: Path, quiet_cpus: None) -> None:
    base = ["simulate", str(tiny_llama), "--ram", "8GiB", "--ram-bandwidth", "20",
            "--prompt-tokens", "64", "--output-tokens", "64"]
    res = runner.invoke(app, [*base, "--draft", "ngram", "--task", "copy", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    s = data["speculative"]
    assert s["drafter"] == "ngram" and s["basis"] == "prior for copy text"
    assert s["decode_tps"] == pytest.approx(data["decode_tps"] * s["speedup"], rel=1e-3)
    assert s["speedup"] > 2
    res = runner.invoke(app, [*base, "--draft", str(tiny_llama)], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "decode, tiny-llama.gguf drafts" in res.stdout
    assert "drafting does not pay" in res.stdout  # the model drafting for itself
    res = runner.invoke(app, [*base, "--draft", str(tiny_llama), "--json"])
    assert json.loads(res.stdout)["peak_memory_bytes"]["draft model"] > 0
    assert json.loads(runner.invoke(app, [*base, "--json"]).stdout)["speculative"] is None
    res = runner.invoke(app, [*base, "--draft", "bogus"])
    assert res.exit_code != 0 and "unknown drafter 'bogus'" in str(res.exception)
    res = runner.invoke(app, [*base, "--draft", "ngram", "--task", "poetry"])
    assert res.exit_code != 0 and "unknown task 'poetry'" in str(res.exception)


def test_simulate_draft_auto_predicts_the_plans_own_choice(tiny_llama: Path,
                                                           quiet_cpus: None) -> None:
    """`simulate --draft auto` shows the drafter the plan chose by itself, priced as the
    plan priced it (its verification row from the cost model, not the prior's 0.25):
    nothing without history, ngram after copying runs."""
    base = ["simulate", str(tiny_llama), "--prompt-tokens", "64", "--output-tokens", "64",
            "--draft", "auto", "--json"]
    first = json.loads(runner.invoke(app, base).stdout)
    assert first["speculative"] is None and first["plan"]["draft"]["drafter"] is None
    rec = telemetry.recorder()
    for _ in range(3):  # copying runs: 4 drafts a step, nearly all accepted
        rec.generation(tiny_llama, source="run", settings={"n_threads": 2},
                       metrics=_drafted_metrics("ngram", 80, 76, 20))
    assert rec.flush()
    res = runner.invoke(app, base)
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    plan, s = data["plan"]["draft"], data["speculative"]
    assert plan["drafter"] == "ngram" and plan["asked"] == "auto"
    assert s["drafter"] == "ngram" and s["speedup"] == pytest.approx(plan["speedup"], rel=1e-3)
    assert s["cost"] == pytest.approx(plan["options"][1]["cost"], rel=1e-3)
