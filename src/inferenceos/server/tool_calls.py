"""Tool calls in a model's own words: which format a chat template teaches, and how to
read calls back out of the text the model wrote.

Formats (detected from the template text, as llama-server does with `--jinja`):
- `hermes` (Hermes 2 Pro, Qwen 2.5 / 3): `<tool_call>{"name": .., "arguments": ..}
  </tool_call>`, one block per call, possibly after some text;
- `mistral`: `[TOOL_CALLS]` then a JSON list of `{"name", "arguments"}`;
- `llama3` (Llama 3.1 / 3.2): the whole reply is `{"name": .., "parameters": ..}`,
  maybe after `<|python_tag|>`;
- `json`: any other template that renders `tools`: a bare JSON call (either key).

Every format also accepts a bare JSON call as the whole reply: small models often drop
their tags. Text that does not parse as a call stays content, never an error.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

_PYTHON_TAG = "<|python_tag|>"


@dataclass(frozen=True)
class ToolFormat:
    """How one model family writes a tool call.

    `open` / `close` bracket a call anywhere in the reply (None: the reply itself is
    the JSON); `args_key` is the key the model writes the arguments under.
    """

    name: str
    open: str | None
    close: str | None
    args_key: str


HERMES = ToolFormat("hermes", "<tool_call>", "</tool_call>", "arguments")
MISTRAL = ToolFormat("mistral", "[TOOL_CALLS]", None, "arguments")
LLAMA3 = ToolFormat("llama3", None, None, "parameters")
JSON_CALL = ToolFormat("json", None, None, "arguments")

_USES_TOOLS = re.compile(r"\btools\b")


def detect_format(template: str | None) -> ToolFormat | None:
    """The tool-call format `template` teaches; None when it never renders `tools`
    (the model was not trained for tools: Ollama answers "does not support tools")."""
    if not template or not _USES_TOOLS.search(template):
        return None
    if "<tool_call>" in template:
        return HERMES
    if "[TOOL_CALLS]" in template:
        return MISTRAL
    if _PYTHON_TAG in template or '"parameters"' in template or "ipython" in template:
        return LLAMA3
    return JSON_CALL


@dataclass(frozen=True)
class ParsedCall:
    """One call read from the model's output; `arguments` is always a JSON object."""

    name: str
    arguments: dict[str, Any]


def _call_from(obj: Any) -> ParsedCall | None:
    """`{"name": str, "arguments"|"parameters": object or JSON text of one}` → call."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError:
            return None
    return ParsedCall(obj["name"], args) if isinstance(args, dict) else None


def _json_calls(text: str) -> list[ParsedCall] | None:
    """Calls from JSON text: one object, a list of them, or several objects separated
    by whitespace, `,` or `;` (Llama 3.2 writes the latter). None when it is not that."""
    decoder = json.JSONDecoder()
    found: list[Any] = []
    pos, text = 0, text.strip()
    while pos < len(text):
        try:
            obj, pos = decoder.raw_decode(text, pos)
        except ValueError:
            return None
        found.extend(obj if isinstance(obj, list) else [obj])
        while pos < len(text) and text[pos] in " \t\r\n,;":
            pos += 1
    calls = [_call_from(o) for o in found]
    if not calls or any(c is None for c in calls):
        return None
    return [c for c in calls if c is not None]


def _bare(text: str) -> str:
    body = text.strip()
    return body[len(_PYTHON_TAG):] if body.startswith(_PYTHON_TAG) else body


def _tagged(text: str, fmt: ToolFormat) -> tuple[str, list[ParsedCall]] | None:
    """Calls between `fmt.open` and `fmt.close` (or the end: a model may stop before
    closing the last one); None when a block is not a valid call."""
    assert fmt.open is not None
    close = re.escape(fmt.close) if fmt.close else r"(?!)"
    pattern = re.compile(re.escape(fmt.open) + r"(.*?)(?:" + close + r"|\Z)", re.DOTALL)
    calls: list[ParsedCall] = []
    for m in pattern.finditer(text):
        block = _json_calls(m.group(1))
        if block is None:
            return None
        calls += block
    content = pattern.sub("", text).strip()
    return content, calls


def parse_tool_calls(text: str, fmt: ToolFormat) -> tuple[str, list[ParsedCall]]:
    """(content, calls) read from a model's whole reply in format `fmt`.

    `content` is the text outside the calls, stripped ("" when none). A reply whose
    call blocks do not parse comes back whole as content with no calls.
    """
    if fmt.open and fmt.open in text:
        tagged = _tagged(text, fmt)
        return tagged if tagged is not None else (text, [])
    bare = _bare(text)
    if bare[:1] in ("{", "["):
        calls = _json_calls(bare)
        if calls:
            return "", calls
    return text, []


class ToolCallStream:
    """Splits a streamed reply into text safe to show now and text held back because
    it is, or may become, a tool call (the brief's "hold back from the start marker").

    `feed(piece)` returns the text that can be sent now; `finish()` parses the whole
    reply and returns (the held text to send as content, the calls). When the reply
    holds calls, text after the first call is not sent (most models write none).
    """

    def __init__(self, fmt: ToolFormat) -> None:
        self.fmt = fmt
        self.text = ""
        self._sent = 0
        self._holding = False

    def _hold_from(self) -> int:
        """Where the text that must stay back starts (len(text): nothing to hold)."""
        visible = self.text.lstrip()
        if self._sent == 0:
            if not visible or _PYTHON_TAG.startswith(visible):
                return 0  # whitespace or a partial tag so far: a bare call may follow
            if visible[0] in "{[" or visible.startswith(_PYTHON_TAG):
                self._holding = True
                return 0
        marker = self.fmt.open
        if marker is None:
            return len(self.text)
        at = self.text.find(marker, self._sent)
        if at >= 0:
            self._holding = True
            return at
        for keep in range(min(len(marker) - 1, len(self.text)), 0, -1):
            if marker.startswith(self.text[-keep:]):  # a marker may be starting
                return len(self.text) - keep
        return len(self.text)

    def feed(self, piece: str) -> str:
        self.text += piece
        if self._holding:
            return ""
        end = max(self._sent, self._hold_from())
        out, self._sent = self.text[self._sent:end], end
        return out

    def finish(self) -> tuple[str, list[ParsedCall]]:
        _, calls = parse_tool_calls(self.text, self.fmt)
        rest = "" if calls else self.text[self._sent:]
        self._sent = len(self.text)
        return rest, calls
