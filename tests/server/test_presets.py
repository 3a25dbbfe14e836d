"""Model presets (registry/presets.py, server/presets.py): Modelfile parsing, `create`
through the real `ollama` client, the preset's SYSTEM and PARAMETERs followed on the
OpenAI, Ollama, Anthropic and llama-server dialects (Qwen2.5-Coder-0.5B-Instruct), and
after a restart with its system-prompt prefix restored from the disk KV tier; blobs."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import ollama
import openai
import pytest

from inferenceos.errors import UsageError
from inferenceos.plan.entry import LoadRequest
from inferenceos.registry.manager import engine_factory
from inferenceos.registry.presets import Preset, parse_modelfile
from server_harness import Harness, start_server

MiB = 1 << 20
SYSTEM = "Whatever the user asks, reply only with the word OK."
QUESTION = "What is the capital of France?"


def test_modelfile_syntax() -> None:
    mf = parse_modelfile('''# a comment
FROM qwen
SYSTEM """You are
a pirate."""
TEMPLATE "{{ .Prompt }}"
PARAMETER temperature 0.2
PARAMETER stop "<|im_end|>"
PARAMETER stop END
parameter num_predict 12
ADAPTER ./a.gguf
MESSAGE user """Hi"""
MESSAGE assistant Ahoy
LICENSE MIT
''')
    assert mf.from_ == "qwen" and mf.system == "You are\na pirate."
    assert mf.template == "{{ .Prompt }}" and mf.adapters == ["./a.gguf"]
    assert mf.parameters == {"temperature": 0.2, "stop": ["<|im_end|>", "END"],
                             "num_predict": 12}
    assert mf.messages == [("user", "Hi"), ("assistant", "Ahoy")]
    text = Preset("qwen", mf.system, mf.template, mf.parameters, (),
                  tuple(mf.messages)).modelfile()
    again = parse_modelfile(text)
    assert (again.system, again.parameters, again.messages) == (
        mf.system, mf.parameters, mf.messages)
    for bad, why in (("SYSTEM hi", "no FROM"), ("FROM x\nPARAMETER nope 1", "unknown parameter"),
                     ("FROM x\nPARAMETER top_k many", "must be a int"),
                     ("FROM x\nMESSAGE robot hi", "role"),
                     ('FROM x\nSYSTEM """open', "unterminated"),
                     ("FROM x\nBOGUS y", "unknown instruction")):
        with pytest.raises(UsageError, match=why):
            parse_modelfile(bad)


def _serve(qwen: Path, root: Path) -> Harness:
    factory = engine_factory(kv_cache_ram=64 * MiB, kv_cache_disk=512 * MiB,
                             kv_cache_dir=root / "kv-cache")
    return start_server({"qwen": qwen}, root, manager_kw={
        "base": LoadRequest(n_ctx=2048), "factory": factory})


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("presets")


@pytest.fixture(scope="module")
def server(qwen05_path: Path, root: Path) -> Iterator[Harness]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("INFERENCEOS_HOME", str(root / "home"))
        h = _serve(qwen05_path, root)
        try:
            ollama.Client(host=h.url).create(
                model="okbot", from_="qwen", system=SYSTEM,
                parameters={"temperature": 0, "num_predict": 8})
            yield h
        finally:
            h.stop()


def _four_dialects(h: Harness) -> dict[str, str]:
    """The preset's answer to QUESTION on each dialect (no system prompt sent)."""
    user = [{"role": "user", "content": QUESTION}]
    o = openai.OpenAI(base_url=h.v1, api_key="x").chat.completions.create(
        model="okbot", messages=user)  # type: ignore[arg-type]
    oll = ollama.Client(host=h.url).chat(model="okbot", messages=user)
    a = anthropic.Anthropic(base_url=h.url, api_key="x").messages.create(
        model="okbot", max_tokens=64, extra_body={"temperature": 0},  # not its own 1.0
        messages=user)  # type: ignore[arg-type]
    lc = httpx.post(f"{h.url}/completion", json={
        "model": "okbot", "prompt": "def fib(n):", "temperature": 0}, timeout=120).json()
    assert lc["tokens_predicted"] == 8  # PARAMETER num_predict 8, on a raw prompt too
    assert o.usage is not None and o.usage.completion_tokens <= 8
    return {"openai": o.choices[0].message.content or "", "ollama": oll.message.content or "",
            "anthropic": a.content[0].text}  # type: ignore[union-attr]


def test_a_preset_answers_as_its_modelfile_says_on_every_dialect(server: Harness) -> None:
    answers = _four_dialects(server)
    assert all(t.strip().strip(".!").upper() == "OK" for t in answers.values()), answers
    plain = ollama.Client(host=server.url).chat(
        model="qwen", messages=[{"role": "user", "content": QUESTION}],
        options={"temperature": 0, "num_predict": 8})
    assert "paris" in (plain.message.content or "").lower()  # the base is unchanged
    shown = ollama.Client(host=server.url).show("okbot")
    assert "num_predict" in (shown.parameters or "")
    assert "FROM qwen" in (shown.modelfile or "") and SYSTEM in (shown.modelfile or "")
    assert httpx.post(f"{server.url}/api/show", json={"model": "okbot"}).json()[
        "system"] == SYSTEM
    names = [m.model for m in ollama.Client(host=server.url).list().models]
    assert "okbot:latest" in names


def test_a_request_overrides_the_preset_parameters(server: Harness) -> None:
    r = ollama.Client(host=server.url).chat(
        model="okbot", messages=[{"role": "user", "content": QUESTION}],
        options={"num_predict": 2})
    assert r.eval_count is not None and r.eval_count <= 2


def test_blobs_are_digest_checked(server: Harness) -> None:
    data = b"some bytes"
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    url = f"{server.url}/api/blobs/{digest}"
    assert httpx.head(url).status_code == 404
    bad = httpx.post(f"{server.url}/api/blobs/sha256:{'0' * 64}", content=data)
    assert bad.status_code == 400 and "mismatch" in bad.json()["error"]
    assert httpx.post(url, content=data).status_code == 201
    assert httpx.head(url).status_code == 200
    assert httpx.head(f"{server.url}/api/blobs/nope").status_code == 400
    r = httpx.post(f"{server.url}/api/create", json={"model": "x", "from": "qwen",
                                                     "parameters": {"bogus": 1}})
    assert r.status_code == 400 and "unknown parameter" in r.json()["error"]


def test_a_preset_survives_a_restart_with_its_prefix_from_disk(
        server: Harness, qwen05_path: Path, root: Path) -> None:
    client = openai.OpenAI(base_url=server.v1, api_key="x")
    client.chat.completions.create(model="okbot", messages=[
        {"role": "user", "content": "Name a colour."}])
    server.stop()  # the engines write their KV stores' entries before they exit
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("INFERENCEOS_HOME", str(root / "home"))
        h = _serve(qwen05_path, root)
        try:
            r = openai.OpenAI(base_url=h.v1, api_key="x").chat.completions.create(
                model="okbot", messages=[{"role": "user", "content": QUESTION}])
            assert (r.choices[0].message.content or "").strip().strip(".!").upper() == "OK"
            details = r.usage.prompt_tokens_details if r.usage else None
            assert details is not None and (details.cached_tokens or 0) >= 10
            assert "okbot" in httpx.get(f"{h.url}/api/tags").text
        finally:
            h.stop()
