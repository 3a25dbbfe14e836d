"""llama-server's API dialect on a live server (tiny llama with a ChatML template):
/completion and its fields and shapes, /tokenize, /detokenize, /props, /slots, the
OpenAI routes without /v1 (the real openai client), llama.cpp's grammar and schema
extensions in OpenAI bodies, any_model, and the safety rules on the new routes."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from inferenceos.server.settings import ServerSettings
from server_harness import Harness, serving

GREEDY = {"temperature": 0, "n_predict": 6}


@pytest.fixture(scope="module")
def server(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    root = tmp_path_factory.mktemp("server-llamacpp")
    with serving({"tiny": tiny_llama}, root, settings=ServerSettings(any_model=True)) as h:
        yield h


@pytest.fixture
def http(server: Harness) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


def _sse(http: httpx.Client, path: str, body: dict[str, Any]) -> tuple[list[dict[str, Any]],
                                                                       list[str]]:
    with http.stream("POST", path, json=body) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [ln for ln in r.iter_lines() if ln]
    return [json.loads(ln[6:]) for ln in lines if ln.startswith("data: {")], lines


# -- /completion -----------------------------------------------------------------------


def test_completion_shape(http: httpx.Client) -> None:
    r = http.post("/completion", json={"prompt": "ab", **GREEDY, "return_tokens": True})
    assert r.status_code == 200
    b = r.json()
    assert b["stop"] is True and b["stop_type"] in ("limit", "eos")
    assert b["tokens_predicted"] == b["timings"]["predicted_n"] == len(b["tokens"]) <= 6
    assert b["tokens_evaluated"] == 4  # <s> ▁ a b
    assert b["timings"]["prompt_n"] + b["timings"]["cache_n"] == 4
    assert b["prompt"] == "<s> ab" and b["model"] == "tiny"
    assert isinstance(b["has_new_line"], bool) and b["truncated"] is False
    gs = b["generation_settings"]
    assert gs["n_predict"] == 6 and gs["temperature"] == 0 and gs["seed"] == 0xFFFFFFFF
    # without return_tokens the ids are not sent
    again = http.post("/completion", json={"prompt": "ab", **GREEDY}).json()
    assert again["tokens"] == [] and again["content"] == b["content"]


def test_completions_alias_is_the_llama_dialect(http: httpx.Client) -> None:
    a = http.post("/completion", json={"prompt": "ab", **GREEDY}).json()
    b = http.post("/completions", json={"prompt": "ab", **GREEDY}).json()
    assert b["content"] == a["content"] and "choices" not in b


def test_token_and_mixed_prompts(http: httpx.Client) -> None:
    ids = http.post("/tokenize", json={"content": "ab", "add_special": True}).json()["tokens"]
    assert ids[0] == 1  # BOS
    text = http.post("/completion", json={"prompt": "ab", **GREEDY}).json()["content"]
    assert http.post("/completion", json={"prompt": ids, **GREEDY}).json()["content"] == text
    pair = http.post("/completion", json={"prompt": [ids, "ab"], **GREEDY}).json()
    assert isinstance(pair, list) and [p["index"] for p in pair] == [0, 1]
    assert pair[0]["content"] == pair[1]["content"] == text
    obj = http.post("/completion", json={"prompt": {"prompt_string": "ab"}, **GREEDY}).json()
    assert obj["content"] == text
    # ids and text in one sequence: the text after the ids is tokenized without a BOS
    mixed = http.post("/completion", json={"prompt": [1, "ab"], **GREEDY}).json()
    assert mixed["content"] == text and mixed["tokens_evaluated"] == 4


@pytest.mark.parametrize("prompt", [[], [99999], [[1, 2], 5.5], {"x": 1}, None])
def test_bad_prompts_are_400(http: httpx.Client, prompt: Any) -> None:
    r = http.post("/completion", json={"prompt": prompt, "n_predict": 1})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


def test_completion_stream(http: httpx.Client) -> None:
    whole = http.post("/completion", json={"prompt": "ab", **GREEDY}).json()
    events, lines = _sse(http, "/completion", {"prompt": "ab", **GREEDY, "stream": True})
    assert "data: [DONE]" not in lines  # llama-server ends /completion streams silently
    *chunks, last = events
    assert all(c["stop"] is False for c in chunks) and last["stop"] is True
    assert all(len(c["tokens"]) == 1 for c in chunks if c["content"])
    assert "".join(c["content"] for c in chunks) == whole["content"]
    assert last["content"] == "" and last["timings"]["predicted_n"] == len(chunks)
    assert last["generation_settings"]["stream"] is True


def test_n_probs(http: httpx.Client) -> None:
    b = http.post("/completion", json={"prompt": "ab", **GREEDY, "n_probs": 3}).json()
    probs = b["completion_probabilities"]
    assert len(probs) == b["tokens_predicted"]
    for tok in probs:
        assert tok["logprob"] <= 0 and isinstance(tok["bytes"], list)
        assert len(tok["top_logprobs"]) == 3
        assert tok["top_logprobs"][0]["logprob"] >= tok["top_logprobs"][-1]["logprob"]
    # greedy: the chosen token is the most likely one
    assert all(t["id"] == t["top_logprobs"][0]["id"] for t in probs)
    post = http.post("/completion", json={"prompt": "ab", **GREEDY, "n_probs": 3,
                                           "post_sampling_probs": True}).json()
    for tok in post["completion_probabilities"]:
        assert 0 < tok["prob"] <= 1 and all(0 < t["prob"] <= 1 for t in tok["top_probs"])
    events, _ = _sse(http, "/completion", {"prompt": "ab", **GREEDY, "n_probs": 2,
                                           "stream": True})
    assert all(len(e["completion_probabilities"]) == 1 for e in events if not e["stop"])


def test_logit_bias_forms(http: httpx.Client) -> None:
    base = http.post("/completion", json={"prompt": "ab", **GREEDY,
                                           "return_tokens": True}).json()
    first = base["tokens"][0]
    for bias in ([[first, False]], [[first, -1e9]], {str(first): False}):
        b = http.post("/completion", json={"prompt": "ab", **GREEDY, "return_tokens": True,
                                           "logit_bias": bias}).json()
        assert first not in b["tokens"], bias
    # text keys: every token of the text is biased; "a" pushed up makes the output "a"s
    b = http.post("/completion", json={"prompt": "ab", **GREEDY, "logit_bias": [["a", 100]]})
    assert b.json()["content"] == "a" * 6


def test_grammar_and_json_schema(http: httpx.Client) -> None:
    g = http.post("/completion", json={"prompt": "ab", "n_predict": 8,
                                       "grammar": 'root ::= "a"{3} "b"'}).json()
    assert g["content"] == "aaab" and g["stop_type"] == "eos"
    s = http.post("/completion", json={"prompt": "ab", "n_predict": 12,
                                       "json_schema": {"const": "ab"}}).json()
    assert json.loads(s["content"]) == "ab"
    for bad in ({"grammar": "root ::= (unclosed"}, {"json_schema": {"type": "hiccup"}},
                {"json_schema": 123}):
        r = http.post("/completion", json={"prompt": "ab", **bad})
        assert r.status_code == 400 and "error" in r.json(), bad


def test_sampling_fields_and_refusals(http: httpx.Client) -> None:
    same = [http.post("/completion", json={"prompt": "ab", "n_predict": 8, "seed": 7,
                                            "temperature": 1.0}).json()["content"]
            for _ in range(2)]
    assert same[0] == same[1]
    stop = http.post("/completion", json={"prompt": "ab", "n_predict": 8,
                                          "grammar": 'root ::= "aaab"', "stop": ["ab"]})
    b = stop.json()
    assert b["content"] == "aa" and b["stop_type"] == "word" and b["stopping_word"] == "ab"
    r = http.post("/completion", json={"prompt": "ab", "mirostat": 2})
    assert r.status_code == 400 and "mirostat" in r.json()["error"]["message"]
    assert http.post("/completion", json={"prompt": "ab", "mirostat": 0,
                                          "n_predict": 1}).status_code == 200
    r = http.post("/completion", json={"prompt": "ab", "top_k": "many"})
    assert r.status_code == 400


def test_ignore_eos_response_fields_and_n_cmpl(http: httpx.Client) -> None:
    b = http.post("/completion", json={"prompt": "ab", **GREEDY, "ignore_eos": True}).json()
    bias = b["generation_settings"]["logit_bias"]
    assert bias and all(e["bias"] is None for e in bias)  # EOG tokens at -inf
    assert b["tokens_predicted"] == 6
    f = http.post("/completion", json={"prompt": "ab", **GREEDY, "response_fields": [
        "content", "generation_settings/n_predict", "nope"]}).json()
    assert set(f) == {"content", "generation_settings/n_predict"}
    assert f["generation_settings/n_predict"] == 6
    many = http.post("/completion", json={"prompt": "ab", "n_predict": 3, "n_cmpl": 2,
                                          "seed": 1}).json()
    assert isinstance(many, list) and len(many) == 2


def test_prompt_too_long(http: httpx.Client) -> None:
    r = http.post("/completion", json={"prompt": "ab " * 200})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["type"] == "exceed_context_size_error"
    assert err["n_ctx"] == 256 and err["n_prompt_tokens"] > 256


# -- tokens, props, slots, health ------------------------------------------------------


def test_tokenize_detokenize(http: httpx.Client) -> None:
    toks = http.post("/tokenize", json={"content": "ab c"}).json()["tokens"]
    assert toks and toks[0] != 1  # add_special is off by default, as llama-server
    assert http.post("/detokenize", json={"tokens": toks}).json()["content"].strip() == "ab c"
    pieces = http.post("/tokenize", json={"content": "ab", "with_pieces": True}).json()
    assert [p["piece"] for p in pieces["tokens"]] == [" ", "a", "b"]
    # a byte token that is not whole UTF-8 comes as its byte values
    byte = http.post("/tokenize", json={"content": "é", "with_pieces": True}).json()
    assert any(isinstance(p["piece"], list) for p in byte["tokens"])
    assert http.post("/tokenize", json={}).json() == {"tokens": []}
    assert http.post("/detokenize", json={"tokens": [10**6]}).status_code == 400
    assert http.post("/detokenize", json={"tokens": "ab"}).status_code == 400


def test_props_slots_health(http: httpx.Client, server: Harness) -> None:
    http.post("/completion", json={"prompt": "ab", "n_predict": 1})  # loaded
    p = http.get("/props").json()
    assert p["total_slots"] == server.manager.slots
    assert p["default_generation_settings"]["n_ctx"] == 256
    assert p["model_path"].endswith(".gguf") and p["bos_token"] == "<s>"
    slots = http.get("/slots").json()
    assert len(slots) == server.manager.slots
    assert all(s["n_ctx"] == 256 and s["is_processing"] is False for s in slots)
    assert "prompt" not in slots[0]  # read-only and without request text
    for path in ("/health", "/v1/health"):
        h = http.get(path)
        assert h.status_code == 200 and h.json()["status"] == "ok"


def test_apply_template_and_input_tokens(http: httpx.Client) -> None:
    msgs = [{"role": "user", "content": "hi"}]
    prompt = http.post("/apply-template", json={"messages": msgs}).json()["prompt"]
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    n = http.post("/chat/completions/input_tokens", json={"messages": msgs}).json()
    assert n["input_tokens"] == len(http.post("/tokenize", json={
        "content": prompt, "add_special": True}).json()["tokens"])


# -- OpenAI without /v1, extensions, any_model ------------------------------------------


@pytest.fixture
def bare(server: Harness) -> openai.OpenAI:
    """The openai client pointed at the server root, as many llama-server users do."""
    return openai.OpenAI(base_url=server.url, api_key="x", max_retries=0, timeout=60)


def test_openai_routes_without_v1(bare: openai.OpenAI) -> None:
    r = bare.chat.completions.create(model="gpt-4o", max_tokens=4, temperature=0,
                                     messages=[{"role": "user", "content": "hi"}])
    assert r.choices[0].message.role == "assistant" and r.usage.completion_tokens <= 4
    assert r.system_fingerprint and r.system_fingerprint.startswith("b")
    assert (r.model_extra or {})["timings"]["predicted_n"] == r.usage.completion_tokens
    listed = bare.models.list().data
    assert [m.id for m in listed] == ["tiny"]  # llama-server spells it so
    # llama-server's fields: every name that reaches the model, and its (no) tags
    assert (listed[0].model_extra or {})["aliases"] == ["tiny", "tiny:latest"]
    assert (listed[0].model_extra or {})["tags"] == []
    emb = bare.embeddings.create(model="whatever", input=["ab", "ba"])
    assert len(emb.data) == 2 and len(emb.data[0].embedding) == 64


def test_chat_stream_first_delta_and_usage_timings(server: Harness) -> None:
    client = openai.OpenAI(base_url=server.v1, api_key="x", max_retries=0, timeout=60)
    chunks = list(client.chat.completions.create(
        model="tiny", max_tokens=4, stream=True, stream_options={"include_usage": True},
        messages=[{"role": "user", "content": "hi"}]))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[0].choices[0].delta.content is None
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert (chunks[-1].model_extra or {})["timings"]["predicted_n"] == \
        chunks[-1].usage.completion_tokens


@pytest.mark.parametrize("extra,check", [
    ({"grammar": 'root ::= "a"{3}'}, lambda t: t == "aaa"),
    ({"json_schema": {"const": "ab"}}, lambda t: json.loads(t) == "ab"),
    ({"response_format": {"type": "json_object", "schema": {"const": "ba"}}},
     lambda t: json.loads(t) == "ba"),
])
def test_chat_extensions_constrain(server: Harness, extra: dict[str, Any], check: Any) -> None:
    client = openai.OpenAI(base_url=server.v1, api_key="x", max_retries=0, timeout=60)
    r = client.chat.completions.create(model="tiny", max_tokens=10, extra_body=extra,
                                       messages=[{"role": "user", "content": "hi"}])
    assert check(r.choices[0].message.content)


@pytest.mark.parametrize("extra", [
    {"grammar": "root ::= (unclosed"},
    {"json_schema": {"type": "hiccup"}},
    {"response_format": {"type": "json_object", "schema": 123}},
    {"response_format": {"type": "json_object", "schema": {"type": 123}}},
    {"response_format": {"type": "sound"}},
    {"grammar": 'root ::= "a"', "json_schema": {"const": "a"}},
])
def test_bad_extensions_are_400(server: Harness, extra: dict[str, Any]) -> None:
    client = openai.OpenAI(base_url=server.v1, api_key="x", max_retries=0, timeout=60)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="tiny", max_tokens=2, extra_body=extra,
                                       messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="tiny", prompt="ab", max_tokens=2, extra_body=extra)


def test_legacy_completions_take_a_grammar(server: Harness) -> None:
    client = openai.OpenAI(base_url=server.v1, api_key="x", max_retries=0, timeout=60)
    r = client.completions.create(model="davinci-002", prompt="ab", max_tokens=8,
                                  extra_body={"grammar": 'root ::= "b"{2}'})
    assert r.choices[0].text == "bb" and r.system_fingerprint.startswith("b")


def test_context_exceeded_on_chat_is_llama_shaped(http: httpx.Client) -> None:
    r = http.post("/chat/completions", json={"messages": [
        {"role": "user", "content": "ab " * 200}]})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["type"] == "exceed_context_size_error" and err["n_ctx"] == 256


def test_unknown_model_names(tiny_llama: Path, tmp_path: Path, server: Harness) -> None:
    # any_model on (the module's server): any name reaches the default
    with httpx.Client(base_url=server.url, timeout=60) as c:
        r = c.post("/v1/chat/completions", json={"model": "gpt-3.5-turbo", "max_tokens": 1,
                                                 "messages": [{"role": "user", "content": "a"}]})
        assert r.status_code == 200
    # off (the default): an unknown name is a 404, on every dialect
    with serving({"tiny": tiny_llama}, tmp_path) as h, \
            httpx.Client(base_url=h.url, timeout=60) as c:
        r = c.post("/v1/chat/completions", json={"model": "gpt-3.5-turbo", "max_tokens": 1,
                                                 "messages": [{"role": "user", "content": "a"}]})
        assert r.status_code == 404
        assert c.post("/completion", json={"model": "nope", "prompt": "a"}).status_code == 404
        assert c.post("/completion", json={"prompt": "a", "n_predict": 1}).status_code == 200


# -- safety rules ----------------------------------------------------------------------


def test_api_key_host_and_body_limit(tiny_llama: Path, tmp_path: Path) -> None:
    settings = ServerSettings(api_key="k3y", max_body_bytes=4096)
    with serving({"tiny": tiny_llama}, tmp_path, settings=settings) as h, \
            httpx.Client(base_url=h.url, timeout=60) as c:
        for method, path in (("POST", "/completion"), ("POST", "/completions"),
                             ("POST", "/tokenize"), ("POST", "/detokenize"),
                             ("GET", "/props"), ("GET", "/slots"),
                             ("POST", "/chat/completions"), ("GET", "/models")):
            r = c.request(method, path, json={"prompt": "a"})
            assert r.status_code == 401, path
            assert r.json()["error"]["type"] == "authentication_error", path
        assert c.get("/v1/health").status_code == 200  # public, as /health
        key = {"Authorization": "Bearer k3y"}
        assert c.post("/tokenize", json={"content": "a"}, headers=key).status_code == 200
        assert c.post("/tokenize", json={"content": "a"},
                      headers={"X-Api-Key": "k3y"}).status_code == 200
        r = c.post("/completion", json={"prompt": "a" * 5000}, headers=key)
        assert r.status_code == 413
        r = c.post("/completion", json={"prompt": "a"},
                   headers={**key, "Host": "evil.example"})
        assert r.status_code == 403


def test_server_defaults(tiny_llama: Path, tmp_path: Path) -> None:
    """ServerSettings.n_predict and .seed are llama-server's --n-predict and --seed: the
    defaults when a request sets none; a request's own value wins."""
    settings = ServerSettings(n_predict=3, seed=42)
    with serving({"tiny": tiny_llama}, tmp_path, settings=settings) as h, \
            httpx.Client(base_url=h.url, timeout=60) as c:
        body = {"prompt": "ab", "temperature": 0, "ignore_eos": True}
        b = c.post("/completion", json=body).json()
        assert b["tokens_predicted"] == 3 and b["generation_settings"]["n_predict"] == 3
        b = c.post("/completion", json={**body, "n_predict": 5}).json()
        assert b["tokens_predicted"] == 5 and b["stop_type"] == "limit"
        hot = {"prompt": "ab", "temperature": 1.5, "top_k": 0, "top_p": 1, "min_p": 0,
               "n_predict": 12}
        runs = [c.post("/completion", json=hot).json() for _ in range(2)]
        assert runs[0]["generation_settings"]["seed"] == 42
        assert runs[0]["content"] == runs[1]["content"]  # the server's seed, both times
        assert c.post("/completion", json={**hot, "seed": -1}).json()[
            "generation_settings"]["seed"] == 0xFFFFFFFF
        props = c.get("/props").json()["default_generation_settings"]["params"]
        assert props["seed"] == 42 and props["n_predict"] == 3
        chat = c.post("/v1/chat/completions", json={"messages": [
            {"role": "user", "content": "ab"}], "temperature": 0}).json()  # no max_tokens
        assert chat["usage"]["completion_tokens"] <= 3


def test_chat_verbose_and_continuation_fields(http: httpx.Client) -> None:
    msgs = [{"role": "user", "content": "hi"}]
    b = http.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 2,
                                                 "verbose": True}).json()
    assert b["__verbose"]["prompt"].endswith("<|im_start|>assistant\n")
    assert b["__verbose"]["content"] == b["choices"][0]["message"]["content"]
    plain = http.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 2}).json()
    assert "__verbose" not in plain
    # continuing the last assistant message is not supported: refused, never ignored
    for extra in ({"continue_final_message": True}, {"add_generation_prompt": False},
                  {"continue_final_message": True, "add_generation_prompt": True}):
        r = http.post("/chat/completions", json={"messages": msgs, "max_tokens": 2, **extra})
        assert r.status_code == 400, extra


def test_two_assistant_messages_at_the_end_are_400(server: Harness) -> None:
    """llama-server's rule: the last assistant message would be the reply's prefix, so
    two at the end cannot both be; one (a past reply) is fine."""
    client = openai.OpenAI(base_url=server.url, api_key="x", max_retries=0, timeout=60)
    turns: list[Any] = [{"role": "user", "content": "test"},
                        {"role": "assistant", "content": "test"}]
    with pytest.raises(openai.BadRequestError, match="2 or more assistant messages"):
        client.chat.completions.create(model="tiny", max_tokens=2, messages=[
            *turns, {"role": "assistant", "content": "test"}])
    r = client.chat.completions.create(model="tiny", max_tokens=2, messages=turns)
    assert r.choices[0].finish_reason == "length"


def test_cors_header_names_as_llama_server_sends_them(http: httpx.Client) -> None:
    """Some clients read CORS headers case-sensitively (llama.cpp's own tests do)."""
    r = http.options("/completions", headers={
        "Origin": "http://localhost:8080", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "Authorization"})
    raw = dict(r.headers.raw)
    assert raw[b"Access-Control-Allow-Origin"] == b"http://localhost:8080"
    r = http.options("/completions", headers={
        "Origin": "http://evil.example", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "Authorization"})
    # refused as llama-server refuses: 200, but nothing granted (the browser stops there)
    assert r.status_code == 200
    assert not [k for k in r.headers if k.lower().startswith("access-control-allow")]
    # a refused preflight still refuses the request itself its CORS header
    r = http.post("/tokenize", json={"content": "a"}, headers={"Origin": "http://evil.example"})
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers


def test_embedding_input_objects(bare: openai.OpenAI, http: httpx.Client) -> None:
    """llama.cpp's embedding input forms: text objects, token ids, ids mixed with text."""
    plain = bare.embeddings.create(model="x", input=["hello world"]).data[0].embedding
    r = http.post("/v1/embeddings", json={"input": [
        {"prompt_string": "hello world"},
        {"content": [{"type": "text", "text": "hello "}, {"type": "text", "text": "world"}]},
    ]})
    assert r.status_code == 200
    assert all(d["embedding"] == pytest.approx(plain, abs=1e-5) for d in r.json()["data"])
    # token ids, and ids mixed with text, as llama.cpp reads them
    ids = http.post("/tokenize", json={"content": "hello world", "add_special": True}).json()
    for same in (ids["tokens"], [ids["tokens"]], [ids["tokens"][0], "hello world"]):
        r = http.post("/v1/embeddings", json={"input": same})
        assert r.status_code == 200, same
        assert r.json()["data"][0]["embedding"] == pytest.approx(plain, abs=1e-5)
    assert len(http.post("/v1/embeddings", json={"input": [[1, 260], "ab", [261]]}).json()[
        "data"]) == 3
    assert http.post("/v1/embeddings", json={"input": ""}).status_code == 200  # BOS alone
    for bad in ([10**6], [[]], {"content": "text"}, {"content": [{"type": "image_url"}]},
                ["a", {"content": [{"type": "unknown"}]}], []):
        assert http.post("/v1/embeddings", json={"input": bad}).status_code == 400, bad
    r = http.post("/embeddings", json={"input": "ab " * 400})
    assert r.status_code == 400 and "too large" in r.json()["error"]["message"]


def test_null_model_is_the_default(http: httpx.Client) -> None:
    """llama.cpp's own tests send `"model": null`; llama-server serves its model."""
    for path, body in (("/chat/completions", {"messages": [{"role": "user", "content": "a"}]}),
                       ("/v1/completions", {"prompt": "ab"})):
        r = http.post(path, json={"model": None, "max_tokens": 2, **body})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 2
    r = http.post("/chat/completions", json={"model": 7, "messages": [
        {"role": "user", "content": "a"}]})
    assert r.status_code == 400  # not a name at all: still refused


def _progress_checks(progress: list[dict[str, Any]]) -> int:
    """llama-server's rules (tools/server/tests: test_return_progress); the tokens the
    cache held."""
    assert len(progress) >= 2
    first, last = progress[0], progress[-1]
    assert first["total"] > 0 and first["cache"] == first["processed"]
    for a, b in itertools.pairwise(progress):
        assert b["total"] == a["total"] and b["cache"] == a["cache"]
        assert b["processed"] > a["processed"]
    assert last["processed"] == last["total"]
    return int(first["cache"])


def test_return_progress_on_completion_and_chat(http: httpx.Client) -> None:
    prompt = "This is a test " * 8
    events, _ = _sse(http, "/completion", {"prompt": prompt, **GREEDY, "stream": True,
                                           "return_progress": True, "cache_prompt": False})
    progress = [e["prompt_progress"] for e in events if "prompt_progress" in e]
    _progress_checks(progress)
    first_text = next(i for i, e in enumerate(events) if e.get("content"))
    assert all("prompt_progress" in e for e in events[:len(progress)])
    assert first_text >= len(progress)  # all progress comes before the first token
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": 3,
            "temperature": 0, "stream": True, "return_progress": True}
    chat, _ = _sse(http, "/chat/completions", body)
    cold = _progress_checks([e["prompt_progress"] for e in chat if "prompt_progress" in e])
    again, _ = _sse(http, "/chat/completions", body)  # the same prompt: from the cache
    warm = _progress_checks([e["prompt_progress"] for e in again if "prompt_progress" in e])
    assert warm > cold
    plain, _ = _sse(http, "/chat/completions", {**body, "return_progress": False})
    assert not any("prompt_progress" in e for e in plain)
