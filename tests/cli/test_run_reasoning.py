"""`run --reasoning-budget N` on the real Qwen2.5-Coder-0.5B-Instruct under a template
that opens a `<think>` section (tests/thinking_model.py): the reasoning comes apart
from the answer (`--json`: a "reasoning" field; piped: on stderr, stdout holds the
answer), 0 turns thinking off through the template's `enable_thinking`, N > 0 closes
the section after N tokens. Greedy, the model answers "What is the capital of
France?" in its reasoning ("The capital of France is Paris.") and again after the
section is closed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli_helpers import run_cli
from inferenceos.engine.generation import TokenEvent
from inferenceos.engine.reasoning import BudgetWatch, Reasoning, apply_thinking
from thinking_model import THINKING_TEMPLATE, thinking_qwen

ASK = ("-p", "What is the capital of France?", "--temperature", "0", "-n", "40",
       "--ctx", "1024")
TAGS = ("<think>", "</think>", "<|im_start|>", "<|im_end|>")


@pytest.fixture(scope="module")
def thinker(qwen05_path: Path) -> Path:
    return thinking_qwen(qwen05_path, qwen05_path.parent)


def test_budget_0_turns_thinking_off_with_no_reasoning(thinker: Path) -> None:
    r = run_cli("run", str(thinker), *ASK, "--reasoning-budget", "0", "--json", timeout=300)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert "reasoning" not in data
    assert "Paris" in data["text"] and not any(t in data["text"] for t in TAGS)


def test_budget_n_closes_the_section_and_the_answer_follows(thinker: Path) -> None:
    r = run_cli("run", str(thinker), *ASK, "--reasoning-budget", "4", timeout=300)
    assert r.returncode == 0, r.stderr
    answer = r.stdout.strip()
    assert answer and not any(t in answer for t in TAGS)
    assert "The capital of" in r.stderr  # the reasoning, piped apart (4 tokens of it)


def test_the_core_prepares_the_prompt_and_keeps_the_budget() -> None:
    head = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n"
    prompt, reasoning = apply_thinking(THINKING_TEMPLATE, head, off=True)
    assert prompt.endswith("<think>\n\n</think>\n\n") and reasoning == Reasoning(False)
    assert apply_thinking(THINKING_TEMPLATE, head, off=False) == (head, Reasoning(True))
    assert apply_thinking("{{ messages }}", "plain", off=True) == ("plain", None)
    watch = BudgetWatch(Reasoning(True), 2)
    # the model writing "</" at the budget's end is let finish its own tag
    assert [watch.feed(TokenEvent(i, t)) for i, t in enumerate(["a", "b\n</", "think>"])
            ] == [False, False, False]
