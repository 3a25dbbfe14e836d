"""Turn chat messages into the prompt text a model was trained on.

The template stored in the GGUF (`tokenizer.chat_template`, Jinja2) is untrusted: it is
rendered in Jinja2's immutable sandbox (llama-cpp-python's CVE-2024-34359 came from
rendering it unsandboxed). A file without a template is taken for a base model and gets
the raw text; the user may name one of llama.cpp's built-in templates instead.
"""

from __future__ import annotations

import ctypes
import datetime
from collections.abc import Sequence
from dataclasses import dataclass

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from inferenceos.errors import UsageError


@dataclass(frozen=True)
class ChatMessage:
    role: str
    content: str


def _raise(message: str) -> None:
    raise jinja2.TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


def render_jinja(
    template: str,
    messages: Sequence[ChatMessage],
    bos_token: str = "",
    eos_token: str = "",
    add_generation_prompt: bool = True,
) -> str:
    """Render a Hugging Face style chat template in a sandbox."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals.update(raise_exception=_raise, strftime_now=_strftime_now)
    try:
        return env.from_string(template).render(
            messages=[{"role": m.role, "content": m.content} for m in messages],
            bos_token=bos_token,
            eos_token=eos_token,
            add_generation_prompt=add_generation_prompt,
        )
    except jinja2.TemplateError as exc:
        raise UsageError(f"the model's chat template failed: {exc}") from None


def render_builtin(
    name: str, messages: Sequence[ChatMessage], add_generation_prompt: bool = True
) -> str | None:
    """Render with llama.cpp's built-in template `name`; None when llama.cpp lacks it."""
    from inferenceos.engine.llama_lib import lib

    ll = lib()
    keep = [(m.role.encode(), m.content.encode()) for m in messages]
    chat = (ll.llama_chat_message * len(keep))()
    for i, (role, content) in enumerate(keep):
        chat[i].role = role
        chat[i].content = content
    size = 256 + sum(len(r) + len(c) for r, c in keep) * 2
    for _ in range(2):
        buf = ctypes.create_string_buffer(size)
        n = ll.llama_chat_apply_template(
            name.encode(), chat, len(keep), add_generation_prompt, buf, size
        )
        if n < 0:
            return None
        if n <= size:
            return buf.raw[:n].decode("utf-8", errors="replace")
        size = n
    return None


def render_chat(
    template: str | None,
    messages: Sequence[ChatMessage],
    bos_token: str = "",
    eos_token: str = "",
    builtin: str | None = None,
) -> tuple[str, str]:
    """Render `messages` for a model; returns (prompt text, which template was used).

    `builtin` (a llama.cpp built-in template name such as "gemma" or "chatml") overrides
    the file's template. A file without a template is a base model: the messages'
    contents are joined and sent as they are, as llama.cpp's completion does.
    """
    if builtin:
        text = render_builtin(builtin, messages)
        if text is None:
            raise UsageError(f"llama.cpp has no built-in chat template named {builtin!r}")
        return text, f"builtin:{builtin}"
    if template:
        return render_jinja(template, messages, bos_token, eos_token), "gguf"
    return "\n".join(m.content for m in messages), "raw"
