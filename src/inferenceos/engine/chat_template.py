"""Turn chat messages into the prompt text a model was trained on.

The template stored in the GGUF (`tokenizer.chat_template`, Jinja2) is untrusted: it is
rendered in Jinja2's immutable sandbox (llama-cpp-python's CVE-2024-34359 came from
rendering it unsandboxed). A file without a template is taken for a base model and gets
the raw text; the user may name one of llama.cpp's built-in templates instead.

Tools (function calling) are rendered as Hugging Face's `apply_chat_template` renders
them: `tools` is the list of `{"type": "function", "function": {name, description,
parameters}}`, an assistant message may carry `tool_calls` (arguments as a dict) and a
`tool` message its `tool_call_id`; the template decides how the model sees them.
"""

from __future__ import annotations

import ctypes
import datetime
import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from inferenceos.errors import UsageError


@dataclass(frozen=True)
class ToolCall:
    """A function call the assistant made: `arguments` is a dict (templates index it
    and `tojson` it), `id` pairs it with the `tool` message answering it."""

    name: str
    arguments: dict[str, Any]
    id: str | None = None

    def as_template(self) -> dict[str, Any]:
        """The Hugging Face shape templates expect in `message.tool_calls`."""
        out: dict[str, Any] = {"type": "function",
                               "function": {"name": self.name, "arguments": self.arguments}}
        if self.id:
            out["id"] = self.id
        return out


@dataclass(frozen=True)
class ChatMessage:
    """One message. `tool_calls` only on assistant messages, `tool_call_id` (and the
    tool's `name`) only on `tool` messages; both are left out of the template's view
    when unset, so templates testing `'tool_calls' in message` see what HF shows them."""

    role: str
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None

    def as_template(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [c.as_template() for c in self.tool_calls]
        if self.tool_call_id:
            out["tool_call_id"] = self.tool_call_id
        if self.name:
            out["name"] = self.name
        return out


def _raise(message: str) -> None:
    raise jinja2.TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    """Hugging Face's `tojson`: plain json.dumps. Jinja's own escapes <, >, & and ' for
    HTML, which would show models tool schemas unlike the ones they were trained on."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent,
                      separators=separators, sort_keys=sort_keys)


@functools.lru_cache(maxsize=16)
def _compiled(template: str) -> jinja2.Template:
    """`template` compiled in the sandbox, once per template text (a server renders its
    models' few templates for every chat request: compiling one took ~6 ms of the
    request's CPU, Qwen2.5's; a compiled Template renders from any thread).
    TemplateSyntaxError (a jinja2.TemplateError) for a broken one, not cached."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.globals.update(raise_exception=_raise, strftime_now=_strftime_now)
    env.filters["tojson"] = _tojson
    return env.from_string(template)


def render_jinja(
    template: str,
    messages: Sequence[ChatMessage],
    bos_token: str = "",
    eos_token: str = "",
    add_generation_prompt: bool = True,
    tools: Sequence[dict[str, Any]] | None = None,
    kwargs: Mapping[str, Any] | None = None,
) -> str:
    """Render a Hugging Face style chat template in a sandbox.

    `tools` is passed only when non-empty: templates test `if tools` or `tools is
    defined`, and both must read "no tools" otherwise. `kwargs`: further template
    variables (`chat_template_kwargs`: `enable_thinking`, `reasoning_effort`...); they
    cannot replace the ones named above.
    """
    extra: dict[str, Any] = dict(kwargs or {})
    for name in ("messages", "bos_token", "eos_token", "add_generation_prompt", "tools"):
        extra.pop(name, None)
    if tools:
        extra["tools"] = list(tools)
    try:
        return _compiled(template).render(
            messages=[m.as_template() for m in messages],
            bos_token=bos_token,
            eos_token=eos_token,
            add_generation_prompt=add_generation_prompt,
            **extra,
        )
    except jinja2.TemplateError as exc:
        raise UsageError(f"the model's chat template failed: {exc}") from None


def render_builtin(
    name: str, messages: Sequence[ChatMessage], add_generation_prompt: bool = True
) -> str | None:
    """Render with llama.cpp's built-in template `name`; None when llama.cpp lacks it."""
    from inferenceos.engine.llama.lib import lib

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
    tools: Sequence[dict[str, Any]] | None = None,
    kwargs: Mapping[str, Any] | None = None,
) -> tuple[str, str]:
    """Render `messages` for a model; returns (prompt text, which template was used).

    `builtin` (a llama.cpp built-in template name such as "gemma" or "chatml") overrides
    the file's template. A file without a template is a base model: the messages'
    contents are joined and sent as they are, as llama.cpp's completion does.
    `tools` (OpenAI / Hugging Face tool definitions) reach only the file's Jinja template:
    llama.cpp's built-in templates and raw text have no place for them (UsageError).
    `kwargs` (template variables such as `enable_thinking`) reach only the Jinja
    template too; elsewhere they are ignored.
    """
    if tools and not template:
        raise UsageError("tools need the model's own chat template (this model has none)")
    if tools and builtin:
        raise UsageError("tools cannot be used with a built-in chat template")
    if builtin:
        text = render_builtin(builtin, messages)
        if text is None:
            raise UsageError(f"llama.cpp has no built-in chat template named {builtin!r}")
        return text, f"builtin:{builtin}"
    if template:
        return render_jinja(template, messages, bos_token, eos_token, tools=tools,
                            kwargs=kwargs), "gguf"
    return "\n".join(m.content for m in messages), "raw"
