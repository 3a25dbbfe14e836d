"""simulate predicts decode as `run` will decode (issue 44): with the drafter its plan
picked, when it picked one, and it says which assumption the figure rests on."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferenceos import telemetry
from inferenceos.plan.simulate import Workload, simulate
from plan_factories import machine

W = Workload(prompt_tokens=64, output_tokens=64)


def _copying_run() -> dict[str, object]:
    """A run whose n-gram drafts were nearly all accepted (4 a step, 76 of 80)."""
    counters = {"draft_tokens": 80, "draft_accepted": 76, "decode_steps": 20}
    return {"prompt_tokens": 40, "prompt_tps": 500.0, "ttft_s": 0.08,
            "completion_tokens": 96, "decode_tps": 400.0, "stop_reason": "length",
            "draft": "ngram", **counters, "ngram_replay": counters}


def test_the_prediction_follows_the_drafter_the_plan_picks(tiny_llama: Path) -> None:
    first = simulate(tiny_llama, machine(), W, threads=2, draft="auto")
    assert first.plan.draft is not None and first.plan.draft.drafter is None
    assert first.planned_draft is None
    assert first.expected_decode_tps == first.decode_tps
    assert first.decode_assumes.startswith("plain decoding")
    assert first.to_json()["expected_decode_tps"] == pytest.approx(first.decode_tps, rel=1e-3)
    rec = telemetry.recorder()
    for _ in range(3):
        rec.generation(tiny_llama, source="run", settings={"n_threads": 2},
                       metrics=_copying_run())
    assert rec.flush()
    drafted = simulate(tiny_llama, machine(), W, threads=2, draft="auto")
    d = drafted.planned_draft
    assert drafted.plan.draft is not None and drafted.plan.draft.drafter == "ngram"
    assert d is not None and d.drafter == "ngram" and d.basis.startswith("learned from 3")
    assert d.speedup == pytest.approx(drafted.plan.draft.speedup, rel=1e-6)
    assert drafted.expected_decode_tps == pytest.approx(drafted.decode_tps * d.speedup)
    assert drafted.expected_decode_tps > 2 * drafted.decode_tps
    assert drafted.decode_tps == pytest.approx(first.decode_tps)  # plain decode: as before
    data = drafted.to_json()
    assert data["decode_assumes"].startswith("ngram drafts, x")
    assert data["expected_decode_tps"] == pytest.approx(drafted.expected_decode_tps, rel=1e-3)
    # a request that decodes plainly is predicted plainly, history or not
    plain = simulate(tiny_llama, machine(), W, threads=2, draft="none")
    assert plain.planned_draft is None and plain.expected_decode_tps == plain.decode_tps


def test_the_engines_own_work_is_reported(tiny_llama: Path) -> None:
    pred = simulate(tiny_llama, machine(), W, threads=2)
    cal = pred.calibration
    assert pred.engine_s == pytest.approx(cal.engine_token_s + cal.logits_s_per_vocab * 287,
                                          rel=0.05)
    assert pred.to_json()["engine_seconds_per_token"] == pytest.approx(pred.engine_s, abs=1e-6)
    assert pred.engine_s < 1.0 / pred.decode_tps


def test_the_report_says_what_decode_assumes(tiny_llama: Path, quiet_cpus: None) -> None:
    from typer.testing import CliRunner

    from inferenceos.cli.main import app

    res = CliRunner().invoke(app, ["simulate", str(tiny_llama), "--prompt-tokens", "64",
                                   "--output-tokens", "64"], env={"COLUMNS": "250"})
    assert res.exit_code == 0, res.output
    assert "decode, as run will" in res.stdout
    assert "plain decoding (the plan picks no drafter)" in res.stdout
    assert "a token of our own work" in res.stdout
