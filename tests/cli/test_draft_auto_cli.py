"""`--draft auto` (the default) on a real instruction-tuned model: the first reply decodes
plainly and records what n-gram drafting would have done; the plan then drafts where
that pays, and the greedy copy stays the same."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

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
    second, plan2 = _run(qwen05_path)
    assert "draft ngram (auto: " in plan2 and "learned from 1 run (1 replayed)" in plan2
    m2 = second["metrics"]
    assert m2["draft"] == "ngram" and m2["draft_accepted"] > 50
    assert m2["decode_steps"] < m1["decode_steps"] / 1.5  # tokens per step
    # greedy verification keeps the model's choices: the copied file is the same (the
    # sentence after it may not be: batched rows move logits by ~1 %, and a near tie
    # can flip, docs/engine.md "Batching and numerics")
    assert _copied(second["text"]) == _copied(first["text"]) != ""
    none, plan3 = _run(qwen05_path, "--draft", "none")
    assert none["metrics"]["draft"] == "" and "draft" not in plan3.split("·")[-1]
