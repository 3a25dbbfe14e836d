"""`chat --local` with `/think off` on the real Qwen2.5-Coder-0.5B-Instruct under a
template that opens a `<think>` section (tests/thinking_model.py): the Python API's
`template_kwargs` reach the template (`enable_thinking`), so the reply has no reasoning;
with thinking on, the same question reasons first (a folded `Thought`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from inferenceos.cli.chat_session import ChatSession, LocalBackend, Thought
from inferenceos.errors import UsageError
from thinking_model import thinking_qwen

ASK = "What is the capital of France?"


@pytest.fixture(scope="module")
def backend(qwen05_path: Path) -> Iterator[LocalBackend]:
    b = LocalBackend(str(thinking_qwen(qwen05_path, qwen05_path.parent)), n_ctx=1024)
    yield b
    b.close()


def test_template_kwargs_are_typed_and_turn_thinking_off(backend: LocalBackend) -> None:
    model = backend.model
    msgs = [{"role": "user", "content": ASK}]
    assert model.chat_prompt(msgs).endswith("<think>\n")
    off = model.chat_prompt(msgs, template_kwargs={"enable_thinking": False})
    assert off.endswith("<think>\n\n</think>\n\n")
    with pytest.raises(UsageError, match="enable_thinking"):
        model.chat_prompt(msgs, template_kwargs={"enable_thinking": "no"})
    with pytest.raises(UsageError, match="mapping"):
        model.chat_prompt(msgs, template_kwargs=["enable_thinking"])  # type: ignore[arg-type]


def test_think_off_in_a_local_chat_leaves_no_reasoning(backend: LocalBackend) -> None:
    session = ChatSession(backend)
    session.set_option("temperature", "0")
    session.set_option("max_tokens", "24")
    assert session.think("off") == "thinking off"
    pieces = list(session.ask(ASK))
    assert not [p for p in pieces if isinstance(p, Thought)]
    assert "Paris" in "".join(pieces) and "<think>" not in "".join(pieces)
    session.clear()
    session.think("on")
    assert [p for p in session.ask(ASK) if isinstance(p, Thought)]  # it reasons again
