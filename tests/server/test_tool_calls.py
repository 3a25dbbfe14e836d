"""Tool calls without a server: templates rendering tools, format detection, parsing of
realistic model replies (whole and streamed), forcing grammars, request validation."""

from __future__ import annotations

import json
import re

import pytest

from inferenceos.engine.chat_template import ChatMessage, ToolCall, render_chat
from inferenceos.errors import UsageError
from inferenceos.server.errors import APIError
from inferenceos.server.tool_calls import (
    HERMES,
    JSON_CALL,
    LLAMA3,
    MISTRAL,
    ParsedCall,
    ToolCallStream,
    detect_format,
    parse_tool_calls,
)
from inferenceos.server.tool_grammar import tool_call_grammar
from inferenceos.server.tools import parse_arguments, plan_tools, tool_request
from tiny_models import CHATML_TEMPLATE
from tool_templates import LLAMA31_TEMPLATE, QWEN25_TEMPLATE

WEATHER = {"type": "function", "function": {
    "name": "get_current_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {
        "location": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["location"]}}}
HISTORY = [
    ChatMessage("user", "Weather in Boston?"),
    ChatMessage("assistant", "", (ToolCall("get_current_weather", {"location": "Boston"},
                                           "call_1"),)),
    ChatMessage("tool", "22 C, sunny", tool_call_id="call_1"),
]


# -- templates ------------------------------------------------------------------------

def test_qwen_template_renders_tools_calls_and_results() -> None:
    text, used = render_chat(QWEN25_TEMPLATE, HISTORY, tools=[WEATHER])
    assert used == "gguf"
    assert "<tools>\n" + json.dumps(WEATHER) + "\n</tools>" in text  # HF's tojson: plain
    assert ('<tool_call>\n{"name": "get_current_weather", "arguments": '
            '{"location": "Boston"}}\n</tool_call>') in text
    assert "<tool_response>\n22 C, sunny\n</tool_response>" in text
    assert text.endswith("<|im_start|>assistant\n")


def test_explicit_tools_argument_and_no_tools() -> None:
    with_tools, _ = render_chat(QWEN25_TEMPLATE, HISTORY, tools=[WEATHER])
    assert "# Tools" in with_tools
    without, _ = render_chat(QWEN25_TEMPLATE, HISTORY)
    assert "# Tools" not in without and "<tool_call>" in without  # history still shown


def test_llama31_template_sees_tool_calls_key_and_tools() -> None:
    text, _ = render_chat(LLAMA31_TEMPLATE, HISTORY, bos_token="<s>", tools=[WEATHER])
    assert '{"name": "get_current_weather", "parameters": {"location": "Boston"}}' in text
    assert '"name": "get_current_weather"' in text.split("<|eot_id|>")[0]  # tools block
    plain, _ = render_chat(LLAMA31_TEMPLATE, [ChatMessage("user", "hi")])
    assert "Respond in the format" not in plain  # `tools is defined` reads false


def test_tools_need_the_files_template() -> None:
    with pytest.raises(UsageError, match="chat template"):
        render_chat(None, HISTORY, tools=[WEATHER])


# -- format detection -----------------------------------------------------------------

@pytest.mark.parametrize("template, fmt", [
    (QWEN25_TEMPLATE, HERMES),
    (LLAMA31_TEMPLATE, LLAMA3),
    ("{% if tools %}[AVAILABLE_TOOLS]{{ tools|tojson }}[/AVAILABLE_TOOLS]{% endif %}"
     "[TOOL_CALLS]", MISTRAL),
    ("{% if tools %}{{ tools|tojson }}{% endif %}{{ messages[0].content }}", JSON_CALL),
    (CHATML_TEMPLATE, None),
    (None, None),
])
def test_detect_format(template: str | None, fmt: object) -> None:
    assert detect_format(template) == fmt


# -- parsing realistic replies --------------------------------------------------------

@pytest.mark.parametrize("text, fmt, content, calls", [
    # Qwen 2.5: one block
    ('<tool_call>\n{"name": "get_current_weather", "arguments": {"location": "Boston, MA", '
     '"unit": "celsius"}}\n</tool_call>', HERMES, "",
     [("get_current_weather", {"location": "Boston, MA", "unit": "celsius"})]),
    # Hermes 2 Pro: text first, two parallel calls, arguments once as a JSON string
    ("Let me check both.\n<tool_call>\n{\"arguments\": {\"symbol\": \"TSLA\"}, \"name\": "
     "\"get_stock_price\"}\n</tool_call>\n<tool_call>\n{\"name\": \"get_stock_price\", "
     "\"arguments\": \"{\\\"symbol\\\": \\\"AAPL\\\"}\"}\n</tool_call>", HERMES,
     "Let me check both.",
     [("get_stock_price", {"symbol": "TSLA"}), ("get_stock_price", {"symbol": "AAPL"})]),
    # a reply cut before the closing tag still holds its call
    ('<tool_call>\n{"name": "f", "arguments": {}}', HERMES, "", [("f", {})]),
    # ... and one cut in the middle of a second call, its first whole call
    ('<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>\n<tool_call>\n{"name": ',
     HERMES, "", [("f", {})]),
    # Qwen dropping its tags: a bare JSON call
    ('{"name": "f", "arguments": {"x": 1}}', HERMES, "", [("f", {"x": 1})]),
    # Llama 3.1 with its python tag; Llama 3.2 with two calls separated by ';'
    ('<|python_tag|>{"name": "get_current_weather", "parameters": {"location": "Paris"}}',
     LLAMA3, "", [("get_current_weather", {"location": "Paris"})]),
    ('{"name": "a", "parameters": {}}; {"name": "b", "parameters": {"k": "v"}}', LLAMA3, "",
     [("a", {}), ("b", {"k": "v"})]),
    # Mistral Nemo, and the same with its control token not rendered
    ('[TOOL_CALLS][{"name": "get_current_weather", "arguments": {"location": "Paris"}, '
     '"id": "abcDEF123"}]', MISTRAL, "", [("get_current_weather", {"location": "Paris"})]),
    (' [{"name": "f", "arguments": {}}]', MISTRAL, "", [("f", {})]),
    # not calls: stays content
    ("The weather is nice.", HERMES, "The weather is nice.", []),
    ('{"temperature": 21}', JSON_CALL, '{"temperature": 21}', []),
    ("<tool_call>\n{not json}\n</tool_call>", HERMES, "<tool_call>\n{not json}\n</tool_call>", []),
    ('<tool_call>{"name": "f", "arguments": [1]}</tool_call>', HERMES,
     '<tool_call>{"name": "f", "arguments": [1]}</tool_call>', []),
])
def test_parse_realistic_replies(text: str, fmt: object, content: str,
                                 calls: list[tuple[str, dict]]) -> None:
    got_content, got = parse_tool_calls(text, fmt)  # type: ignore[arg-type]
    assert got_content == content
    assert got == [ParsedCall(n, a) for n, a in calls]


# -- streaming ------------------------------------------------------------------------

def _stream(pieces: list[str], fmt: object) -> tuple[list[str], str, list[ParsedCall]]:
    s = ToolCallStream(fmt)  # type: ignore[arg-type]
    shown = [s.feed(p) for p in pieces]
    rest, calls = s.finish()
    return shown, rest, calls


def test_stream_holds_back_from_the_marker() -> None:
    shown, rest, calls = _stream(["Sure", ", <to", "ol_call>\n{\"name\": \"f\", ",
                                  "\"arguments\": {}}\n</tool_call>"], HERMES)
    assert shown == ["Sure", ", ", "", ""] and rest == "" and calls == [ParsedCall("f", {})]


def test_stream_releases_a_false_alarm() -> None:
    shown, rest, calls = _stream(["a <", "b> c"], HERMES)
    assert "".join(shown) + rest == "a <b> c" and calls == []
    shown, rest, calls = _stream(["{\"temperature\"", ": 21}"], JSON_CALL)
    # released as soon as it cannot be a call, not at the end
    assert shown == ["", '{"temperature": 21}'] and rest == "" and calls == []


def test_stream_holds_a_bare_json_call() -> None:
    shown, rest, calls = _stream(["  ", "<|python", "_tag|>{\"name\": \"f\", ",
                                  "\"parameters\": {}}"], LLAMA3)
    assert "".join(shown) == "" and rest == "" and calls == [ParsedCall("f", {})]


# -- untagged calls naming a declared tool (bare or fenced JSON) ----------------------

BOUND = HERMES.bound([WEATHER["function"], {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}}])
PARIS = '{"name": "get_current_weather", "arguments": {"location": "Paris"}}'
TOKYO = '{"name": "get_time", "arguments": {"zone": "Asia/Tokyo"}}'


@pytest.mark.parametrize("text, content, calls", [
    # Qwen 2.5 Coder without its tags: a ```json fence, a bare fence, bare JSON
    (f"```json\n{PARIS}\n```", "", [("get_current_weather", {"location": "Paris"})]),
    (f"```\n{PARIS}\n```\n", "", [("get_current_weather", {"location": "Paris"})]),
    (f"  {PARIS}  ", "", [("get_current_weather", {"location": "Paris"})]),
    # text before the fence (or before a bare call on its own line) stays content
    (f"Let me check.\n```json\n{PARIS}\n```", "Let me check.",
     [("get_current_weather", {"location": "Paris"})]),
    (f"Let me check.\n{PARIS}", "Let me check.",
     [("get_current_weather", {"location": "Paris"})]),
    # a fence the model did not close before it stopped
    (f"```json\n{PARIS}", "", [("get_current_weather", {"location": "Paris"})]),
    # several calls: two fences, two lines, a list in one fence
    (f"```json\n{PARIS}\n```\n```json\n{TOKYO}\n```", "",
     [("get_current_weather", {"location": "Paris"}), ("get_time", {"zone": "Asia/Tokyo"})]),
    (f"{PARIS}\n{TOKYO}", "",
     [("get_current_weather", {"location": "Paris"}), ("get_time", {"zone": "Asia/Tokyo"})]),
    (f"```json\n[{PARIS}, {TOKYO}]\n```", "",
     [("get_current_weather", {"location": "Paris"}), ("get_time", {"zone": "Asia/Tokyo"})]),
])
def test_untagged_calls_to_declared_tools(text: str, content: str,
                                          calls: list[tuple[str, dict]]) -> None:
    assert parse_tool_calls(text, BOUND) == (content, [ParsedCall(n, a) for n, a in calls])


@pytest.mark.parametrize("text", [
    # a tool nobody declared
    '```json\n{"name": "get_stock_price", "arguments": {"symbol": "TSLA"}}\n```',
    '{"name": "get_stock_price", "arguments": {"symbol": "TSLA"}}',
    # arguments that do not fit: a required key missing, outside an enum, a wrong type
    '```json\n{"name": "get_current_weather", "arguments": {"city": "Paris"}}\n```',
    '{"name": "get_current_weather", "arguments": {"location": "Paris", "unit": "kelvin"}}',
    '{"name": "get_time", "arguments": {"zone": 3}}',
    # one call of two not fitting: none is taken
    f'{PARIS}\n{{"name": "get_time", "arguments": {{}}}}',
    # JSON that is not a call, a call in the middle of the reply, a code fence
    'Here is the data:\n```json\n{"location": "Paris"}\n```',
    f"```json\n{PARIS}\n```\nThat is how you would call it.",
    f"```python\nprint({PARIS!r})\n```",
    f"An example: {PARIS}",  # not at a line's start: prose quoting a call
])
def test_json_that_is_not_a_declared_call_stays_content(text: str) -> None:
    assert parse_tool_calls(text, BOUND) == (text, [])


def test_unbound_format_reads_only_the_whole_reply() -> None:
    """Without the request's tools, only a whole reply is read (any name, as before)."""
    assert parse_tool_calls(f"```json\n{PARIS}\n```", HERMES)[1] == [
        ParsedCall("get_current_weather", {"location": "Paris"})]
    assert parse_tool_calls(f"Sure.\n{PARIS}", HERMES)[1] == []
    assert parse_tool_calls(f"Sure.\n```json\n{PARIS}\n```", HERMES)[1] == []
    assert parse_tool_calls('{"name": "any", "arguments": {}}', HERMES)[1] == [
        ParsedCall("any", {})]


def test_tagged_calls_win_over_untagged_json() -> None:
    text = f"```json\n{TOKYO}\n```\n<tool_call>\n{PARIS}\n</tool_call>"
    content, calls = parse_tool_calls(text, BOUND)
    assert calls == [ParsedCall("get_current_weather", {"location": "Paris"})]
    assert content.startswith("```json")


def _chunks(text: str, size: int) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), size)]


STREAMED = [
    f"Let me check.\n```json\n{PARIS}\n```",
    f"```json\n{PARIS}\n```\n```json\n{TOKYO}\n```",
    f"{PARIS}\n{TOKYO}\n",
    f"```json\n{PARIS}\n```\nThat is how you would call it.",
    'Data:\n```json\n{"location": "Paris"}\n```\nand more.',
    "Code:\n```python\nx = {'a': 1}\n```\n",
    'Plain text with a {"name": "get_time"} inside, and ``` ticks `` here`',
    f"<tool_call>\n{PARIS}\n</tool_call>",
    f"I will.\n{PARIS}\nDone.",
    # long enough that a held candidate is only rescanned when a bracket closes
    '{"items": [' + ", ".join(f'{{"id": {i}}}' for i in range(20)) + "]}\nAfter.",
    'Sure.\n```json\n{"name": "get_current_weather", "arguments": {"location": "'
    + "Llanfair" * 20 + '"}}\n```',
]


@pytest.mark.parametrize("text", STREAMED)
@pytest.mark.parametrize("size", [1, 3, 7, 1000])
def test_stream_agrees_with_the_whole_parse(text: str, size: int) -> None:
    """However the reply is cut, the stream sends a prefix of the reply, never a call,
    and ends with what parsing the whole reply gives."""
    shown, rest, calls = _stream(_chunks(text, size), BOUND)
    content, whole = parse_tool_calls(text, BOUND)
    assert calls == whole
    sent = "".join(shown) + rest
    assert text.startswith(sent)
    assert (sent.strip() == content) if calls else (sent == text)


def test_stream_releases_what_cannot_be_a_call_early() -> None:
    pieces = ["Code:\n", "``", "`", "py", "thon\n", "x = 1\n", "```"]
    shown, _, _ = _stream(pieces, BOUND)
    assert shown[:4] == ["Code:\n", "", "", "```py"]  # released once "py" is not json
    pieces = ["```json\n", '{"location": ', '"Paris"}', "\n```", "\nMore."]
    shown, _, calls = _stream(pieces, BOUND)
    assert shown[:2] == ["", ""] and shown[2].endswith('"Paris"}') and calls == []


# -- grammar and requests -------------------------------------------------------------

def test_grammar_wraps_the_call_and_keeps_literals() -> None:
    fn = {"name": "f", "parameters": {"type": "object", "properties": {
        "root": {"enum": ["root"]}}, "required": ["root"]}}
    g = tool_call_grammar(HERMES, [fn])
    assert '"\\"root\\""' in g  # a property named "root" is not renamed
    assert [ln for ln in g.splitlines() if ln.startswith("root ")] == [
        'root ::= "<tool_call>\\n" tool-call "\\n</tool_call>"']
    assert tool_call_grammar(LLAMA3, [fn]).count('"\\"parameters\\""') == 1
    assert 'root ::= "[" tool-call ("," " "? tool-call)* "]"' in tool_call_grammar(
        MISTRAL, [fn], parallel=True)


def test_grammar_hoists_defs_of_each_function() -> None:
    fn = {"name": "f", "parameters": {"type": "object", "properties": {
        "p": {"$ref": "#/$defs/P"}}, "required": ["p"],
        "$defs": {"P": {"enum": ["x", "y"]}}}}
    assert '"\\"x\\""' in tool_call_grammar(HERMES, [fn, {"name": "g"}])


def test_plan_refuses_a_model_without_tools() -> None:
    req = tool_request([WEATHER], "auto", None)
    assert req is not None
    with pytest.raises(APIError, match="m does not support tools") as err:
        plan_tools(CHATML_TEMPLATE, req, "m")
    assert err.value.status == 400
    plan = plan_tools(QWEN25_TEMPLATE, req, "m")
    # auto: free text, but once "<tool_call>" appears the rest must be a valid call
    assert plan.format == HERMES and plan.grammar is not None
    assert plan.format.tools == (WEATHER["function"],)  # bound: JSON calls are checked
    [trigger] = plan.triggers
    match = re.fullmatch(trigger, 'Let me check.\n<tool_call>\n{"name": "x"')
    assert match and match.start(1) == len("Let me check.\n")
    assert re.fullmatch(trigger, "No call here.") is None


def test_tool_request_choices() -> None:
    assert tool_request([WEATHER], "none", None) is None
    assert tool_request([], "required", None) is None
    named = tool_request([WEATHER], {"type": "function",
                                     "function": {"name": "get_current_weather"}}, True)
    assert named and named.choice == "function" and named.parallel
    assert [f["name"] for f in named.functions()] == ["get_current_weather"]
    with pytest.raises(APIError, match="not in tools"):
        tool_request([WEATHER], {"type": "function", "function": {"name": "x"}}, None)


def test_parse_arguments() -> None:
    assert parse_arguments('{"a": 1}') == {"a": 1}
    assert parse_arguments({"a": 1}) == {"a": 1}
    assert parse_arguments("") == {} and parse_arguments(None) == {}
    for bad in ("[1]", "{oops"):
        with pytest.raises(APIError):
            parse_arguments(bad)
