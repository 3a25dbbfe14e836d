"""Where a request starts (server/generation.py, `_started_now`): a small request on a
hot model (a completion, or a chat without tools) starts on the event loop itself,
anything else from a job thread, with the same replies and the same errors. Through a
real uvicorn server and a real worker; the job threads are counted by a spy around the
real `ThreadStream`, which still runs.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import inferenceos.server.generation as generation
from inferenceos.plan.entry import LoadRequest
from server_harness import Harness, serving

GREEDY = {"temperature": 0, "n_predict": 12, "ignore_eos": True}


@pytest.fixture(scope="module")
def server(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    base = LoadRequest(n_ctx=2048, n_batch=256, threads=1)  # room for a long prompt
    with serving({"tiny": tiny_llama}, tmp_path_factory.mktemp("loop-start"),
                 manager_kw={"base": base}) as h:
        yield h


class Jobs:
    """The generation jobs started on threads (`ThreadStream`s made by
    `start_generation`), counted; `started` is set at each."""

    def __init__(self) -> None:
        self.count = 0
        self.started = threading.Event()


@pytest.fixture
def jobs(monkeypatch: pytest.MonkeyPatch) -> Jobs:
    seen = Jobs()
    real = generation.ThreadStream

    class Counted(real):  # type: ignore[misc,valid-type]
        def __init__(self, job: Any, *args: Any, **kw: Any) -> None:
            if kw.get("name", "generation") == "generation":
                seen.count += 1
                seen.started.set()
            super().__init__(job, *args, **kw)

    monkeypatch.setattr(generation, "ThreadStream", Counted)
    return seen


def _complete(h: Harness, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(h.url + "/completion", json={**GREEDY, **body}, timeout=60)


def test_a_small_completion_on_a_hot_model_starts_on_the_loop(server: Harness,
                                                              jobs: Jobs) -> None:
    first = _complete(server, {"prompt": "The quick brown fox"})  # loads: a thread
    assert first.status_code == 200 and jobs.count == 1
    again = _complete(server, {"prompt": "The quick brown fox"})
    tokens = httpx.post(server.url + "/tokenize", json={"content": "The quick brown fox",
                                                      "add_special": True},
                        timeout=60).json()["tokens"]
    ids = _complete(server, {"prompt": tokens})
    streamed = httpx.post(server.url + "/completion", timeout=60, json={
        **GREEDY, "prompt": "The quick brown fox", "stream": True})
    chat = httpx.post(server.url + "/v1/chat/completions", timeout=60, json={
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
        "temperature": 0})
    assert again.status_code == ids.status_code == streamed.status_code == 200, ids.text
    assert chat.status_code == 200 and chat.json()["usage"]["completion_tokens"] == 4
    assert jobs.count == 1  # none of these four took a thread
    assert again.json()["content"] == ids.json()["content"] == first.json()["content"]
    assert streamed.text.count("data: ") == GREEDY["n_predict"] + 1
    (resident,) = server.manager.loaded()
    assert resident.refs == 0  # every lease taken on the loop was given back


def test_tools_and_long_prompts_start_from_a_thread(server: Harness, jobs: Jobs) -> None:
    _complete(server, {"prompt": "warm"})
    jobs.count = 0
    tool = {"type": "function", "function": {"name": "now", "parameters": {
        "type": "object", "properties": {}}}}
    chat = httpx.post(server.url + "/v1/chat/completions", timeout=60, json={
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
        "temperature": 0, "tools": [tool]})
    # 2,500 characters (a byte-level vocabulary: as many tokens, past a sequence's 512)
    long = _complete(server, {"prompt": "word " * 500})
    # (this model's template has no place for tools: the thread's job says so)
    assert chat.status_code == 400 and "tools" in chat.text
    assert long.status_code == 400 and "exceed_context_size_error" in long.text
    assert jobs.count == 2


def test_a_request_error_is_the_same_on_the_loop(server: Harness, jobs: Jobs) -> None:
    _complete(server, {"prompt": "warm"})
    jobs.count = 0
    bad = _complete(server, {"prompt": [1, 10_000_000]})  # an id past the vocabulary
    assert bad.status_code == 400 and "outside the vocabulary" in bad.text
    assert jobs.count == 0  # found on the loop, before anything reached the worker
    (resident,) = server.manager.loaded()
    assert resident.refs == 0


def test_a_held_route_sends_the_request_to_a_thread_that_waits(server: Harness,
                                                               jobs: Jobs) -> None:
    """A migration holds the engine's route while it swaps workers: the loop never
    waits for it; the request's thread does, and completes once it is free."""
    _complete(server, {"prompt": "warm"})
    jobs.count = 0
    jobs.started.clear()
    (resident,) = server.manager.loaded()
    route = resident.engine._current.route  # what a migration holds
    got: list[httpx.Response] = []
    with route:
        t = threading.Thread(target=lambda: got.append(_complete(server, {"prompt": "x"})))
        t.start()
        assert jobs.started.wait(30)  # the loop gave up on it, and a thread took it
        assert not got  # which waits for the route
    t.join(60)
    assert got and got[0].status_code == 200 and jobs.count == 1
    assert resident.refs == 0


def test_an_ollama_prompt_is_tokenized_by_the_servers_vocabulary(server: Harness,
                                                                 jobs: Jobs) -> None:
    """/api/generate reports its prompt's ids (`context`): they come from the server's
    own vocabulary, the same as the worker's tokenizer gives, and once it is loaded the
    request starts on the loop."""
    body = {"model": "tiny", "prompt": "The quick brown fox", "raw": True, "stream": False,
            "options": {"num_predict": 4, "temperature": 0}}
    first = httpx.post(server.url + "/api/generate", json=body, timeout=60)
    jobs.count = 0
    again = httpx.post(server.url + "/api/generate", json=body, timeout=60)
    assert first.status_code == again.status_code == 200 and jobs.count == 0
    (resident,) = server.manager.loaded()
    ids = resident.engine.tokenize("The quick brown fox")  # the worker's own tokenizer
    context = again.json()["context"]
    assert context[:len(ids)] == ids and len(context) == len(ids) + 4
    assert context == first.json()["context"]
