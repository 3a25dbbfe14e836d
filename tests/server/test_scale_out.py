"""Scale-out behind LiteLLM (docs/scale-out.md): two real `inferenceos serve` replicas of
Gemma 3 270M on loopback ports behind LiteLLM's own `Router`, not code of ours.

- sticky routing: each conversation (LiteLLM's `session_affinity`, keyed by
  `metadata.session_id`) stays on one replica, so its second turn reuses the prefix
  the first left in that replica's cache (`cached_tokens` > 0; where a conversation
  starts is the router's random pick, so the spread is the next test's); the Ollama
  provider reaches the replicas too;
- failover: 32 concurrent chat requests spread over both replicas; one is killed
  (SIGKILL) while it still has requests running or queued; every request succeeds
  (LiteLLM retries them on the survivor) and the survivor answers all that came after.

LiteLLM must not reach the network: its cost map is the bundled one, offline mode is
on, no callbacks, and a guard fails the test on any connection off loopback.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from cli_helpers import start_serve

# read by litellm at import time: the bundled cost map, nothing fetched
os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
os.environ["LITELLM_OFFLINE_MODE"] = "true"

pytestmark = pytest.mark.slow
N_REQUESTS = 32
MAX_TOKENS = 8
RUN_TIMEOUT_S = 300  # the whole failover run; each request has its own 60 s


@pytest.fixture
def loopback_only(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Refuse (and record) any TCP connection or name lookup off loopback."""
    tried: list[Any] = []
    connect, lookup = socket.socket.connect, socket.getaddrinfo

    def guarded_connect(self: socket.socket, address: Any) -> Any:
        host = address[0] if isinstance(address, tuple) else ""
        if self.family in (socket.AF_INET, socket.AF_INET6) and host not in (
                "127.0.0.1", "::1", "localhost"):
            tried.append(address)
            raise OSError(f"test guard: no connection to {address} (loopback only)")
        return connect(self, address)

    def guarded_lookup(host: Any, *args: Any, **kw: Any) -> Any:
        if host not in (None, "127.0.0.1", "::1", "localhost", b"127.0.0.1", b"localhost"):
            tried.append(host)
            raise socket.gaierror(f"test guard: no lookup of {host!r} (loopback only)")
        return lookup(host, *args, **kw)

    monkeypatch.setattr(socket.socket, "connect", guarded_connect)
    monkeypatch.setattr(socket, "getaddrinfo", guarded_lookup)
    return tried


@pytest.fixture(scope="module")
def replicas(gemma_path: Path, tmp_path_factory: pytest.TempPathFactory,
             ) -> Iterator[list[tuple[subprocess.Popen[str], str]]]:
    """Two `inferenceos serve` processes of Gemma, each with its own INFERENCEOS_HOME
    (module-scoped: set up before the per-test home), started side by side, each warmed
    by one request (the model loads on the first); stopped (or found dead) at the end."""
    args = (str(gemma_path), "--ctx", "1024", "--threads", "1", "--parallel", "4",
            "--queue", "64", "--any-model")

    def start(i: int) -> tuple[subprocess.Popen[str], str]:
        home = tmp_path_factory.mktemp(f"replica{i}")
        proc, base = start_serve(*args, INFERENCEOS_HOME=str(home))
        r = httpx.post(base + "/v1/chat/completions", timeout=120, json={
            "model": "gemma", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 1})
        assert r.status_code == 200, r.text
        return proc, base

    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(start, i) for i in range(2)]
    failed = [exc for f in futures if (exc := f.exception()) is not None]
    if failed:  # one did not start: stop the other, report why
        for f in futures:
            if f.exception() is None:
                f.result()[0].kill()
        raise failed[0]
    started = [f.result() for f in futures]
    yield started
    for proc, _ in started:
        if proc.poll() is None:
            proc.terminate()
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()


def make_router(bases: list[str], provider: str = "openai", **kw: Any) -> Any:
    """LiteLLM's Router over `bases`, one deployment per replica under model "gemma"."""
    import litellm

    litellm.success_callback, litellm.failure_callback, litellm.callbacks = [], [], []
    deployments = [{
        "model_name": "gemma",
        "litellm_params": ({"model": "openai/gemma", "api_base": b + "/v1", "api_key": "none"}
                           if provider == "openai" else
                           {"model": "ollama_chat/gemma", "api_base": b}),
        "model_info": {"id": f"replica-{i}"},
    } for i, b in enumerate(bases)]
    return litellm.Router(model_list=deployments, timeout=60, **kw)


def served_by(response: Any) -> str:
    """The deployment (replica) that answered."""
    return str(response._hidden_params["model_id"])


def scrape(base: str) -> dict[str, float]:
    """{sample name: value summed over labels} of a replica's /metrics."""
    text = httpx.get(base + "/metrics", timeout=10).text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[s.name] = out.get(s.name, 0.0) + s.value
    return out


def ask(router: Any, content: str, **kw: Any) -> Any:
    return router.acompletion(model="gemma", messages=[{"role": "user", "content": content}],
                              max_tokens=MAX_TOKENS, temperature=0, **kw)


def test_a_conversation_sticks_to_its_replica_and_hits_its_prefix_cache(
        replicas: list[tuple[subprocess.Popen[str], str]], loopback_only: list[Any]) -> None:
    bases = [b for _, b in replicas]
    router = make_router(bases, optional_pre_call_checks=["session_affinity"])
    story = ("Here is a long shared system prompt about the history of the lighthouse at "
             "the end of the harbour, its keepers and the ships it saved. ") * 4

    async def conversation(i: int) -> tuple[list[str], int]:
        meta = {"session_id": f"conversation-{i}"}
        messages = [{"role": "system", "content": story},
                    {"role": "user", "content": f"Name ship number {i}."}]
        first = await router.acompletion(model="gemma", messages=messages, metadata=meta,
                                         max_tokens=MAX_TOKENS, temperature=0)
        messages += [{"role": "assistant", "content": first.choices[0].message.content},
                     {"role": "user", "content": "And the next one?"}]
        second = await router.acompletion(model="gemma", messages=messages, metadata=meta,
                                          max_tokens=MAX_TOKENS, temperature=0)
        cached = second.usage.prompt_tokens_details.cached_tokens or 0
        return [served_by(first), served_by(second)], cached

    async def run() -> list[tuple[list[str], int]]:
        return await asyncio.wait_for(asyncio.gather(*(conversation(i) for i in range(6))), 180)

    results = asyncio.run(run())
    for where, cached in results:
        assert where[0] == where[1], results  # the second turn went where the first did
        assert cached > 0, results  # and found its prefix there

    ollama = make_router(bases, "ollama")

    async def through_ollama() -> list[Any]:
        return await asyncio.wait_for(asyncio.gather(*(ask(ollama, "Hello") for _ in range(4))),
                                      120)

    answers = asyncio.run(through_ollama())
    assert all(a.choices[0].message.content for a in answers)
    assert not loopback_only, loopback_only


def test_a_replica_killed_mid_run_loses_no_request(
        replicas: list[tuple[subprocess.Popen[str], str]], loopback_only: list[Any]) -> None:
    (victim, victim_base), (_, survivor_base) = replicas
    assert victim.poll() is None, "the sticky-routing test left the victim dead"
    router = make_router([victim_base, survivor_base], num_retries=3, retry_after=0,
                         allowed_fails=0, cooldown_time=60, enable_weighted_failover=True)
    before = scrape(survivor_base).get("inferenceos:request_success_total", 0.0)
    in_flight_at_kill: list[float] = []

    async def run() -> list[Any]:
        tasks = [asyncio.ensure_future(ask(router, f"Write word number {i}."))
                 for i in range(N_REQUESTS)]
        done_on_victim = 0
        for next_done in asyncio.as_completed(tasks):
            response = await next_done
            done_on_victim += served_by(response) == "replica-0"
            if done_on_victim == 2 and not in_flight_at_kill:
                m = await asyncio.to_thread(scrape, victim_base)
                in_flight_at_kill.append(m["inferenceos:num_requests_running"]
                                         + m["inferenceos:num_requests_waiting"])
                victim.kill()  # SIGKILL: no drain, its connections just drop
        return [t.result() for t in tasks]

    responses = asyncio.run(asyncio.wait_for(run(), RUN_TIMEOUT_S))
    victim.wait(10)
    assert in_flight_at_kill and in_flight_at_kill[0] >= 1, in_flight_at_kill
    assert len(responses) == N_REQUESTS and all(r.choices[0].message.content for r in responses)
    by_victim = sum(served_by(r) == "replica-0" for r in responses)
    by_survivor = N_REQUESTS - by_victim
    # the victim answered only what finished before it died; its requests in flight were
    # retried on the survivor, which answered everything else
    assert by_victim < N_REQUESTS // 2 < by_survivor
    after = scrape(survivor_base)["inferenceos:request_success_total"]
    assert after - before == by_survivor
    assert not loopback_only, loopback_only
