"""Resident against streamed weights, page-ins per token and the expert hit rate:
measured by the engine (engine/weights/residency.py), shown by /metrics and `ps`.

- under a real memory cgroup (tests/memcg.py) that makes the tiny Q4 model's plan
  disk-bound, the engine reports streamed bytes, less of the file in memory than the
  file, and page-ins and disk reads per decoded token;
- a served model that fits shows the weight gauges after a generation, with nothing
  streamed, and `ps` adds no line for it; a disk-bound one gets its line;
- on a tiny MoE the streamer counts the router's picks (`ffn_moe_topk`) and the hit
  ratio follows which experts' pages are in memory.
"""

from __future__ import annotations

import json
import platform
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from memcg import MemoryCgroup, drop_cache, writable_cgroup
from tiny_q4 import write_q4_model

MIB = 1 << 20
PROBE = str(Path(__file__).parents[2] / "weight_residency_probe.py")
P = "inferenceos:"


@pytest.fixture(scope="module")
def q4_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_q4_model(tmp_path_factory.mktemp("q4w") / "tiny-q4.gguf")


def probe(model: Path, limit: int, *args: str) -> dict[str, Any]:
    """tests/weight_residency_probe.py on `model` in a fresh cgroup of `limit`, cold."""
    drop_cache(model)
    with MemoryCgroup(limit) as cg:
        run = cg.run([sys.executable, PROBE, str(model), *args], timeout=300)
    assert not run.killed and run.returncode == 0, run.stderr[-2000:]
    out: dict[str, Any] = json.loads(run.stdout.splitlines()[-1])
    return out


@pytest.mark.skipif(writable_cgroup() is None, reason="no writable memory cgroup here")
@pytest.mark.skipif(platform.machine() != "x86_64", reason="the limit is sized as on x86")
def test_a_disk_bound_model_reports_what_it_streams_and_what_it_pages_in(
    q4_model: Path,
) -> None:
    size = q4_model.stat().st_size
    # as test_cgroup_limits.py's resident-set test: 1.2x the file over the probe's own
    # start-up charge is disk-bound (~28 MiB anonymous + 53 MiB of file) with layers
    # resident
    out = probe(q4_model, 4096 * MIB, "--cap-above-start", str(int(1.2 * size)),
                "--tokens", "8")
    assert out["disk_bound"] and out["streamed"], out
    w = out["weights"]
    assert w["streamed_bytes"] > 0 and w["resident_bytes"] > 0, w
    assert w["resident_bytes"] + w["streamed_bytes"] <= size
    assert 0 < w["mapped_resident_bytes"] < size, w
    assert w["tokens"] == 8
    assert w["page_ins_per_token"] > 0 and w["read_bytes_per_token"] > 0, w
    assert w["page_ins"] >= w["page_ins_per_token"] and w["read_bytes"] > 0


def _served_planner(disk_bound: bool) -> Any:
    """The manager's planner with this machine's RAM cut so the tiny Q4 model keeps
    half its weights on disk (as test_larger_than_memory.py plans it), or as it is."""
    from inferenceos.plan.devices import Overrides, apply_overrides
    from inferenceos.plan.here import plan_here
    from inferenceos.plan.model_facts import load_model_facts

    def plan(model: Any, req: Any, machine: Any) -> Any:
        facts = load_model_facts(model.path)
        if not disk_bound:
            return plan_here(facts, machine, req, sense_load=False, tuned=False).plan
        roomy = apply_overrides(machine, Overrides(ram=4096 * MIB))
        fits = plan_here(facts, roomy, req, sense_load=False, tuned=False).plan.memory
        ram = fits.anonymous - fits.repack + fits.weights["CPU"] // 2
        tight = apply_overrides(machine, Overrides(ram=ram))
        return plan_here(facts, tight, req, sense_load=False, tuned=False).plan
    return plan


def _generate_and_scrape(url: str) -> tuple[str, dict[str, dict[str, float]]]:
    from inferenceos.cli.ps_cmd import weight_figures

    r = httpx.post(url + "/v1/completions", timeout=120,
                   json={"model": "q4", "prompt": "abc", "max_tokens": 4})
    assert r.status_code == 200, r.text
    text = httpx.get(url + "/metrics", timeout=30).text
    return text, weight_figures(text)


@pytest.mark.parametrize("disk_bound", [False, True], ids=["fits", "disk-bound"])
def test_metrics_and_ps_show_the_weights_and_streaming_only_when_it_streams(
    q4_model: Path, tmp_path: Path, disk_bound: bool
) -> None:
    from inferenceos.cli.ps_cmd import streaming_line
    from server_harness import serving

    kw = {"manager_kw": {"planner": _served_planner(disk_bound)}}
    with serving({"q4": q4_model}, tmp_path, **kw) as h:
        text, figures = _generate_and_scrape(h.url)
    assert P + "weights_resident_bytes{" in text and P + "weight_page_ins_total{" in text
    (name, w), = figures.items()
    assert name.startswith("q4")
    assert w["resident_bytes"] > 0 and w["mapped_resident_bytes"] > 0
    assert "page_ins_per_token" in w and "read_bytes_per_token" in w
    assert "expert_hit_ratio" not in w  # a dense model: no such figure
    line = streaming_line(name, w)
    if disk_bound:
        assert w["streamed_bytes"] > 0 and line is not None, w
        assert "streams" in line and "per token" in line, line
    else:
        assert w["streamed_bytes"] == 0 and line is None, w


def test_ps_prints_the_streaming_line_under_the_table_only_for_a_streamed_model() -> None:
    from inferenceos.cli.ps_cmd import streaming_line, weight_figures

    text = "\n".join([
        "# TYPE inferenceos:weights_streamed_bytes gauge",
        'inferenceos:weights_streamed_bytes{model_name="big"} 41943040.0',
        'inferenceos:weights_streamed_bytes{model_name="small"} 0.0',
        "# TYPE inferenceos:weights_resident_bytes gauge",
        'inferenceos:weights_resident_bytes{model_name="big"} 10485760.0',
        'inferenceos:weights_resident_bytes{model_name="small"} 10485760.0',
        "# TYPE inferenceos:weight_page_ins_per_token gauge",
        'inferenceos:weight_page_ins_per_token{model_name="big"} 41.0',
        "# TYPE inferenceos:expert_hit_ratio gauge",
        'inferenceos:expert_hit_ratio{model_name="big"} 0.875', ""])
    figures = weight_figures(text)
    assert streaming_line("small", figures["small"]) is None
    line = streaming_line("big", figures["big"])
    assert line is not None and "40.0 MiB" in line and "41 page-ins" in line, line
    assert "88 % hit" in line or "88% hit" in line, line
    assert weight_figures("not prometheus {") == {}


def test_the_streamer_counts_the_routers_picks_and_the_hit_ratio_follows_residency(
    tiny_moe: Path,
) -> None:
    """Streamed (a resident budget of 1 byte: every layer streams), the tiny MoE's
    router picks 2 of 4 experts per token in each layer: the streamer reads them from
    `ffn_moe_topk-<layer>`. All in the page cache, every pick hits; with an expert's
    pages counted out, the picks that fell on it miss."""
    from inferenceos.engine.sampling import SamplingParams
    from inferenceos.engine.scheduler import generate_one
    from inferenceos.engine.session import LoadedModel
    from inferenceos.engine.weights.residency import WeightResidency
    from inferenceos.plan.llama_params import LlamaParams

    settings = replace(LlamaParams(), stream_resident_bytes=1, n_ctx=256)
    with LoadedModel(tiny_moe, settings) as m:
        s = m._streamer
        assert s is not None and s.n_expert == 4
        w = WeightResidency.of(m, s)
        prompt = m.tokenize("hello world")
        sampling = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
        n = sum(ev.token >= 0 for ev in generate_one(m, prompt, sampling))
        w.count(n)
        picks = {layer: c.copy() for layer, c in s._picks.items()}
        # layer 0 routes every token; each token picks 2 distinct experts
        assert set(picks) == {0, 1} and int(picks[0].sum()) == 2 * (len(prompt) + n - 1)
        report = w.report()
        assert report["expert_hit_ratio"] == 1.0, report
        assert report["streamed_bytes"] > 0 and report["tokens"] == n
        # expert 0 of every layer out of memory, as mincore would show it: the pages
        # wholly inside its slices (its first and last pages share experts 1's and the
        # tensor before's, and stay), so its picks count at most 2/9 hit
        s._picks = picks
        for r, vec in w._core.regions:
            for (_, e), ranges in w._experts.items():
                for lo, hi in ranges if e == 0 else ():
                    first, end = -(-(lo - r.offset) // 4096), (hi - r.offset) // 4096
                    vec[max(first, 0):max(end, 0)] = False
        w._core.set(w._core.regions)
        ratio = w._hit_ratio()
        on_0 = sum(int(c[0]) for c in picks.values())
        total = sum(int(c.sum()) for c in picks.values())
        assert ratio is not None and on_0 > 0
        assert 1 - on_0 / total <= ratio <= 1 - 0.5 * on_0 / total, (ratio, on_0, total)


def test_a_dense_plain_load_reports_everything_resident_and_no_expert_figure(
    tiny_llama: Path,
) -> None:
    from inferenceos.engine.session import LoadedModel
    from inferenceos.engine.weights.residency import WeightResidency
    from inferenceos.plan.llama_params import LlamaParams

    with LoadedModel(tiny_llama, replace(LlamaParams(), n_ctx=256)) as m:
        assert m._streamer is None
        report = WeightResidency.of(m, None).report()
    assert report["streamed_bytes"] == 0 and report["resident_bytes"] > 0
    assert report["mapped_resident_bytes"] > 0 and "expert_hit_ratio" not in report
    assert "page_ins_per_token" not in report  # nothing decoded yet: no window


def test_monitor_adds_a_line_under_the_models_only_for_one_that_streams() -> None:
    from rich.console import Console

    from inferenceos.cli.monitor_cmd import Snapshot, render

    models = [{"name": "big", "state": "hot"}, {"name": "small", "state": "hot"}]
    snap = Snapshot({}, {"models": models}, {}, 0.0)
    snap.weights = {"big": {"streamed_bytes": 40 * MIB, "resident_bytes": 10 * MIB,
                            "page_ins_per_token": 3.0, "read_bytes_per_token": 2 * MIB},
                    "small": {"streamed_bytes": 0, "resident_bytes": 10 * MIB}}
    console = Console(width=200, record=True)
    console.print(render(snap, "http://x"))
    text = console.export_text()
    assert "big streams 40.0 MiB of weights from disk" in text, text
    assert "per token 3 page-ins, 2.0 MiB read" in text
    assert "small streams" not in text


def test_the_share_in_core_counts_every_page_a_range_touches() -> None:
    import numpy as np

    from inferenceos.engine.weights.residency import Region, _Core

    page = 4096
    core = _Core(Path("/nonexistent"))
    # a region of 4 pages holding file bytes from 2 pages on: pages 2..5 of the file
    core.set([(Region(0, 4 * page, 2 * page), np.array([True, False, True, True]))])
    assert core.resident_bytes() == 3 * page
    assert core.fraction([(2 * page, 4 * page)]) == 0.5  # file pages 2, 3
    assert core.fraction([(2 * page + 100, 5 * page + 1)]) == 0.75  # pages 2..5
    assert core.fraction([(0, 2 * page)]) == 0.0  # not mapped: never in core
    assert core.fraction([(0, 3 * page)]) == pytest.approx(1 / 3)  # 0, 1 unmapped
