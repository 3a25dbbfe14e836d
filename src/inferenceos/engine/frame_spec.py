"""How a stream's token events look on the wire, for the process that writes them.

A streamed reply's events differ per token in three places only: the token's text, its
id and the count of tokens so far. `FrameSpec` is a dialect's event with those three
cut out, so a process that knows no dialect (the model worker, engine/worker/direct.py)
can write the events itself, the same bytes the HTTP process would have written.

`FrameSpec.sample(render)` builds one from the dialect's own renderer, called once with
sentinel values that are then cut out of its text: the dialect's code stays the one
source of its shape.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from inferenceos.units import iso_time

# the sentinels `sample` renders with; each must appear exactly once in the rendering
_TEXT = "\x00text\x00"
TIME = "\x00time\x00"  # a renderer's time of writing (FrameSpec.sample's `at`)
_TOKEN = -7_000_000_001
_COUNT = -7_000_000_002
_CUTS = {
    '"\\u0000text\\u0000"': "text",  # how a JSON encoder writes _TEXT
    '"\\u0000time\\u0000"': "time",
    f"[{_TOKEN}]": "tokens",
    str(_COUNT): "n",
}

# JSON string of a text, as json.dumps(ensure_ascii=False) writes it (C when available)
_json_string: Callable[[str], str] = json.encoder.encode_basestring


@dataclass(frozen=True)
class FrameSpec:
    """An event with its per-token fields cut out: `parts` is the literal text around
    `fields` (one more part than fields), each field one of

    - "text": the token's text as a JSON string (quotes included);
    - "tokens": a JSON list of the token id (`[]` for a flush of held-back text);
    - "n": the tokens written so far, this one included, counted from `n_base`;
    - "time": when it is written, as a JSON string (`units.iso_time`: Ollama's
      `created_at`).

    `chunked`: each write is one HTTP/1.1 chunk (the response's transfer coding).
    `skip_empty`: a token without text is no event (OpenAI's chunks); else only a flush
    without text is none (llama-server's events carry every token).
    `interval_s`: the longest the stream goes without a write while its events wait for
    the next step's (engine/worker/direct.py; `server.stream_interval_ms`); 0: each
    step's events are written at once."""

    parts: tuple[str, ...]
    fields: tuple[str, ...]
    n_base: int = 0
    chunked: bool = True
    skip_empty: bool = False
    interval_s: float = 0.0

    @property
    def stamped(self) -> bool:
        """Whether its events carry their time of writing (a "time" field)."""
        return "time" in self.fields

    def writes(self, token: int, text: str) -> bool:
        """Whether the event of `token` with `text` is written at all."""
        return bool(text) or (token >= 0 and not self.skip_empty)

    def frame(self, token: int, text: str, n: int, at: str = "") -> str:
        """The event of `token` (-1: a flush, no id) with `text`, the `n`-th token,
        written at `at` (an `iso_time`; "" for now)."""
        out = [self.parts[0]]
        for name, part in zip(self.fields, self.parts[1:], strict=True):
            if name == "text":
                out.append(_json_string(text))
            elif name == "tokens":
                out.append(f"[{token}]" if token >= 0 else "[]")
            elif name == "time":
                out.append(_json_string(at or iso_time()))
            else:
                out.append(str(self.n_base + n))
            out.append(part)
        return "".join(out)

    def wire(self, frames: str) -> bytes:
        """`frames` as one write on the connection (one chunk when `chunked`)."""
        body = frames.encode()
        if not self.chunked:
            return body
        return b"%x\r\n%b\r\n" % (len(body), body)

    @classmethod
    def sample(cls, render: Callable[[str, list[int], int], str], n_base: int = 0,
               chunked: bool = True, skip_empty: bool = False) -> FrameSpec | None:
        """The spec of `render(text, tokens, n)` (a dialect's event as written on the
        wire; its time of writing, if it has one, written as `TIME`); None when a
        sentinel appears twice, or the text not once (a renderer that transforms its
        inputs: such a stream is written by its dialect only)."""
        text = render(_TEXT, [_TOKEN], _COUNT)
        pieces: list[tuple[int, str, str]] = []
        for cut, name in _CUTS.items():
            if text.count(cut) > 1:
                return None
            at = text.find(cut)
            if at >= 0:
                pieces.append((at, cut, name))
        if not any(name == "text" for _, _, name in pieces):
            return None
        pieces.sort()
        parts: list[str] = []
        start = 0
        for at, cut, _ in pieces:
            parts.append(text[start:at])
            start = at + len(cut)
        parts.append(text[start:])
        return cls(tuple(parts), tuple(name for _, _, name in pieces), n_base, chunked,
                   skip_empty)
