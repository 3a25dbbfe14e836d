"""`--draft auto` (the default) on a real instruction-tuned model: the first reply decodes
plainly and records what n-gram drafting would have done; the plan then drafts where
that pays, and the greedy copy stays the same."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import inferenceos
from cli_helpers import run_cli

COPY = """Copy this configuration file exactly, line by line, and add the line \
debug = true at the end:

[server]
host = "127.0.0.1"
port = 8080
workers = 4
timeout_seconds = 30
max_body_bytes = 1048576

[database]
url = "postgres://app:secret@localhost:5432/app"
pool_size = 10
statement_timeout_ms = 5000

[cache]
backend = "redis"
url = "redis://localhost:6379/0"
ttl_seconds = 600
"""


def _run(model: Path, *more: str) -> tuple[dict, str]:
    r = run_cli("run", str(model), "--prompt", COPY, "--temperature", "0", "-n", "200",
                "--json", *more)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout), r.stderr


def _copied(text: str) -> str:
    """The reply's copy of the file: from its first line to the line it was asked to add."""
    start, end = text.find("[server]"), text.find("debug = true")
    return text[start:end] if 0 <= start < end else ""


@pytest.mark.slow
def test_auto_learns_ngram_from_a_plain_reply_that_quotes_its_prompt(qwen05_path: Path) -> None:
    first, plan1 = _run(qwen05_path)
    assert "no drafter (auto: no drafted or replayed runs of this model yet)" in plan1
    m1 = first["metrics"]
    assert m1["draft"] == "" and m1["ngram_replay"]["draft_accepted"] > 80
    # the Python API (and `chat`, which loads through it) plans the same drafter; it
    # records no telemetry, so the CLI's second run below still learns from the replay
    with inferenceos.load(qwen05_path, draft="auto") as model:
        reply = model.chat([{"role": "user", "content": COPY}], temperature=0,
                           max_tokens=200)
    assert reply.metrics.draft == "ngram" and reply.metrics.draft_accepted > 50
    with inferenceos.load(qwen05_path) as model:  # the API's default: no drafter
        assert model.chat([{"role": "user", "content": "Hi"}], temperature=0,
                          max_tokens=4).metrics.draft == ""
    second, plan2 = _run(qwen05_path)
    assert "draft ngram (auto: " in plan2 and "learned from 1 run (1 replayed)" in plan2
    m2 = second["metrics"]
    assert m2["draft"] == "ngram" and m2["draft_accepted"] > 50
    assert m2["decode_steps"] < m1["decode_steps"] / 1.5  # tokens per step
    # greedy verification keeps the model's choices: the copied file is the same (the
    # sentence after it may not be: batched rows move logits by ~1 %, and a near tie
    # can flip, docs/engine.md "Batching and numerics")
    assert _copied(second["text"]) == _copied(first["text"]) != ""
    none, plan3 = _run(qwen05_path, "--draft", "none", "-n", "8")  # the plan is the point
    assert none["metrics"]["draft"] == "" and "draft" not in plan3.split("·")[-1]


@pytest.mark.slow
def test_serve_loads_the_drafter_its_plan_chose(qwen05_path: Path) -> None:
    """After one plain `run` that quoted its prompt, `serve` plans the model with ngram
    (its plan line says so) and greedy chat requests draft through the real `openai`
    client (/metrics counts the drafted tokens); a seeded sampled request does not."""
    import signal

    import httpx
    import openai

    from cli_helpers import start_serve

    _run(qwen05_path)  # the history: one plain reply and its replay
    proc, base = start_serve(str(qwen05_path), "--ctx", "2048", "--any-model")
    try:
        client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0,
                               timeout=300)
        ask = {"model": "any", "messages": [{"role": "user", "content": COPY}],
               "max_tokens": 160}
        greedy = client.chat.completions.create(**ask, temperature=0)
        assert "debug = true" in (greedy.choices[0].message.content or "")
        drafted = _draft_tokens(httpx.get(base + "/metrics").text)
        assert drafted > 50
        client.chat.completions.create(**ask, temperature=0.7, seed=3)
        assert _draft_tokens(httpx.get(base + "/metrics").text) == drafted
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert "draft ngram (auto: " in err


def _draft_tokens(metrics: str) -> float:
    """The ngram drafter's draft tokens in a Prometheus exposition."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
               if line.startswith("inferenceos:spec_decode_num_draft_tokens_total")
               and 'drafter="ngram"' in line)


REPEAT = ("Repeat this sentence exactly three times, one per line: The quick brown fox "
          "jumps over the lazy dog while the old cat sleeps on the warm kitchen mat.")


def _chat(model: Path, draft: str) -> str:
    r = run_cli("chat", str(model), "--local", "--theme", "none", "-t", "0", "-n", "96",
                "--draft", draft, input=f"{REPEAT}\n/stats\n/bye\n", timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


@pytest.mark.slow
def test_chat_takes_a_drafter_and_its_stats_say_how_drafting_went(qwen05_path: Path) -> None:
    """`chat --draft ngram` drafts (the repeated sentence is its prompt's n-grams) and
    /stats says so, with the share accepted; `--draft none` decodes plainly, and the
    greedy reply is the same text."""
    drafted, plain = _chat(qwen05_path, "ngram"), _chat(qwen05_path, "none")
    line = next((ln for ln in drafted.splitlines() if ln.startswith("drafting")), "")
    assert line.startswith("drafting      ngram: "), drafted[-1500:]
    accepted = int(line.split(": ")[1].split("%")[0])
    assert accepted > 0 and "tokens per step" in line
    assert not any(ln.startswith("drafting") for ln in plain.splitlines())
    reply = drafted.split("TTFT")[0]
    assert "quick brown fox" in reply and reply == plain.split("TTFT")[0]
