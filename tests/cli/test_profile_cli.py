"""`inferenceos profile` on a tiny model: every phase is timed, the HTML report is
self-contained and shows them, and the run is recorded."""

from __future__ import annotations

import itertools
import json
import math
import re
from pathlib import Path

import pytest

from cli_helpers import run_cli, run_main
from inferenceos import telemetry
from inferenceos.tuning.html_report import render_html
from inferenceos.tuning.profiler import Profile, Span

PROMPT = "the quick brown fox jumps over the lazy dog. " * 2  # ~90 byte tokens


@pytest.fixture(scope="module")
def profiled(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple:
    home = tmp_path_factory.mktemp("profile-home")
    report = home / "run.html"
    proc = run_cli("profile", str(tiny_llama), "--prompt", PROMPT, "-n", "12", "--batch", "32",
                   "--seed", "1", "-o", str(report), "--json",
                   INFERENCEOS_HOME=str(home))
    return proc.returncode, proc.stdout, proc.stderr, report, home


def test_json_breaks_the_run_into_phases(profiled: tuple) -> None:
    code, out, err, report, _ = profiled
    assert code == 0, err
    data = json.loads(out)
    phases = {p["phase"]: p for p in data["phases"]}
    assert {"load", "tokenize", "prefill", "decode", "sampling", "detokenize"} <= set(phases)
    assert data["prompt_tokens"] > 64
    # `run`'s path: 32-token chunks, then the prompt's last token alone (step_plan.py)
    assert phases["prefill"]["steps"] == math.ceil((data["prompt_tokens"] - 1) / 32) + 1
    assert phases["prefill"]["tokens"] == data["prompt_tokens"]
    n = data["completion_tokens"]
    assert 1 <= n <= 12
    assert phases["sampling"]["steps"] >= n and phases["decode"]["steps"] == n - 1
    assert sum(p["share"] for p in data["phases"]) == pytest.approx(1.0, abs=0.01)
    spans = data["spans"]
    assert all(a["start_s"] <= b["start_s"] for a, b in itertools.pairwise(spans))
    assert data["prefill_tps"] > 0 and data["decode_tps"] > 0
    assert data["report"] == str(report)


def test_html_report_is_self_contained_and_shows_the_phases(profiled: tuple) -> None:
    report: Path = profiled[3]
    html = report.read_text()
    assert html.startswith("<!DOCTYPE html>")
    for phase in ("load", "tokenize", "prefill", "decode", "sampling"):
        assert f'data-phase="{phase}"' in html  # a timeline rectangle per phase
    data = json.loads(profiled[1])
    assert html.count('data-phase="prefill"') == math.ceil((data["prompt_tokens"] - 1) / 32) + 1
    assert html.count('data-phase="decode"') == data["completion_tokens"] - 1
    # nothing fetched from the network: no scripts, stylesheets, fonts or images by URL
    assert not re.search(r"<(script|link|img|iframe)\b", html)
    urls = set(re.findall(r"https?://[^\s\"'<>)]+", html))
    assert urls <= {"http://www.w3.org/2000/svg"}


def test_the_run_is_recorded(profiled: tuple, tiny_llama: Path) -> None:
    with pytest.MonkeyPatch.context() as m:
        m.setenv("INFERENCEOS_HOME", str(profiled[4]))
        rows = telemetry.generations(tiny_llama, source="profile")
    assert len(rows) == 1 and rows[0].prompt_tokens == json.loads(profiled[1])["prompt_tokens"]


def test_text_from_the_model_is_escaped() -> None:
    spans = [Span("load", "model", 0.0, 0.01), Span("decode", "<i>", 0.01, 0.002, 1)]
    p = Profile("/m/<b>x</b>.gguf", {"n_ctx": 64}, 3, 1, "<script>alert(1)</script>", spans)
    html = render_html(p)
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert "<b>x</b>" not in html and "<i>" not in html


def test_bad_output_and_too_long_prompt_are_one_line_errors(
    tiny_llama: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    code, _, err = run_main(["profile", str(tiny_llama), "-o", str(tmp_path / "r.pdf")],
                            capsys, monkeypatch)
    assert code == 2 and ".html" in err
    code, _, err = run_main(["profile", str(tiny_llama), "--ctx", "64", "--prompt", "x" * 600,
                             "-o", str(tmp_path / "r.html")], capsys, monkeypatch)
    assert code != 0 and len(err.strip().splitlines()) >= 1
    assert "error:" in err and "Traceback" not in err
    assert not (tmp_path / "r.html").exists()


@pytest.mark.parametrize("command", ["optimize", "benchmark", "profile"])
def test_a_missing_or_garbage_model_is_a_one_line_error(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"not a model at all")
    monkeypatch.chdir(tmp_path)
    for model, needle in ((tmp_path / "missing.gguf", "not found"), (garbage, "not a GGUF")):
        code, out, err = run_main([command, str(model)], capsys, monkeypatch)
        assert code == 1 and needle in err and len(err.strip().splitlines()) == 1, err
        assert out == ""
    assert not (tmp_path / "profile.html").exists()
