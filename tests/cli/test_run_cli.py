"""`inferenceos run` as a user runs it: a subprocess on real llama.cpp."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli_helpers import cli_env, run_cli

METRIC_KEYS = {"load_s", "prompt_tokens", "prompt_tps", "ttft_s", "completion_tokens", "decode_tps"}


def test_json_output(tiny_llama: Path) -> None:
    r = run_cli(
        "run", str(tiny_llama), "--prompt", "abc", "--json", "--temperature", "0", "-n", "8"
    )
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert set(data["metrics"]) >= METRIC_KEYS
    assert data["metrics"]["completion_tokens"] == 8
    assert isinstance(data["text"], str)


def test_streams_text_then_footer(tiny_llama: Path) -> None:
    r = run_cli("run", str(tiny_llama), "-p", "abc", "--temperature", "0", "-n", "6")
    assert r.returncode == 0, r.stderr
    assert "generated 6 tok" in r.stderr and "TTFT" in r.stderr and "t/s" in r.stderr
    j = run_cli("run", str(tiny_llama), "-p", "abc", "--temperature", "0", "-n", "6", "--json")
    assert r.stdout.rstrip("\n") == json.loads(j.stdout)["text"]


def test_prompt_from_stdin_equals_prompt_flag(tiny_llama: Path) -> None:
    args = ("run", str(tiny_llama), "--json", "--temperature", "0", "-n", "6")
    piped = run_cli(*args, input="abc")
    flagged = run_cli(*args, "--prompt", "abc")
    assert json.loads(piped.stdout)["text"] == json.loads(flagged.stdout)["text"]


@pytest.mark.parametrize(("flag", "shown"), [("on", "enabled"), ("off", "disabled")])
def test_flash_attn_flag_reaches_llama_cpp(tiny_llama: Path, flag: str, shown: str) -> None:
    """--flash-attn is what llama.cpp loads (its own log line, with -v)."""
    r = run_cli("run", str(tiny_llama), "-p", "abc", "-n", "1", "-v", "--flash-attn", flag)
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if "flash_attn" in ln and "=" in ln]
    assert lines and lines[0].split("=")[-1].strip() == shown, lines


def test_raw_skips_the_chat_template(tiny_llama: Path) -> None:
    base = ("run", str(tiny_llama), "-p", "abc", "--json", "--temperature", "0", "-n", "1")
    templated = json.loads(run_cli(*base).stdout)["metrics"]["prompt_tokens"]
    raw = json.loads(run_cli(*base, "--raw").stdout)["metrics"]["prompt_tokens"]
    assert raw < templated  # ChatML adds role markers around the prompt


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "/nonexistent/model.gguf", "-p", "x"], "model file not found"),
        (["run", "{tiny}", "-p", "x", "--temperature", "-1"], "temperature must be >= 0"),
        (["run", "{tiny}", "-p", "x", "--top-p", "1.5"], "top-p must be in"),
        (["run", "{tiny}"], "no prompt"),
        (["run", "{tiny}", "-p", "x", "--kv-policy", "h2o", "--flash-attn", "on"],
         "reads attention probabilities"),
    ],
)
def test_bad_input_gives_one_line_error(tiny_llama: Path, args: list[str], message: str) -> None:
    r = run_cli(*[a.replace("{tiny}", str(tiny_llama)) for a in args], input="")
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("error:") and message in lines[0]
    assert "Traceback" not in r.stderr


@pytest.mark.slow
def test_default_model_answers_and_reports_metrics() -> None:
    """README command 1 in miniature: no model named → the built-in Gemma is assembled."""
    r = run_cli(
        "run",
        "--prompt",
        "The three primary colors are",
        "--temperature",
        "0",
        "-n",
        "16",
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    first_line = r.stdout.strip().splitlines()[0]
    assert {"red", "yellow", "blue"} <= set(first_line.replace(",", " ").replace(".", " ").split())
    assert "Assembling the built-in model" in r.stderr
    assert "generated 16 tok" in r.stderr and "TTFT" in r.stderr
    assert "plan: ctx" in r.stderr  # the planner chose how to load it


@pytest.mark.slow
def test_ctrl_c_stops_cleanly_with_footer(gemma_path: Path) -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "inferenceos",
            "run",
            str(gemma_path),
            "-p",
            "Write a very long story about a dragon.",
            "-n",
            "3000",
            "--ctx",
            "4096",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(),
    )
    assert proc.stdout is not None
    proc.stdout.read(20)  # wait until tokens are streaming
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130
    assert "stop: interrupted" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("policy", ["streaming", "h2o"])
def test_run_with_a_kv_policy_generates_past_the_context(tiny_llama: Path,
                                                         policy: str) -> None:
    """`run --kv-policy` evicts instead of stopping at a full context: 300 tokens out of
    a 256-token context."""
    import json

    args = ["run", str(tiny_llama), "-p", "ab", "-n", "300", "--ignore-eos", "--json",
            "--ctx", "256", "--threads", "1", "--temperature", "0"]
    plain = run_cli(*args)
    assert json.loads(plain.stdout)["metrics"]["completion_tokens"] < 300  # context full
    r = run_cli(*args, "--kv-policy", policy)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["metrics"]["completion_tokens"] == 300
