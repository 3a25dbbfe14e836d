"""Safety rules and operations: API key, Host check, CORS, body limit, queue limit,
client disconnects, graceful shutdown and /metrics."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from inferenceos.engine.engine import Engine
from inferenceos.plan.llama_params import LlamaParams
from inferenceos.server.settings import ServerSettings
from server_harness import Harness, start_server

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


class SlowEngine(Engine):
    """The real engine, pausing between tokens and never stopping at end-of-text, so
    requests overlap deterministically."""

    def generate(self, prompt: Any, sampling: Any, cancel: Any = None, **kw: Any) -> Any:
        gen = super().generate(prompt, dataclasses.replace(sampling, ignore_eos=True), cancel,
                               **kw)
        inner = gen.events

        def slow() -> Iterator[Any]:
            try:
                for ev in inner:
                    time.sleep(0.05)
                    yield ev
            finally:
                close = getattr(inner, "close", None)
                if close:
                    close()
        gen.events = slow()
        return gen

    def generate_now(self, *args: Any, **kw: Any) -> None:
        return None  # never on the event loop: every request's start comes to `generate`


def _slow_factory(path: Path, settings: LlamaParams, slots: int) -> Engine:
    return SlowEngine(path, settings.per_sequence(), n_parallel=slots)


@pytest.fixture(scope="module")
def guarded(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    """A server with an API key, a small body limit and a queue of 1 + 0."""
    root = tmp_path_factory.mktemp("server-guarded")
    settings = ServerSettings(api_key="sekret", max_body_bytes=4096, max_running=1,
                              max_waiting=0, shutdown_grace_s=0.5)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("INFERENCEOS_HOME", str(root / "home"))
        h = start_server({"tiny": tiny_llama}, root, settings,
                         {"factory": _slow_factory, "slots": 2})
        yield h
        h.stop()


KEY = {"Authorization": "Bearer sekret"}


def test_api_key_required_but_health_open(guarded: Harness) -> None:
    r = httpx.post(guarded.v1 + "/chat/completions", json=CHAT)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert r.headers["www-authenticate"] == "Bearer"
    r = httpx.get(guarded.url + "/api/tags")
    assert r.status_code == 401 and isinstance(r.json()["error"], str)  # Ollama's shape
    assert httpx.get(guarded.url + "/api/tags", headers={"X-Api-Key": "wrong"}).status_code == 401
    assert httpx.get(guarded.url + "/api/tags", headers={"X-Api-Key": "sekret"}).status_code == 200
    assert httpx.get(guarded.url + "/api/tags", headers=KEY).status_code == 200
    assert httpx.get(guarded.url + "/health").json()["status"] == "ok"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=guarded.v1, api_key="bad", max_retries=0).models.list()
    ok = openai.OpenAI(base_url=guarded.v1, api_key="sekret", max_retries=0)
    assert ok.chat.completions.create(**CHAT).choices


@pytest.mark.parametrize("host, status", [
    ("evil.example", 403), ("evil.example:11434", 403), ("127.0.0.1.nip.io", 403),
    ("localhost", 200), ("127.0.0.1:1234", 200), ("[::1]:80", 200),
])
def test_foreign_host_refused_on_loopback(guarded: Harness, host: str, status: int) -> None:
    r = httpx.get(guarded.url + "/health", headers={"Host": host})
    assert r.status_code == status
    if status == 403:
        assert "not allowed" in r.json()["error"]


def test_cors_allows_local_origins_only(guarded: Harness) -> None:
    pre = {"Access-Control-Request-Method": "POST",
           "Access-Control-Request-Headers": "authorization"}
    ok = httpx.options(guarded.v1 + "/chat/completions",
                       headers={"Origin": "http://localhost:3000", **pre})
    assert ok.status_code == 200
    assert ok.headers["access-control-allow-origin"] == "http://localhost:3000"
    bad = httpx.options(guarded.v1 + "/chat/completions",
                        headers={"Origin": "https://evil.example", **pre})
    assert "access-control-allow-origin" not in bad.headers


def test_oversized_body_is_413(guarded: Harness) -> None:
    big = {**CHAT, "messages": [{"role": "user", "content": "x" * 5000}]}
    r = httpx.post(guarded.v1 + "/chat/completions", json=big, headers=KEY)
    assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"

    def chunks() -> Iterator[bytes]:
        yield b'{"model": "tiny", "prompt": "'
        for _ in range(10):
            yield b"y" * 1000
        yield b'"}'
    r = httpx.post(guarded.url + "/api/generate", content=chunks(), headers=KEY)
    assert r.status_code == 413 and "larger than" in r.json()["error"]


def _metric(h: Harness, name: str) -> float:
    text = httpx.get(h.url + "/metrics", headers=KEY).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name))


def test_queue_full_is_429_with_retry_after(guarded: Harness) -> None:
    body = {**CHAT, "max_tokens": 40, "stream": True}
    with httpx.stream("POST", guarded.v1 + "/chat/completions", json=body, headers=KEY) as r:
        lines = r.iter_lines()  # keep it: dropping it would close the stream
        next(lines)  # the first request now holds the only slot
        second = httpx.post(guarded.v1 + "/chat/completions", json=CHAT, headers=KEY)
        ollama_second = httpx.post(guarded.url + "/api/chat", headers=KEY, json={
            "model": "tiny", "messages": [{"role": "user", "content": "x"}]})
    assert second.status_code == 429 and int(second.headers["retry-after"]) >= 1
    assert second.json()["error"]["type"] == "rate_limit_error"
    assert ollama_second.status_code == 429 and "busy" in ollama_second.json()["error"]
    assert _metric(guarded, 'inferenceos:requests_rejected_total{reason="queue_full"}') >= 2


def test_disconnect_cancels_generation(guarded: Harness) -> None:
    before = _metric(guarded, "inferenceos:request_success_total")
    body = {**CHAT, "max_tokens": 200, "stream": True}
    with httpx.stream("POST", guarded.v1 + "/chat/completions", json=body, headers=KEY) as r:
        lines = r.iter_lines()
        next(lines)
        next(lines)
    deadline = time.monotonic() + 5
    while guarded.state.admission.running and time.monotonic() < deadline:
        time.sleep(0.05)
    assert guarded.state.admission.running == 0  # slot freed long before 200 tokens
    aborted = _metric(
        guarded, 'inferenceos:request_success_total{finished_reason="abort"')
    assert aborted >= 1 and _metric(guarded, "inferenceos:request_success_total") > before


def test_metrics_names(guarded: Harness) -> None:
    httpx.post(guarded.v1 + "/chat/completions", json=CHAT, headers=KEY)
    text = httpx.get(guarded.url + "/metrics", headers=KEY).text
    for name in ("time_to_first_token_seconds_bucket", "inter_token_latency_seconds_count",
                 "e2e_request_latency_seconds_sum", "num_requests_running",
                 "num_requests_waiting", "prompt_tokens_total", "generation_tokens_total",
                 "kv_cache_usage_perc", "model_loads_total", "models_loaded",
                 "http_requests_total"):
        assert f"inferenceos:{name}" in text
    assert httpx.get(guarded.url + "/metrics").status_code == 401  # key needed here too


def test_graceful_shutdown_ends_streams_cleanly(tiny_llama: Path, tmp_path: Path) -> None:
    settings = ServerSettings(shutdown_grace_s=0.3)
    h = start_server({"tiny": tiny_llama}, tmp_path, settings,
                     {"factory": _slow_factory, "slots": 2})
    body = {**CHAT, "max_tokens": 200, "stream": True}
    with httpx.stream("POST", h.v1 + "/chat/completions", json=body, timeout=30) as r:
        lines = r.iter_lines()
        next(lines)
        stopper = threading.Thread(target=h.stop)
        stopper.start()
        rest = [ln for ln in lines if ln]
    stopper.join(30)
    assert rest[-1] == "data: [DONE]" and '"finish_reason":"stop"' in rest[-2]
    assert len(rest) < 150 and not h.thread.is_alive()
