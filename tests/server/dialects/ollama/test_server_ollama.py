"""The Ollama routes, judged by the real `ollama` client against a real server."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import ollama
import pytest

from server_harness import Harness, serving


@pytest.fixture(scope="module")
def server(tiny_llama: Path, tiny_moe: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    root = tmp_path_factory.mktemp("server-ollama")
    with serving({"tiny": tiny_llama}, root) as h:
        h.catalog.store.import_file(tiny_moe, "moe")  # a registry entry, besides the alias
        yield h


@pytest.fixture
def client(server: Harness) -> ollama.Client:
    return ollama.Client(host=server.url, timeout=60)


OPTS = {"num_predict": 6, "temperature": 0}


def test_generate_whole_and_streamed(client: ollama.Client) -> None:
    r = client.generate(model="tiny", prompt="hello", options=OPTS)
    assert r.done and r.done_reason in ("stop", "length") and r.eval_count <= 6
    assert r.prompt_eval_count and r.total_duration and r.total_duration > 1000  # ns
    assert r.context and len(r.context) == r.prompt_eval_count + r.eval_count
    parts = list(client.generate(model="tiny", prompt="hello", options=OPTS, stream=True))
    assert parts[-1].done and not any(p.done for p in parts[:-1])
    assert "".join(p.response for p in parts) == r.response


def test_raw_generate_with_context(client: ollama.Client) -> None:
    first = client.generate(model="tiny", prompt="ab", raw=True, options=OPTS)
    again = client.generate(model="tiny", prompt="c", raw=True, options=OPTS,
                            context=first.context)
    assert first.context and again.prompt_eval_count > len(first.context)
    assert again.context[: len(first.context)] == first.context


def test_format_json(client: ollama.Client) -> None:
    r = client.generate(model="tiny", prompt="x", format="json", options=OPTS)
    assert r.response.startswith("{")


def test_format_json_schema(client: ollama.Client) -> None:
    schema = {"type": "object", "properties": {"c": {"enum": ["red", "blue"]}},
              "required": ["c"]}
    r = client.generate(model="tiny", prompt="x", format=schema,
                        options={"num_predict": 60, "temperature": 0})
    assert json.loads(r.response)["c"] in ("red", "blue")


def test_chat(client: ollama.Client) -> None:
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    r = client.chat(model="tiny", messages=msgs, options=OPTS)
    assert r.message.role == "assistant" and r.done
    streamed = "".join(p.message.content or "" for p in
                       client.chat(model="tiny", messages=msgs, options=OPTS, stream=True))
    assert streamed == r.message.content


def test_the_cached_part_of_a_prompt_is_counted_as_ollama_counts_it(server: Harness) -> None:
    """prompt_eval_count is the whole prompt; prompt_eval_cached_count the part read
    from the KV cache. Raw JSON: the ollama client's models drop the field."""
    body = {"model": "tiny", "prompt": "~^~ a prompt no other test sends: qzx qzx",
            "raw": True, "stream": False, "options": OPTS}
    first = httpx.post(server.url + "/api/generate", json=body, timeout=60).json()
    again = httpx.post(server.url + "/api/generate", json=body, timeout=60).json()
    assert again["prompt_eval_count"] == first["prompt_eval_count"]
    # the first shares only the leading tokens every prompt of this module starts with;
    # the second all but the last prompt token, which is evaluated alone (docs/engine.md)
    assert first.get("prompt_eval_cached_count", 0) <= 2
    assert again["prompt_eval_cached_count"] == first["prompt_eval_count"] - 1


def test_nothing_cached_leaves_the_cached_count_out() -> None:
    """Ollama's omitempty: no prompt_eval_cached_count when the cache gave nothing."""
    from inferenceos.engine.generation import GenerationMetrics
    from inferenceos.server.dialects.ollama.routes import _timings
    from inferenceos.server.generation import Done

    def final(cached: int) -> dict[str, object]:
        m = GenerationMetrics(prompt_tokens=10, cached_tokens=cached)
        return _timings(Done(m, 0.0, None), 0.0, None, 1.0)  # type: ignore[arg-type]

    assert "prompt_eval_cached_count" not in final(0)
    assert final(9)["prompt_eval_cached_count"] == 9 and final(9)["prompt_eval_count"] == 10


def test_ndjson_content_type(server: Harness) -> None:
    body = {"model": "tiny", "prompt": "x", "options": OPTS}
    with httpx.stream("POST", server.url + "/api/generate", json=body) as r:
        assert r.headers["content-type"] == "application/x-ndjson"
        lines = [json.loads(ln) for ln in r.iter_lines() if ln]
    assert lines[-1]["done"] is True and isinstance(lines[-1]["eval_duration"], int)


def test_embed_and_embeddings(client: ollama.Client) -> None:
    r = client.embed(model="tiny", input=["abc", "xyz"])
    assert len(r.embeddings) == 2 and len(r.embeddings[0]) == 64
    assert r.prompt_eval_count and r.prompt_eval_count > 0
    one = client.embeddings(model="tiny", prompt="abc")
    assert one.embedding == pytest.approx(r.embeddings[0], abs=1e-6)


def test_list_show_ps_and_version(client: ollama.Client, server: Harness) -> None:
    names = [m.model for m in client.list().models]
    assert names == ["tiny:latest", "moe:latest"]
    shown = client.show("tiny")
    assert shown.details and shown.details.family == "llama"
    assert shown.template and "im_start" in shown.template
    assert shown.modelinfo and shown.modelinfo["general.architecture"] == "llama"
    client.generate(model="tiny", prompt="x", options=OPTS)
    ps = client.ps().models
    assert [m.model for m in ps] == ["tiny:latest"] and ps[0].context_length == 256
    assert httpx.get(server.url + "/api/version").json()["version"]
    assert httpx.get(server.url + "/").text == "Ollama is running"
    assert httpx.head(server.url + "/").status_code == 200


def test_load_and_unload_requests(client: ollama.Client, server: Harness) -> None:
    r = client.generate(model="moe", keep_alive="10m")
    assert r.done_reason == "load"
    assert "moe:latest" in [m.model for m in client.ps().models]
    r = client.chat(model="moe", messages=[], keep_alive=0)
    assert r.done_reason == "unload"
    assert "moe:latest" not in [m.model for m in client.ps().models]


def test_copy_delete_and_pull(client: ollama.Client) -> None:
    client.copy("moe", "moe2:v1")
    assert "moe2:v1" in [m.model for m in client.list().models]
    client.delete("moe2:v1")
    assert "moe2:v1" not in [m.model for m in client.list().models]
    with pytest.raises(ollama.ResponseError) as info:
        client.delete("moe2:v1")
    assert info.value.status_code == 404
    with pytest.raises(ollama.ResponseError) as info:
        client.pull("llama3:8b")
    assert info.value.status_code == 404 and "hf.co/ORG/REPO" in info.value.error
    with pytest.raises(ollama.ResponseError) as info:
        client.delete("tiny")  # served from a file: not the registry's to delete
    assert info.value.status_code == 400


@pytest.mark.parametrize("kw, status", [
    ({"model": "missing"}, 404),
    ({"model": "a/../../b"}, 400),
    ({"options": {"temperature": "hot"}}, 400),
    ({"keep_alive": "soon"}, 400),
    ({"format": {"type": "no-such-type"}}, 400),
    ({"images": ["aGk="]}, 400),
])
def test_errors_in_ollama_shape(client: ollama.Client, kw: dict, status: int) -> None:
    args = {"model": "tiny", "prompt": "x", "options": OPTS, **kw}
    with pytest.raises(ollama.ResponseError) as info:
        client.generate(**args)
    assert info.value.status_code == status and info.value.error
    assert "Traceback" not in info.value.error


def test_curl_style_body_without_json_content_type(server: Harness) -> None:
    """Ollama's docs use `curl URL -d '{...}'` (form content type): it must work."""
    body = json.dumps({"model": "tiny", "prompt": "x", "stream": False, "options": OPTS})
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    r = httpx.post(server.url + "/api/generate", content=body, headers=form)
    assert r.status_code == 200, r.text
    assert r.json()["done"] is True
    # a browser page (it sends Origin) cannot pass JSON off as a form post
    r = httpx.post(server.url + "/api/generate", content=body,
                   headers={**form, "Origin": "http://127.0.0.1:9"})
    assert r.status_code == 400
