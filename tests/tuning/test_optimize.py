"""`inferenceos optimize` on a tiny model: real trials on llama.cpp, recorded in the real
telemetry store, the best read back by the planner's `best_settings`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli_helpers import run_cli, run_main
from inferenceos import telemetry
from inferenceos.plan.tuned import best_settings
from inferenceos.tuning.space import Knobs, llama_defaults
from inferenceos.tuning.trials import DECODE_CHUNK, TrialRunner

KNOBS = {"n_threads", "n_threads_batch", "n_batch", "n_ubatch", "flash_attn", "type_k",
         "type_v", "n_gpu_layers"}


@pytest.fixture(scope="module")
def optimized(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple:
    """One `optimize --json` run with a small budget, as a user runs it, in its own
    INFERENCEOS_HOME: (exit code, stdout, stderr, home)."""
    home = tmp_path_factory.mktemp("optimize-home")
    proc = run_cli("optimize", str(tiny_llama), "--budget", "30", "--json",
                   INFERENCEOS_HOME=str(home))
    return proc.returncode, proc.stdout, proc.stderr, home


def test_json_shape(optimized: tuple) -> None:
    code, out, err, *_ = optimized
    assert code == 0, err
    data = json.loads(out)
    assert {"baseline", "best", "best_measured", "trials"} <= set(data)
    assert set(data["best"]) == KNOBS
    assert set(data["baseline"]["settings"]) == KNOBS
    assert data["baseline"]["settings"] == llama_defaults(has_gpu=False).to_json()
    assert data["baseline"]["prefill_tps"] > 0 and data["baseline"]["decode_tps"] > 0
    assert data["best_measured"]["prefill_tps"] > 0 and data["best_measured"]["decode_tps"] > 0
    assert data["trials"][0]["phase"] == "baseline"
    assert any(t["phase"] == "search" for t in data["trials"])
    for t in data["trials"]:
        assert set(t["settings"]) == KNOBS
        assert t["error"] or t["prefill_tps"] > 0


def test_every_trial_is_recorded_and_the_best_stored(optimized: tuple, tiny_llama: Path) -> None:
    code, out, _err, home = optimized
    assert code == 0
    data = json.loads(out)
    with pytest.MonkeyPatch.context() as m:
        m.setenv("INFERENCEOS_HOME", str(home))
        rows = telemetry.trials(tiny_llama)
        assert len(rows) == len(data["trials"])
        assert {r.status for r in rows} <= {"ok", "stopped", "failed"}
        assert len({r.search for r in rows}) == 1
        stored = best_settings(tiny_llama)
    assert stored is not None
    assert stored["settings"] == data["best"]
    assert stored["measured"]["ratios"] == data["ratios"]


def test_budget_bounds_the_search(optimized: tuple) -> None:
    data = json.loads(optimized[1])
    # the search stops starting trials once the budget would be exceeded; one trial of
    # a tiny model takes well under a second even on a busy machine
    assert data["elapsed_s"] < data["budget_s"] + 15


def test_no_best_before_optimize(tiny_llama: Path) -> None:
    assert best_settings(tiny_llama) is None


def test_too_small_a_budget_is_a_usage_error(
    tiny_llama: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, _out, err = run_main(["optimize", str(tiny_llama), "--budget", "1"], capsys, monkeypatch)
    assert code == 2 and "--budget" in err and len(err.strip().splitlines()) == 1


def test_threads_reuse_the_context_and_hopeless_trials_stop(tiny_llama: Path) -> None:
    with TrialRunner(tiny_llama, prompt_len=64, decode_len=3 * DECODE_CHUNK) as runner:
        first = runner.run(Knobs(n_threads=2, n_threads_batch=2), "search")
        again = runner.run(Knobs(n_threads=1, n_threads_batch=1), "search")
        other = runner.run(Knobs(n_threads=1, n_threads_batch=1, n_ubatch=128), "search")
        stopped = runner.run(Knobs(n_threads=1, n_threads_batch=1), "search",
                             stop=lambda rate: True)
        skipped = runner.run(Knobs(n_threads=1, n_threads_batch=1), "search",
                             skip_decode=lambda rate: True)
    assert first.load_s > 0 and again.load_s == 0 and other.load_s > 0
    assert first.decode_tokens == 3 * DECODE_CHUNK and first.prompt_tokens == 64
    assert stopped.stopped_early and stopped.decode_tokens == DECODE_CHUNK
    assert skipped.stopped_early and skipped.decode_tokens == 0 and skipped.prefill_tps > 0


def test_a_refused_configuration_is_a_failed_trial(tiny_llama: Path) -> None:
    # the tiny model's 16-wide heads cannot hold q8_0 (32-value blocks): llama.cpp refuses
    with TrialRunner(tiny_llama, prompt_len=32, decode_len=4) as runner:
        res = runner.run(Knobs(n_threads=1, n_threads_batch=1, flash_attn=1, type_k="q8_0",
                               type_v="q8_0"), "search")
    assert res.error and res.prefill_tps == 0 and not res.ok


def test_apply_tuned_reads_the_stored_best(tiny_llama: Path) -> None:
    from inferenceos.plan.llama_params import LlamaParams
    from inferenceos.plan.tuned import apply_tuned

    plan = LlamaParams(n_ctx=512, n_batch=512, n_ubatch=512, n_threads=2, n_threads_batch=2)
    assert apply_tuned(tiny_llama, plan) == (plan, "")  # nothing stored yet
    best = Knobs(n_threads=1, n_threads_batch=2, n_batch=512, n_ubatch=256, flash_attn=1)
    telemetry.recorder().best(tiny_llama, settings=best.to_json(),
                              measured={"ratios": {"prefill": 1.1, "decode": 1.2}})
    assert telemetry.recorder().flush()
    params, phrase = apply_tuned(tiny_llama, plan)
    assert (params.n_threads, params.n_threads_batch, params.n_ubatch) == (1, 2, 256)
    assert phrase.startswith("tuned by optimize") and "decode 1.20x" in phrase
    pinned, _ = apply_tuned(tiny_llama, plan, pinned={"n_threads"})
    assert pinned.n_threads == 2


def test_a_budget_for_the_baseline_only_stores_nothing_and_says_so(
    tiny_llama: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`optimize --budget 5` where one trial takes 1.5 s (Gemma here): only the baseline
    ran. It showed an empty trials table and said "Stored as this machine's best
    settings"; now it stores nothing and says what budget would do."""
    import time

    from inferenceos.tuning import search
    from inferenceos.tuning.trials import TrialResult

    class Slow:
        def __init__(self, *args: object) -> None:
            pass

        def run(self, knobs: Knobs, phase: str, **kw: object) -> TrialResult:
            time.sleep(1.5)
            return TrialResult(knobs, phase, 500.0, 50.0, 512, 64, elapsed_s=1.5)

        def close(self) -> None:
            pass

    monkeypatch.setattr(search, "TrialRunner", Slow)
    code, out, err = run_main(["optimize", str(tiny_llama), "--budget", "5"], capsys,
                              monkeypatch)
    assert code == 1, err
    assert "Stored" not in err + out and "search trials" not in out
    assert "baseline" in out and "500.0 t/s" in out
    assert "nothing was compared and nothing stored" in err and "--budget 30" in err
    assert len(err.strip().splitlines()) == 1
    telemetry.recorder().flush()
    assert best_settings(tiny_llama) is None  # run and serve keep their own plans
    assert len(telemetry.trials(tiny_llama)) == 1  # the trial itself is recorded
