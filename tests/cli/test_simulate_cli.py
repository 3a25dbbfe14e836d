"""`inferenceos simulate` and `inferenceos placement`: JSON contract, hypothetical
machines, models larger than memory, metadata-only speed."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from inferenceos.cli.main import app
from inferenceos.plan.devices import Overrides, apply_overrides, load_profile_file, parse_size
from inferenceos.plan.simulate import Workload, simulate
from plan_factories import GiB, machine, make_facts, moe_facts, write_sparse_gguf

runner = CliRunner()
KEYS = {
    "feasible",
    "prefill_tps",
    "decode_tps",
    "ttft_s",
    "peak_memory_bytes",
    "bottleneck",
    "plan",
}


@pytest.fixture(scope="module")
def big_moe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ~25 GiB Mixtral-shaped file whose tensor data is a sparse hole."""
    return write_sparse_gguf(tmp_path_factory.mktemp("sparse") / "big-moe.gguf", moe_facts())


def _json(*args: str) -> dict:  # type: ignore[type-arg]
    res = runner.invoke(app, ["simulate", *args, "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_json_has_the_contract_keys(tiny_llama: Path) -> None:
    data = _json(str(tiny_llama), "--ram", "8GiB", "--ram-bandwidth", "20",
                 "--prompt-tokens", "256")
    assert data.keys() >= KEYS
    assert data["feasible"] and data["decode_tps"] > 0 and data["prefill_tps"] > 0
    assert set(data["peak_memory_bytes"]) == {"CPU"}


def test_small_gpu_moe_puts_experts_on_cpu_and_says_so(big_moe: Path) -> None:
    data = _json(str(big_moe), "--gpu-memory", "4GiB", "--ram", "32GiB", "--ctx", "4096")
    layers = data["plan"]["placement"]["layers"]
    assert all(layer["dense"] == "GPU0" for layer in layers)
    assert any(layer["experts"] == "CPU" for layer in layers)
    assert any("experts" in c["what"] for c in data["plan"]["changes"])
    assert data["plan"]["llama_params"]["tensor_buft_overrides"]


def test_model_bigger_than_memory_is_disk_bound(big_moe: Path) -> None:
    data = _json(str(big_moe), "--ram", "8GiB")
    assert data["feasible"] and data["disk_bound"]
    assert "disk (mmap)" in data["peak_memory_bytes"]
    assert "disk" in data["plan"]["reason"]
    assert data["bottleneck"] == "disk read (mmap)"


def test_refusal_is_one_line(big_moe: Path) -> None:
    res = runner.invoke(app, ["simulate", str(big_moe), "--ram", "16MiB"])
    assert res.exit_code != 0
    assert isinstance(res.exception, Exception) and "cannot run here" in str(res.exception)


def test_reads_metadata_only_quickly(big_moe: Path) -> None:
    m = machine(ram=64 * GiB)
    simulate(big_moe, m, Workload())  # warm imports
    t0 = time.perf_counter()
    pred = simulate(big_moe, m, Workload())
    assert time.perf_counter() - t0 < 0.5
    assert big_moe.stat().st_size > 20 * GiB and pred.feasible


def test_report_renders(tiny_moe: Path) -> None:
    res = runner.invoke(app, ["simulate", str(tiny_moe), "--gpu-memory", "1GiB", "--ram", "4GiB",
                              "--prompt-tokens", "200"])
    assert res.exit_code == 0, res.output
    for section in ("Hardware", "Feasibility", "Peak memory", "Performance", "Bottleneck"):
        assert section in res.stdout


def test_placement_picture(big_moe: Path) -> None:
    res = runner.invoke(
        app, ["placement", str(big_moe), "--gpu-memory", "4GiB", "--ram", "32GiB", "--ctx", "4096"]
    )
    assert res.exit_code == 0, res.output
    assert "GPU0" in res.stdout and "routed experts" in res.stdout and "CPU" in res.stdout


def test_profile_file_and_overrides(tmp_path: Path) -> None:
    profile = {
        "cpu": {"usable_threads": 4, "isa": ["avx2"]},
        "memory": {"total_bytes": 16 * GiB, "usable_bytes": 12 * GiB},
        "bandwidth": {"ram_read_gbps": 40.0, "disk_read_gbps": 3.0},
        "llama_devices": [
            {
                "name": "CUDA0",
                "type": "gpu",
                "memory_total_bytes": 8 * GiB,
                "memory_free_bytes": 7 * GiB,
            }
        ],
    }
    path = tmp_path / "hw.json"
    path.write_text(json.dumps(profile))
    m = load_profile_file(path)
    assert m.cpu.memory_bytes == 12 * GiB and m.cpu.bandwidth_gbps == 40.0
    assert m.accelerators[0].name == "CUDA0" and m.accelerators[0].memory_bytes == 7 * GiB
    m2 = apply_overrides(m, Overrides(ram=parse_size("32GiB"), gpu_memory=(parse_size("4GB"),)))
    assert m2.cpu.memory_bytes == 32 * GiB and m2.accelerators[0].memory_bytes == 4_000_000_000


def test_dense_model_all_on_a_big_gpu() -> None:
    from inferenceos.plan.memory import ContextSettings
    from inferenceos.plan.preflight import make_plan

    plan = make_plan(make_facts(), machine(gpus=(24 * GiB,)), ContextSettings(n_ctx=8192))
    assert plan.n_gpu_layers == 33 and plan.placement.output_device == "GPU0"
    assert plan.llama_params()["tensor_split"] == [1.0]


def test_prompt_longer_than_the_context_is_refused(tiny_llama: Path) -> None:
    """The tiny model was trained on 512 tokens: a 100,000-token prompt cannot 'fit'."""
    res = runner.invoke(app, ["simulate", str(tiny_llama), "--prompt-tokens", "100000"])
    assert res.exit_code != 0
    assert "100000 tokens does not fit a context of 512" in str(res.exception or res.output)


def test_context_is_capped_at_the_training_context(tiny_llama: Path) -> None:
    from inferenceos.plan.entry import LoadRequest, plan_load
    from inferenceos.plan.model_facts import load_model_facts

    plan = plan_load(load_model_facts(tiny_llama), machine(ram=8 * GiB),
                     LoadRequest(n_ctx=10_000_000))
    assert plan.ctx.n_ctx == 512
    assert any("training context" in c.why for c in plan.changes)
    scaled = plan_load(load_model_facts(tiny_llama), machine(ram=8 * GiB),
                       LoadRequest(n_ctx=4096, rope_scaling=True))
    assert scaled.ctx.n_ctx == 4096


def test_uncalibrated_advice_names_a_command_a_user_has(tiny_llama: Path) -> None:
    """A pip-installed user has no `benchmarks/` folder: the advice is a command."""
    res = runner.invoke(app, ["simulate", str(tiny_llama), "--prompt-tokens", "64"])
    assert res.exit_code == 0, res.output
    (line,) = [x for x in res.stdout.splitlines() if x.startswith("calibration:")]
    assert "uncalibrated" in line and "benchmarks/" not in line, line
    assert "`inferenceos hardware --refresh`" in line, line
