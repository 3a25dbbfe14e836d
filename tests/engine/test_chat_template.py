"""Chat templates: sandboxed Jinja from the GGUF, llama.cpp built-ins as fallback."""

from __future__ import annotations

import pytest

from inferenceos.engine.chat_template import ChatMessage, render_chat, render_jinja
from inferenceos.errors import UsageError
from tiny_models import CHATML_TEMPLATE

MSGS = [ChatMessage("system", "Be brief."), ChatMessage("user", "Hi")]


def test_gguf_template_rendered() -> None:
    text, used = render_chat(CHATML_TEMPLATE, MSGS)
    assert used == "gguf"
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_sandbox_blocks_python_internals() -> None:
    evil = "{{ ''.__class__.__mro__[1].__subclasses__() }}"
    with pytest.raises(UsageError, match="chat template failed"):
        render_jinja(evil, MSGS)


def test_sandbox_blocks_mutation() -> None:
    evil = "{% set x = messages.append({'role': 'x'}) %}{{ messages|length }}"
    with pytest.raises(UsageError):
        render_jinja(evil, MSGS)


def test_raise_exception_helper_becomes_user_error() -> None:
    with pytest.raises(UsageError, match="roles must alternate"):
        render_jinja("{{ raise_exception('roles must alternate') }}", MSGS)


def test_builtin_template_by_name_overrides_the_file() -> None:
    text, used = render_chat(CHATML_TEMPLATE, [ChatMessage("user", "Hi")], builtin="gemma")
    assert used == "builtin:gemma"
    assert text == "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"


def test_unknown_builtin_name_is_a_user_error() -> None:
    with pytest.raises(UsageError, match="no built-in chat template named 'nope'"):
        render_chat(None, [ChatMessage("user", "Hi")], builtin="nope")


def test_file_without_template_is_a_base_model_raw_text() -> None:
    text, used = render_chat(None, [ChatMessage("user", "Hi")])
    assert (text, used) == ("Hi", "raw")


def test_a_template_is_compiled_once_and_a_broken_one_fails_every_time() -> None:
    """A server renders its models' few templates for every chat request: each is
    compiled once (compiling Qwen2.5's took ~6 ms a request); an error is not kept."""
    from inferenceos.engine.chat_template import _compiled

    _compiled.cache_clear()
    template = "{% for m in messages %}[{{ m.role }}] {{ m.content }}{% endfor %}"
    assert render_jinja(template, [ChatMessage("user", "a")]) == "[user] a"
    assert render_jinja(template, [ChatMessage("user", "b")]) == "[user] b"
    assert (_compiled.cache_info().misses, _compiled.cache_info().hits) == (1, 1)
    for _ in range(2):
        with pytest.raises(UsageError, match="chat template failed"):
            render_jinja("{% for m in %}", [ChatMessage("user", "a")])
    assert _compiled.cache_info().currsize == 1
