"""Reasoning and constrained output on the real Qwen2.5-Coder-0.5B-Instruct, through a
real server, judged by the real `openai` and `ollama` clients.

Qwen2.5-Coder does not reason by itself: "thinker" is the same GGUF under a template
that opens a `<think>` section in the assistant prefix, honouring `enable_thinking`
(tests/thinking_model.py). One worked example in the conversation shows the model the
shape (reasoning, `</think>`, answer); greedy, it then writes "The capital of France is
Paris.\\n</think>\\n\\nThe answer is Paris." Asked for code with no example, it writes
far more than 16 tokens without closing the section: the budget's case.

"qwen" is the model under its own template, for the constraints and for Ollama's 400
on `think` with a model that has no reasoning section.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ollama
import openai
import pytest

from inferenceos.plan.entry import LoadRequest
from server_harness import Harness, serving
from thinking_model import thinking_qwen

EXAMPLE: Any = [{"role": "system", "content": "You are a helpful assistant."},
           {"role": "user", "content": "What is 2 + 2?"},
           {"role": "assistant",
            "content": "<think>\nTwo plus two makes four.\n</think>\n\nThe answer is 4."}]
FRANCE: Any = [*EXAMPLE, {"role": "user", "content": "What is the capital of France?"}]
CODE: Any = [{"role": "user", "content": "Write a Python function that adds two numbers."}]
GREEDY: dict[str, Any] = {"model": "thinker", "temperature": 0, "max_tokens": 48}
TAGS = ("<think>", "</think>", "<|im_start|>", "<|im_end|>")


@pytest.fixture(scope="module")
def server(qwen05_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    thinker = thinking_qwen(qwen05_path, qwen05_path.parent)
    root = tmp_path_factory.mktemp("reasoning-qwen")
    with serving({"thinker": thinker, "qwen": qwen05_path}, root,
                 manager_kw={"base": LoadRequest(n_ctx=2048)}) as h:
        yield h


@pytest.fixture
def client(server: Harness) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0, timeout=300)


@pytest.fixture
def oclient(server: Harness) -> ollama.Client:
    return ollama.Client(host=server.url, timeout=300)


def _clean(*texts: str | None) -> None:
    for text in texts:
        for tag in TAGS:
            assert tag not in (text or ""), text


def test_openai_reasoning_content_whole_and_streamed(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(**GREEDY, messages=FRANCE)
    msg: Any = r.choices[0].message
    assert "Paris" in msg.reasoning_content and "Paris" in msg.content, msg
    _clean(msg.reasoning_content, msg.content)
    thought: list[str] = []
    said: list[str] = []
    chunks: Any = client.chat.completions.create(**GREEDY, messages=FRANCE, stream=True)
    for chunk in chunks:
        delta: Any = chunk.choices[0].delta if chunk.choices else None
        if delta is not None and getattr(delta, "reasoning_content", None):
            assert not said, "reasoning came after the answer"
            thought.append(delta.reasoning_content)
        if delta is not None and delta.content:
            said.append(delta.content)
    assert len(thought) > 1 and "".join(thought) == msg.reasoning_content
    assert "".join(said) == msg.content


def test_openai_thinking_off_and_reasoning_format_none(client: openai.OpenAI) -> None:
    for extra in ({"chat_template_kwargs": {"enable_thinking": False}},
                  {"reasoning_budget_tokens": 0}, {"reasoning_effort": "none"}):
        r = client.chat.completions.create(**GREEDY, messages=FRANCE, extra_body=extra)
        msg: Any = r.choices[0].message
        assert getattr(msg, "reasoning_content", None) is None, (extra, msg)
        assert "Paris" in msg.content, (extra, msg)
        _clean(msg.content)
    raw = client.chat.completions.create(**GREEDY, messages=FRANCE,
                                         extra_body={"reasoning_format": "none"})
    text = raw.choices[0].message.content or ""
    assert "</think>" in text and getattr(raw.choices[0].message, "reasoning_content",
                                          None) is None
    with pytest.raises(openai.BadRequestError, match="enable_thinking"):
        client.chat.completions.create(**GREEDY, messages=FRANCE,
                                       extra_body={"chat_template_kwargs":
                                                   {"enable_thinking": "no"}})


def test_budget_16_closes_the_section_then_an_answer_follows(client: openai.OpenAI) -> None:
    """Unbounded, the reasoning runs past 40 tokens; its first 16 (max_tokens 16) are
    exactly the budgeted reply's reasoning, which is then closed and answered."""
    def reply(max_tokens: int, **extra: Any) -> Any:
        r = client.chat.completions.create(**{**GREEDY, "max_tokens": max_tokens},
                                           messages=CODE, extra_body=extra)
        return r, r.choices[0].message

    _, unbounded = reply(40)
    _, first16 = reply(16)
    assert not unbounded.content and len(unbounded.reasoning_content) > len(
        first16.reasoning_content)
    r, msg = reply(64, reasoning_budget_tokens=16)
    # the same 16 tokens, then the forced "\n</think>": its newline stays reasoning
    assert msg.reasoning_content.rstrip() == first16.reasoning_content.rstrip(), msg
    assert msg.content and msg.content.strip(), msg
    _clean(msg.reasoning_content, msg.content)
    assert r.usage is not None and r.usage.completion_tokens <= 64
    streamed = [c.choices[0].delta for c in client.chat.completions.create(
        **{**GREEDY, "max_tokens": 64}, messages=CODE, stream=True,
        extra_body={"reasoning_budget_tokens": 16}) if c.choices]
    assert "".join(getattr(d, "reasoning_content", None) or "" for d in streamed
                   ) == msg.reasoning_content
    assert "".join(d.content or "" for d in streamed) == msg.content


def test_ollama_think_whole_streamed_and_off(oclient: ollama.Client) -> None:
    opts = {"temperature": 0, "num_predict": 48}
    r = oclient.chat(model="thinker", messages=FRANCE, think=True, options=opts)
    assert "Paris" in (r.message.thinking or "") and "Paris" in (r.message.content or ""), r
    _clean(r.message.thinking, r.message.content)
    parts = list(oclient.chat(model="thinker", messages=FRANCE, think=True, options=opts,
                              stream=True))
    assert "".join(p.message.thinking or "" for p in parts) == r.message.thinking
    assert "".join(p.message.content or "" for p in parts) == r.message.content
    off = oclient.chat(model="thinker", messages=FRANCE, think=False, options=opts)
    assert not off.message.thinking and "Paris" in (off.message.content or "")
    g = oclient.generate(model="thinker", prompt="What is the capital of France?",
                         think=True, options=opts)
    assert "Paris" in (g.thinking or ""), g
    _clean(g.thinking, g.response)
    streamed = list(oclient.generate(model="thinker", prompt="What is the capital of France?",
                                     think=True, options=opts, stream=True))
    assert "".join(p.thinking or "" for p in streamed) == g.thinking


def test_ollama_think_refused_where_the_template_has_no_section(oclient: ollama.Client
                                                                ) -> None:
    with pytest.raises(ollama.ResponseError, match="does not support thinking") as err:
        oclient.chat(model="qwen", messages=FRANCE, think=True)
    assert err.value.status_code == 400
    with pytest.raises(ollama.ResponseError, match="invalid think value"):
        oclient.chat(model="thinker", messages=FRANCE, think="lots")


def test_responses_reasoning_item(client: openai.OpenAI) -> None:
    r = client.responses.create(model="thinker", input=FRANCE, temperature=0,
                                max_output_tokens=48)
    kinds = [o.type for o in r.output]
    assert kinds == ["reasoning", "message"], kinds
    reasoning: Any = r.output[0]
    assert "Paris" in reasoning.content[0].text and "Paris" in r.output_text
    with client.responses.stream(model="thinker", input=FRANCE, temperature=0,
                                 max_output_tokens=48) as stream:
        deltas = [e.delta for e in stream if e.type == "response.reasoning_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == reasoning.content[0].text
    assert final.output_text == r.output_text


GREEDY_QWEN: dict[str, Any] = {"model": "qwen", "temperature": 0, "max_tokens": 12}
ASK: Any = [{"role": "user", "content": "Is Paris in France? Answer."}]


def test_gbnf_grammar_regex_and_choice_constrain_the_output(client: openai.OpenAI) -> None:
    def said(extra: dict[str, Any], **kw: Any) -> str:
        r = client.chat.completions.create(**{**GREEDY_QWEN, **kw}, messages=ASK,
                                           extra_body=extra)
        return r.choices[0].message.content or ""

    assert said({"grammar": 'root ::= "maybe" | "perhaps"'}) in ("maybe", "perhaps")
    phone = said({"guided_regex": r"\d{3}-\d{4}"})
    assert re.fullmatch(r"\d{3}-\d{4}", phone), phone
    answer = said({"structured_outputs": {"regex": "(yes|no), [A-Z][a-z]+"}}, max_tokens=16)
    assert re.fullmatch("(yes|no), [A-Z][a-z]+", answer), answer
    assert said({"guided_choice": ["oui", "non"]}) in ("oui", "non")
    assert said({"structured_outputs": {"choice": ["alpha", "beta"]}}) in ("alpha", "beta")
    assert said({"guided_grammar": 'root ::= [0-9]{2}'}).isdigit()


def test_bad_constraints_are_400s_and_the_server_goes_on(client: openai.OpenAI) -> None:
    cases = [({"grammar": 'root ::= "a" | undefined-rule'}, "undefined rule"),
             ({"grammar": "root ::= root \"x\""}, "left recursion"),
             ({"grammar": 'start ::= "x"'}, "no 'root' rule"),
             ({"guided_regex": r"(a)\1"}, "backreferences"),
             ({"structured_outputs": {"regex": "(?=x)y"}}, "lookarounds"),
             ({"guided_regex": "[unclosed"}, "does not compile"),
             ({"guided_choice": []}, "list of 1 to"),
             ({"grammar": 'root ::= "a"', "guided_regex": "a"}, "not both")]
    for extra, why in cases:
        with pytest.raises(openai.BadRequestError, match=re.escape(why)):
            client.chat.completions.create(**GREEDY_QWEN, messages=ASK, extra_body=extra)
    r = client.completions.create(model="qwen", prompt="1, 2, 3,", max_tokens=4,
                                  temperature=0, extra_body={"guided_regex": " [0-9]"})
    assert re.fullmatch(" [0-9]", r.choices[0].text), r.choices[0].text
