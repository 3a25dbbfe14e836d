"""`simulate`: refusals as JSON, basis/confidence, and what each policy changes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from inferenceos.cli.main import app
from inferenceos.errors import UsageError
from inferenceos.plan.policy import RecordedWorkload, choose
from plan_factories import make_facts, write_sparse_gguf

runner = CliRunner()


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An 8B-shaped Q4_0 header over a sparse hole (~4 GiB that costs no disk)."""
    return write_sparse_gguf(tmp_path_factory.mktemp("sparse") / "m.gguf", make_facts())


def test_a_model_that_cannot_fit_prints_feasible_false_and_fails(model: Path) -> None:
    res = runner.invoke(app, ["simulate", str(model), "--ram", "10MiB", "--json"])
    assert res.exit_code != 0
    data = json.loads(res.stdout)
    assert data["feasible"] is False and "cannot run here" in data["reason"]
    assert data["machine"]["devices"][0]["memory_bytes"] == 10 * 1024 * 1024


def test_json_says_basis_and_confidence(model: Path) -> None:
    res = runner.invoke(app, ["simulate", str(model), "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["basis"] == "modelled" and 0 <= data["confidence"] <= 1
    assert data["policy"]["name"] == "balanced"
    text = runner.invoke(app, ["simulate", str(model)]).stdout
    assert "basis: modelled" in text


def _sim(model: Path, policy: str) -> dict:  # type: ignore[type-arg]
    res = runner.invoke(
        app, ["simulate", str(model), "--json", "--policy", policy, "--ram", "64GiB"]
    )
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_policies_change_what_they_say(model: Path) -> None:
    bal, lat, cap = (_sim(model, p) for p in ("balanced", "latency", "capacity"))
    ctx = {k: d["plan"]["context"] for k, d in (("b", bal), ("l", lat), ("c", cap))}
    assert ctx["c"]["n_seq"] == 4 and ctx["c"]["type_k"] == "q8_0"
    assert ctx["c"]["n_ctx"] > ctx["b"]["n_ctx"]  # the training context, 4 slots
    assert ctx["c"]["n_ubatch"] <= 256 and ctx["l"]["n_ubatch"] >= ctx["b"]["n_ubatch"]
    assert ctx["l"]["n_seq"] == 1 and ctx["l"]["type_k"] == "f16"
    assert cap["policy"]["changes"] and lat["policy"]["resolved"] == "latency"
    ada = _sim(model, "adaptive")  # no history: balanced, and says why
    assert ada["policy"]["resolved"] == "balanced" and "no recorded" in ada["policy"]["why"]
    text = runner.invoke(app, ["simulate", str(model), "--policy", "capacity"]).stdout
    assert "policy" in text and "4 sequence slots" in text


def test_throughput_decodes_four_slots_at_the_balanced_context(model: Path) -> None:
    bal, thr, cap = (_sim(model, p) for p in ("balanced", "throughput", "capacity"))
    b, t, c = (d["plan"]["context"] for d in (bal, thr, cap))
    assert t["n_seq"] == 4 and b["n_seq"] == 1
    # the balanced context for each slot, not the training context capacity asks for
    assert t["n_ctx"] == 4 * b["n_ctx"] < c["n_ctx"]
    assert t["type_k"] == b["type_k"] == "f16"  # 64 GiB: nothing forces a smaller cache
    assert t["n_ubatch"] >= b["n_ubatch"]
    assert thr["policy"]["resolved"] == "throughput"
    assert "4 sequence slots" in thr["policy"]["changes"]


def test_adaptive_follows_the_recorded_workload() -> None:
    f = make_facts()
    busy = RecordedWorkload(runs=20, concurrency_p90=4, prompt_p50=300)
    alone = RecordedWorkload(runs=20, concurrency_p90=1, prompt_p50=300)
    long_prompts = RecordedWorkload(runs=20, concurrency_p90=4, prompt_p50=3000)
    assert choose("adaptive", f, busy).resolved == "throughput"
    assert choose("adaptive", f, long_prompts).resolved == "capacity"
    assert choose("adaptive", f, alone).resolved == "latency"
    assert choose("adaptive", f, RecordedWorkload(runs=1)).resolved == "balanced"
    with pytest.raises(UsageError):
        choose("fastest", f)


def test_plan_here_applies_policy_load_and_calibration() -> None:
    from inferenceos.hardware.cpu_load import CpuLoad
    from inferenceos.plan.entry import LoadRequest
    from inferenceos.plan.here import plan_here
    from plan_factories import machine

    busy = CpuLoad(usable_cpus=8, busy_others=4.0, window_s=0.1)
    got = plan_here(make_facts(), machine(threads=8), LoadRequest(cpu_load=busy), "capacity")
    assert got.plan.threads == 4 and got.plan.ctx.n_seq == 4
    assert got.policy.resolved == "capacity" and got.calibration.basis == "modelled"
