"""`serve --rpc`: a model split over two loopback workers behind the real server; a
worker killed mid-stream ends that stream with an error (never a hang), the server stays
up, /health says which worker was lost, and the next request runs on what is left."""

from __future__ import annotations

import signal
import time
from dataclasses import replace
from pathlib import Path

import httpx
import openai
import pytest

from cluster_harness import RAM, Workers
from server_harness import TINY_REQUEST, serving
from tiny_models import write_tiny_model


@pytest.fixture(scope="module")
def deep_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("cluster-server") / "deep.gguf", "deeper")


def test_serve_over_workers_survives_a_lost_worker(deep_model: Path, tmp_path: Path) -> None:
    workers = Workers(tmp_path)
    try:
        # a long context, so that the stream is still running when the worker dies
        base = replace(TINY_REQUEST, n_ctx=2048, rpc=workers.addresses, ram=RAM)
        with serving({"deep": deep_model}, tmp_path, manager_kw={"base": base}) as h:
            health = httpx.get(h.url + "/health").json()
            assert health["workers"] == {a: "up" for a in workers.addresses}
            client = openai.OpenAI(base_url=h.v1, api_key="x", max_retries=0, timeout=60)
            stream = client.completions.create(
                model="deep", prompt="hello", max_tokens=100_000, temperature=0, stream=True,
                extra_body={"ignore_eos": True},
            )
            chunks = iter(stream)
            next(chunks)
            # the victim stopped at once, so the stream cannot run to the end of its
            # context while the checks below run (a parallel suite once saw the whole
            # 2,048-token stream end before the kill): its next RPC call waits, then fails
            victim = workers.ports[1]
            workers.procs[victim].send_signal(signal.SIGSTOP)
            loaded = h.manager.loaded()
            assert loaded, "the model should be loaded"
            assert httpx.get(h.url + "/health").json()["workers"][workers.addresses[0]] == "in use"
            workers.procs[victim].send_signal(signal.SIGKILL)
            started = time.monotonic()
            with pytest.raises(openai.APIError, match="cluster worker was lost"):
                for _ in chunks:
                    assert time.monotonic() - started < 30, "the stream hangs"
            health = httpx.get(h.url + "/health").json()
            assert health["status"] == "ok"
            assert health["workers"][f"127.0.0.1:{victim}"].startswith("lost: ")
            # the next request runs on what is left (planned again without the worker)
            r = client.completions.create(model="deep", prompt="hello", max_tokens=8,
                                          temperature=0)
            assert r.choices[0].text is not None and r.usage.completion_tokens > 0
    finally:
        workers.close()
