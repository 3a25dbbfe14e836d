"""Rerank on reranker GGUFs the tests build (tests/tiny_reranker.py: rank pooling, a
score with a closed form; Qwen3-style with and without a rerank template, BERT-style):
/v1/rerank, /rerank, /v1/reranking in llama-server's and Jina's shape and TEI's, the
pair formatted as llama-server's format_prompt_rerank does (the model's rerank
template, else BOS query EOS document EOS), scores equal to the closed form and
ordered best first; a model that is not a reranker refused with a 400, and
embeddings refused on a reranker. The same requests against llama-server --reranking
are in benchmarks/llama_server_parity.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import ollama
import openai
import pytest

from inferenceos.server.rerank import rerank_tokens
from inferenceos.server.vocab import vocab_for
from server_harness import Harness, serving
from tiny_reranker import expected_score, write_tiny_reranker

QUERY = "which words are full of vowels"
DOCS = ["xyz", "banana", "aeiou aeiou", "the cat sat", "zzz a"]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("rerankers")
    return {"rr": write_tiny_reranker(d / "rr.gguf"),
            "rr-plain": write_tiny_reranker(d / "plain.gguf", rerank_template=False),
            "rr-bert": write_tiny_reranker(d / "bert.gguf", arch="bert")}


@pytest.fixture(scope="module")
def server(models: dict[str, Path], tiny_llama: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    root = tmp_path_factory.mktemp("server-rerank")
    with serving({**models, "tiny": tiny_llama}, root) as h:
        yield h


@pytest.fixture
def http(server: Harness) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=120) as c:
        yield c


def test_pair_formats(models: dict[str, Path]) -> None:
    """The model's rerank template, else BOS query EOS document EOS (add_eos set)."""
    v = vocab_for(models["rr"])
    assert v.detokenize(rerank_tokens(v, "q", "doc")) == "<s> query q document doc</s>"
    ids = rerank_tokens(v, "q", "<s>doc")  # the template's own text parses specials
    assert ids.count(v.bos) == 2
    plain = vocab_for(models["rr-plain"])
    ids = rerank_tokens(plain, "q", "<s>doc")  # query and document text never do
    assert ids[0] == plain.bos and ids.count(plain.bos) == 1
    assert plain.detokenize(ids) == "<s> q</s> <s>doc</s>"


@pytest.mark.parametrize("name", ["rr", "rr-plain", "rr-bert"])
def test_rerank_orders_by_score(http: httpx.Client, models: dict[str, Path],
                                name: str) -> None:
    r = http.post("/v1/rerank", json={"model": name, "query": QUERY, "documents": DOCS})
    assert r.status_code == 200, r.text
    b = r.json()
    v = vocab_for(models[name])
    pairs = [rerank_tokens(v, QUERY, d) for d in DOCS]
    want = [expected_score(p, "bert" if name == "rr-bert" else "qwen3") for p in pairs]
    got = {x["index"]: x["relevance_score"] for x in b["results"]}
    assert [x["index"] for x in b["results"]] == sorted(range(len(DOCS)), key=lambda i: -want[i])
    assert b["results"][0]["index"] == DOCS.index("aeiou aeiou")
    assert all(abs(got[i] - want[i]) < 5e-4 for i in range(len(DOCS))), (got, want)
    assert b["model"] == name and b["object"] == "list"
    n = sum(map(len, pairs))
    assert b["usage"] == {"prompt_tokens": n, "total_tokens": n}
    assert all("document" not in x for x in b["results"])


def test_top_n_and_documents(http: httpx.Client) -> None:
    """Jina's `top_n` and `return_documents`; the same on every route spelling."""
    body = {"model": "rr", "query": QUERY, "documents": DOCS, "top_n": 2,
            "return_documents": True}
    answers = [http.post(path, json=body).json()
               for path in ("/v1/rerank", "/rerank", "/reranking", "/v1/reranking")]
    assert all(a == answers[0] for a in answers)
    results = answers[0]["results"]
    assert len(results) == 2 and results[0]["document"] == {"text": "aeiou aeiou"}
    assert results[0]["relevance_score"] > results[1]["relevance_score"]


def test_tei_shape(http: httpx.Client) -> None:
    """Hugging Face TEI's form (`texts`, `return_text`): a bare list with `score`."""
    r = http.post("/rerank", json={"model": "rr", "query": QUERY, "texts": DOCS[:2],
                                   "return_text": True})
    assert r.status_code == 200
    assert [set(x) for x in r.json()] == [{"index", "score", "text"}] * 2
    assert r.json()[0] == {"index": 1, "score": r.json()[0]["score"], "text": "banana"}


def test_not_a_reranker(http: httpx.Client) -> None:
    r = http.post("/v1/rerank", json={"model": "tiny", "query": "a", "documents": ["b"]})
    assert r.status_code == 400
    err = r.json()["error"]
    assert "does not support reranking" in err["message"] and err["type"]


@pytest.mark.parametrize(("body", "message"), [
    ({"documents": ["a"]}, '"query" must be provided'),
    ({"query": 1, "documents": ["a"]}, '"query" must be a string'),
    ({"query": "q", "documents": []}, '"documents" must be a non-empty string array'),
    ({"query": "q", "documents": ["a", 2]}, '"documents" must be a non-empty string array'),
    ({"query": "q", "documents": ["a"], "top_n": 0}, '"top_n" must be a positive integer'),
    ({"query": "q", "documents": ["a"], "return_documents": "yes"}, '"return_documents"'),
])
def test_bad_bodies(http: httpx.Client, body: dict[str, Any], message: str) -> None:
    r = http.post("/v1/rerank", json={"model": "rr", **body})
    assert r.status_code == 400 and r.json()["error"]["message"].startswith(message), r.text


def test_no_embeddings_from_a_reranker(server: Harness) -> None:
    """A reranker's pooled output is a score, not an embedding: refused on both."""
    client = openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="is a reranker"):
        client.embeddings.create(model="rr", input="abc")
    with pytest.raises(ollama.ResponseError, match="is a reranker"):
        ollama.Client(host=server.url).embed(model="rr", input="abc")
