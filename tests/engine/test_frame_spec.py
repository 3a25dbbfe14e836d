"""FrameSpec (engine/frame_spec.py): a dialect's token event with its per-token fields
cut out must give back, byte for byte, what the dialect itself writes."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from inferenceos.engine.frame_spec import FrameSpec
from inferenceos.server.sse import LLAMACPP_SSE, NDJSON, OPENAI_SSE


def _llama(text: str, tokens: list[int], n: int) -> str:
    return LLAMACPP_SSE.frame({"index": 0, "content": text, "tokens": tokens, "stop": False,
                               "id_slot": -1, "tokens_predicted": n,
                               "tokens_evaluated": 13}, 0)


@given(text=st.text(), token=st.integers(-1, 300_000), n=st.integers(0, 10_000),
       base=st.integers(0, 10_000))
def test_the_spec_writes_what_the_dialect_writes(text: str, token: int, n: int,
                                                 base: int) -> None:
    spec = FrameSpec.sample(_llama, base)
    assert spec is not None
    want = _llama(text, [token] if token >= 0 else [], base + n)
    assert spec.frame(token, text, n) == want


def test_fields_may_be_missing_or_in_any_order() -> None:
    def ollama(text: str, tokens: list[int], n: int) -> str:
        return NDJSON.frame({"model": "m", "response": text, "done": False}, 0)

    def openai(text: str, tokens: list[int], n: int) -> str:
        return OPENAI_SSE.frame({"n": n, "choices": [{"text": text, "ids": tokens}]}, 0)

    spec = FrameSpec.sample(ollama, 0)
    assert spec is not None and spec.fields == ("text",)
    assert json.loads(spec.frame(5, 'a"b\n', 1)) == {"model": "m", "response": 'a"b\n',
                                                      "done": False}
    spec = FrameSpec.sample(openai, 7)
    assert spec is not None and spec.fields == ("n", "text", "tokens")
    assert spec.frame(-1, "é", 2) == openai("é", [], 9)


def test_a_renderer_that_changes_its_text_has_no_spec() -> None:
    assert FrameSpec.sample(lambda text, tokens, n: f"data: {text.upper()!r}\n\n", 0) is None
    twice = FrameSpec.sample(lambda text, tokens, n: json.dumps([text, text]), 0)
    assert twice is None


def test_wire_frames_one_http_chunk() -> None:
    spec = FrameSpec(("data: ", "\n\n"), ("text",))
    frames = spec.frame(1, "é", 1) + spec.frame(2, "x", 2)
    body = frames.encode()
    assert spec.wire(frames) == b"%x\r\n" % len(body) + body + b"\r\n"
    assert FrameSpec(spec.parts, spec.fields, chunked=False).wire(frames) == body
