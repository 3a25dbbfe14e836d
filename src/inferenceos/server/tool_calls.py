"""Tool calls in a model's own words: which format a chat template teaches, and how to
read calls back out of the text the model wrote.

Formats (detected from the template text, as llama-server does with `--jinja`):
- `hermes` (Hermes 2 Pro, Qwen 2.5 / 3): `<tool_call>{"name": .., "arguments": ..}
  </tool_call>`, one block per call, possibly after some text;
- `mistral`: `[TOOL_CALLS]` then a JSON list of `{"name", "arguments"}`;
- `llama3` (Llama 3.1 / 3.2): the whole reply is `{"name": .., "parameters": ..}`,
  maybe after `<|python_tag|>`;
- `json`: any other template that renders `tools`: a bare JSON call (either key).

Small models often drop their tags. Every format therefore also reads JSON calls
written without them: JSON calls as the whole reply (bare or fenced), and — once the
format is `bound` to the functions a request declared — JSON calls at the reply's tail,
bare on their own lines or in ``` / ```json fences, after any text (Qwen 2.5 Coder
often writes that instead of `<tool_call>`). Such an untagged call counts only when it
names a declared function and its arguments fit that function's `parameters`
(`schema_fit`), so a reply that merely shows some JSON stays content. Text that does
not parse as a call stays content, never an error.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from inferenceos.server.schema_fit import fits

_PYTHON_TAG = "<|python_tag|>"


@dataclass(frozen=True)
class ToolFormat:
    """How one model family writes a tool call.

    `open` / `close` bracket a call anywhere in the reply (None: the reply itself is
    the JSON); `args_key` is the key the model writes the arguments under. `tools`:
    the functions the request declared (`{"name", "parameters"?}` each; see `bound`),
    empty for the bare format; not part of equality.
    """

    name: str
    open: str | None
    close: str | None
    args_key: str
    tools: tuple[dict[str, Any], ...] = field(default=(), compare=False)

    def bound(self, functions: Sequence[dict[str, Any]]) -> ToolFormat:
        """This format for a request that declared `functions`: untagged JSON calls
        are then also read at the reply's tail and in fences, and only when they name
        one of `functions` with arguments that fit its parameters."""
        return dataclasses.replace(self, tools=tuple(functions))


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


_SEPARATORS = " \t\r\n,;"


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
        while pos < len(text) and text[pos] in _SEPARATORS:
            pos += 1
    calls = [_call_from(o) for o in found]
    if not calls or any(c is None for c in calls):
        return None
    return [c for c in calls if c is not None]


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
            if calls and m.end() == len(text) and not (fmt.close and m.group(0).endswith(
                    fmt.close)):  # a further call cut off (max_tokens): the whole ones stand
                break
            return None
        calls += block
    content = pattern.sub("", text).strip()
    return content, calls


# -- untagged calls: bare or fenced JSON at the reply's tail ----------------------------

# what a scan of the text from a candidate start found: the rest of the text is calls
# (OK), may still become calls as more text arrives (PARTIAL), or cannot (BAD)
OK, PARTIAL, BAD = "ok", "partial", "bad"

_DECODER = json.JSONDecoder(strict=False)  # raw newlines inside strings: small models
_FENCE = re.compile(r"```[ \t]*([A-Za-z]*)")
_FENCE_MARK = re.compile("```")
_LINE_OPENS_JSON = re.compile(r"^[ \t]*([{\[])", re.MULTILINE)
# from a decode error's position to the end: a literal, number or escape being written
_UNFINISHED_WORD = re.compile(r"[\w.+\-]*\s*")


def _declared(call: ParsedCall, fmt: ToolFormat) -> bool:
    """Whether an untagged `call` counts: it names a declared function and its
    arguments fit that function's parameters (any call, for an unbound format)."""
    if not fmt.tools:
        return True
    for fn in fmt.tools:
        if fn.get("name") == call.name:
            return fits(fn.get("parameters"), call.arguments)
    return False


def _decode_unit(text: str, pos: int, fmt: ToolFormat) -> tuple[str, list[ParsedCall], int]:
    """One JSON value at `pos` (an object or a list of them): (OK, its calls, end) when
    every object in it is a counted call, (PARTIAL, [], pos) when the JSON is cut short
    by the end of the text, else (BAD, [], pos)."""
    try:
        obj, end = _DECODER.raw_decode(text, pos)
    except json.JSONDecodeError as exc:
        unfinished = (exc.msg.startswith("Unterminated string")
                      or _UNFINISHED_WORD.fullmatch(text, exc.pos) is not None)
        return (PARTIAL if unfinished else BAD), [], pos
    found = [_call_from(o) for o in (obj if isinstance(obj, list) else [obj])]
    calls = [c for c in found if c is not None and _declared(c, fmt)]
    if not calls or len(calls) != len(found):
        return BAD, [], pos
    return OK, calls, end


def _scan(text: str, pos: int, fmt: ToolFormat,
          fenced: bool = False) -> tuple[str, list[ParsedCall], int]:
    """Read call units from `pos` to the end of `text`: JSON calls, bare or in a ``` /
    ```json fence, separated by whitespace, `,` or `;` (a `<|python_tag|>` may come
    before one). Returns (state, the calls read, where reading stopped): OK when the
    rest of the text is exactly such calls (an unclosed last fence included: the model
    may stop there), PARTIAL when it is not yet but more text may make it so, BAD when
    no continuation can. `fenced`: inside a fence, whose closing ends the scan."""
    calls: list[ParsedCall] = []
    while True:
        while pos < len(text) and text[pos] in _SEPARATORS:
            pos += 1
        if pos == len(text):
            return (OK if calls else PARTIAL), calls, pos
        rest = text[pos:pos + len(_PYTHON_TAG)]
        if text[pos] in "{[":
            state, found, pos = _decode_unit(text, pos, fmt)
        elif text[pos] == "<" and _PYTHON_TAG.startswith(rest):
            if rest != _PYTHON_TAG:
                return PARTIAL, calls, pos
            pos += len(_PYTHON_TAG)
            continue
        elif text[pos] == "`" and fenced:  # the closing fence (or its first backticks)
            if not text.startswith("```", pos) and not "```".startswith(text[pos:]):
                return BAD, [], pos
            return (OK if calls else BAD), calls, min(pos + 3, len(text))
        elif text[pos] == "`":
            state, found, pos = _fence(text, pos, fmt)
        else:
            return BAD, [], pos
        if state != OK:
            return state, calls, pos
        calls += found


def _fence(text: str, pos: int, fmt: ToolFormat) -> tuple[str, list[ParsedCall], int]:
    """A ``` or ```json fenced block of calls at `pos` (see `_scan`)."""
    if len(text) - pos < 3:
        return (PARTIAL if "```".startswith(text[pos:]) else BAD), [], pos
    m = _FENCE.match(text, pos)
    if m is None:
        return BAD, [], pos
    lang = m.group(1).lower()
    if m.end() == len(text):  # the language tag may still be being written
        return (PARTIAL if "json".startswith(lang) else BAD), [], pos
    if lang not in ("", "json"):
        return BAD, [], pos
    state, calls, end = _scan(text, m.end(), fmt, fenced=True)
    return state, (calls if state == OK else []), end


def _starts(text: str, fmt: ToolFormat, begin: int = 0) -> Iterator[int]:
    """Where a tail of untagged calls may start, from `begin` on, in order: the reply's
    beginning (0: leading whitespace is part of the call) and, for a bound format, every
    fence and every `{` / `[` that opens a line (or backticks ending the text, which
    may become a fence)."""
    if begin == 0:
        yield 0
    if not fmt.tools:
        return
    found = {m.start(1) for m in _LINE_OPENS_JSON.finditer(text, begin)}
    found.update(m.start() for m in _FENCE_MARK.finditer(text, begin))
    ticks = len(text) - len(text.rstrip("`"))
    if 0 < ticks < 3:
        found.add(len(text) - ticks)
    yield from sorted(i for i in found if i >= max(begin, 1))


def _split(text: str, fmt: ToolFormat) -> tuple[str, list[ParsedCall], int]:
    """(content, calls, where the calls start) for a whole reply; see parse_tool_calls."""
    if fmt.open and fmt.open in text:
        tagged = _tagged(text, fmt)
        if tagged is None:
            return text, [], len(text)
        return tagged[0], tagged[1], text.find(fmt.open)
    for start in _starts(text, fmt):
        state, calls, _ = _scan(text, start, fmt)
        if state == OK:
            return text[:start].strip(), calls, start
    return text, [], len(text)


def parse_tool_calls(text: str, fmt: ToolFormat) -> tuple[str, list[ParsedCall]]:
    """(content, calls) read from a model's whole reply in format `fmt`.

    Calls in the format's markers come first: `content` is then the text outside them.
    Otherwise untagged JSON calls (see the module docstring) that end the reply are
    calls and `content` is the text before them. `content` is stripped ("" when none).
    A reply whose call blocks do not parse comes back whole as content with no calls.
    """
    content, calls, _ = _split(text, fmt)
    return content, calls


def _partial_marker(text: str, begin: int, marker: str) -> int:
    """Where a marker that the end of `text` may be starting begins (len(text): none)."""
    for keep in range(min(len(marker) - 1, len(text) - begin), 0, -1):
        if marker.startswith(text[-keep:]):
            return len(text) - keep
    return len(text)


class ToolCallStream:
    """Splits a streamed reply into text safe to show now and text held back because
    it is, or may become, a tool call (the brief's "hold back from the start marker").

    `feed(piece)` returns the text that can be sent now; `finish()` parses the whole
    reply and returns (the held text to send as content, the calls). Text is held from
    the format's marker (to the end), and from any place an untagged call may start
    for as long as the text from there may still be calls (`_scan`); JSON that turns
    out not to be a call is released as soon as that is certain. The text sent is
    always a prefix of the reply; when the reply holds calls, text after the first call
    is not sent (most models write none).
    """

    def __init__(self, fmt: ToolFormat) -> None:
        self.fmt = fmt
        self.text = ""
        self._sent = 0
        self._live: tuple[int, str] | None = None  # the held candidate: (start, state)

    def _still_live(self, start: int, piece: str) -> bool:
        """Whether the candidate held at the last feed is, without scanning it again.
        Rescanning a long held JSON at every piece is quadratic; while it is unfinished
        (PARTIAL) only a closing bracket or backtick can make it calls, so until one
        arrives it stays held (a turn to BAD is seen a little later: held longer)."""
        if self._live is None or self._live[0] != start or self._live[1] != PARTIAL:
            return False
        return len(self.text) - start > 64 and not any(c in piece for c in "}]`")

    def _hold_from(self, piece: str) -> int:
        """Where the text that must stay back starts (len(text): nothing to hold)."""
        text, hold = self.text, len(self.text)
        marker = self.fmt.open
        if marker is not None:
            at = text.find(marker, self._sent)
            hold = at if at >= 0 else _partial_marker(text, self._sent, marker)
        for start in _starts(text, self.fmt, self._sent):
            if start >= hold:
                break
            if self._still_live(start, piece):
                return start
            state = _scan(text, start, self.fmt)[0]
            if state != BAD:
                self._live = (start, state)
                return start
        self._live = None
        return hold

    def feed(self, piece: str) -> str:
        self.text += piece
        end = max(self._sent, self._hold_from(piece))
        out, self._sent = self.text[self._sent:end], end
        return out

    def finish(self) -> tuple[str, list[ParsedCall]]:
        _, calls, start = _split(self.text, self.fmt)
        rest = self.text[self._sent:start].rstrip() if calls else self.text[self._sent:]
        self._sent = len(self.text)
        return rest, calls
