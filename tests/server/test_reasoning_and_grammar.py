"""The pieces under reasoning and constrained output, without a model: the thinking
choice applied to a rendered prompt, the budget's token count, tool calls read after
reasoning, the GBNF checker (against llama.cpp's own grammars, and what it refuses), the
regex and choice converters (the grammar they write accepts what the regex matches:
checked by matching the grammar's language with Python's `re` on samples), and the
chat template's kwargs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from inferenceos.engine.chat_template import ChatMessage, render_chat
from inferenceos.engine.generation import TokenEvent
from inferenceos.server.errors import APIError
from inferenceos.server.gbnf import GrammarError, check_gbnf
from inferenceos.server.json_grammar import JSON_OBJECT_GBNF, structured_grammar
from inferenceos.server.reasoning import Reasoning, Think, prepare_prompt
from inferenceos.server.reasoning_budget import BudgetWatch
from inferenceos.server.regex_gbnf import choice_gbnf, regex_gbnf
from inferenceos.server.reply import ReplyText, read_reply
from inferenceos.server.tool_calls import HERMES
from thinking_model import THINKING_TEMPLATE

OPENS = "<|im_start|>assistant\n<think>\n"
SELF = "{% if x %}<think>{% endif %}"  # a template whose model opens the section itself


def test_thinking_off_closes_the_section_the_way_the_template_allows() -> None:
    off = Think(enabled=False)
    assert prepare_prompt(THINKING_TEMPLATE, OPENS, off) == (
        OPENS.rstrip() + "\n\n</think>\n\n", Reasoning(False))
    assert prepare_prompt(SELF, "A:", off) == ("A:<think>\n\n</think>\n\n", Reasoning(False))
    closed = "A:<think>\n\n</think>\n\n"  # the template closed it itself (enable_thinking)
    assert prepare_prompt(SELF, closed, Think(budget=0))[0] == closed
    assert prepare_prompt(THINKING_TEMPLATE, OPENS, Think()) == (OPENS, Reasoning(True))
    assert prepare_prompt(THINKING_TEMPLATE, OPENS, Think(split=False)) == (OPENS, None)
    assert prepare_prompt("{{ x }}", "A:", Think(enabled=True)) == ("A:", None)
    with pytest.raises(APIError, match="does not support thinking"):
        prepare_prompt("{{ x }}", "A:", Think(enabled=True, required=True), "m")


def test_template_kwargs_reach_the_template() -> None:
    msgs = [ChatMessage("user", "hi")]
    on, _ = render_chat(THINKING_TEMPLATE, msgs)
    off, _ = render_chat(THINKING_TEMPLATE, msgs,
                         kwargs=Think(enabled=False).template_kwargs())
    assert on.endswith("<think>\n") and off.endswith("<think>\n\n</think>\n\n")
    assert Think(effort="high").template_kwargs() == {"reasoning_effort": "high"}
    assert Think(budget=0, effort="high").template_kwargs() == {"enable_thinking": False}
    assert Think().with_default_budget(16).budget == 16
    assert Think(budget=-1).with_default_budget(16).budget == -1


def test_budget_watch_counts_tokens_inside_the_section() -> None:
    watch = BudgetWatch(Reasoning(False), 3)
    fed = [watch.feed(TokenEvent(i, t)) for i, t in enumerate(
        ["<think>", "a", "b", "c", "d"])]
    assert fed == [False, False, False, True, True] and watch.spent == 4
    closed = BudgetWatch(Reasoning(True), 2)
    assert [closed.feed(TokenEvent(i, t)) for i, t in enumerate(["a", "</think>", "x", "y"])
            ] == [False, False, False, False]


def test_tool_calls_after_reasoning_are_parsed_whole_and_streamed() -> None:
    reply = ('Weather needs a tool.\n</think>\n\n<tool_call>\n{"name": "get_weather", '
             '"arguments": {"city": "Berlin"}}\n</tool_call>')
    thought, text, calls = read_reply(reply, HERMES, Reasoning(True))
    assert thought == "Weather needs a tool.\n" and text == ""
    assert [(c.name, c.arguments) for c in calls] == [("get_weather", {"city": "Berlin"})]
    stream = ReplyText(HERMES, Reasoning(True))
    pieces = [stream.feed(reply[i:i + 7]) for i in range(0, len(reply), 7)]
    rest_thought, rest, streamed = stream.finish()
    assert "".join(t for t, _ in pieces) + rest_thought == thought
    assert "".join(s for _, s in pieces) + rest == ""
    assert [(c.name, c.arguments) for c in streamed] == [("get_weather", {"city": "Berlin"})]


LLAMA_GRAMMARS = (Path.home() / ".cache/inferenceos/llama-tools/0.3.36/"
                  "llama_cpp_python-0.3.36/vendor/llama.cpp/grammars")


def test_gbnf_checker_takes_llama_cpps_own_grammars() -> None:
    check_gbnf(JSON_OBJECT_GBNF)
    check_gbnf('root ::=\n  "{" (\n    "a" # comment\n  | "b" )? "}"\nx ::= "\\u00e9"{1,3}')
    for path in sorted(LLAMA_GRAMMARS.glob("*.gbnf")):  # where the sources were built
        check_gbnf(path.read_text())


@pytest.mark.parametrize("grammar, why", [
    ('root ::= "a', "end of input"),
    ("root ::= other", "undefined rule 'other'"),
    ('start ::= "x"', "no 'root' rule"),
    ('root ::= root "x"', "left recursion (root -> root)"),
    ('root ::= a\na ::= b "x"\nb ::= a', "left recursion"),
    ('root ::= ("x"?)*', "empty string"),
    ('root ::= "x"{2001}', "more than 2000"),
    ('root ::= "x"{3,2}', "below the minimum"),
    ('root ::= "\\q"', "unknown escape"),
    ("root ::= *", "follows nothing"),
    ('root ::= "a" )', "end of the rule"),
    ("root ::= " + "(" * 100 + '"a"' + ")" * 100, "nested deeper"),
    ("   ", "empty"),
])
def test_gbnf_checker_refuses_with_a_reason(grammar: str, why: str) -> None:
    with pytest.raises(GrammarError, match=re.escape(why)):
        check_gbnf(grammar)


def _language(grammar: str) -> re.Pattern[str]:
    """The converter's GBNF read back as a Python regex (its subset only)."""
    body = grammar.removeprefix("root ::= ").strip()
    body = re.sub(r'"((?:[^"\\]|\\.)*)"', lambda m: "(?:" + "".join(
        f"\\x{ord(c):02x}" if c == " " else re.escape(c)
        for c in m.group(1).encode().decode("unicode_escape")) + ")", body)
    return re.compile(body.replace(" ", ""))


@pytest.mark.parametrize("pattern, good, bad", [
    (r"\d{3}-\d{4}", ["555-1234"], ["5551234", "55-1234"]),
    (r"^(yes|no)$", ["yes", "no"], ["yesno", "maybe"]),
    (r"[A-Z][a-z]+( [A-Z][a-z]+)*", ["New York", "Paris"], ["new york", "Paris "]),
    (r"(?:ab|cd){2,}", ["abcd", "cdcdab"], ["ab"]),
    (r"\w+@\w+\.com", ["a_b@c.com"], ["a@c-com"]),
    (r"[^\]\-x]+", ["abc"], ["a]b", "x"]),
    (r"x{,3}", ["", "xxx"], ["xxxx"]),
    (r"a.c", ["abc", "a-c"], ["a\nc"]),
])
def test_regex_converter_keeps_the_language(pattern: str, good: list[str],
                                            bad: list[str]) -> None:
    grammar = regex_gbnf(pattern)
    check_gbnf(grammar)
    lang = _language(grammar)
    for s in good:
        assert lang.fullmatch(s) and re.fullmatch(pattern, s), (s, grammar)
    for s in bad:
        assert not lang.fullmatch(s) and not re.fullmatch(pattern, s), (s, grammar)


@pytest.mark.parametrize("pattern, why", [
    (r"(a)\1", "backreferences"), (r"(?=a)b", "lookarounds"), (r"a*?", "lazy"),
    (r"\bword", "\\b is not supported"), (r"a^b", "anchor"), (r"(a?)*", "empty string"),
    ("(", "does not compile"), (r"[z-a]", "does not compile"), (r"\p{L}", "does not compile"),
    ("[[:alpha:]]", "POSIX"),
])
def test_regex_converter_refuses_the_rest(pattern: str, why: str) -> None:
    with pytest.raises(GrammarError, match=re.escape(why)):
        regex_gbnf(pattern)


def test_choice_and_structured_outputs() -> None:
    assert choice_gbnf(["red", 'say "hi"', "red"]) == 'root ::= "red" | "say \\x22hi\\x22"\n'
    with pytest.raises(GrammarError):
        choice_gbnf([])
    assert structured_grammar({"choice": ["a"], "disable_fallback": True}) == 'root ::= "a"\n'
    assert structured_grammar({"json_object": True}) == JSON_OBJECT_GBNF
    assert structured_grammar({}) is None
    for spec, why in (({"regex": "a", "choice": ["a"]}, "not several"),
                      ({"structural_tag": {}}, "structural_tag"),
                      ({"grammar": "root ::= x"}, "structured_outputs.grammar"),
                      ({"json": "{not json"}, "JSON schema")):
        with pytest.raises(APIError, match=re.escape(why)) as err:
            structured_grammar(spec)
        assert err.value.status == 400
