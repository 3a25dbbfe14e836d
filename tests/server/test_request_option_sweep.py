"""No llama.cpp assert reaches a user through `serve` either: a seeded sweep of the
per-request options (Ollama's `options`, OpenAI's sampling fields) on the tiny model.
Each request ends in a result or a 4xx with a one-line message; none kills the model's
worker (a 503 "worker died"), none is a 5xx, and the server answers /health after all
of them. The load options (`num_ctx`, `num_batch`, `num_thread`) reload the model, so
each combination is also a plan and a load: llama.cpp asserts on some (an n_batch
over n_ctx, a context below its padding) and aborts the whole worker when it does.
`run` and the Python API have their own sweep (tests/cli/test_option_sweep.py)."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from server_harness import Harness, serving
from tiny_models import write_tiny_model

CASES = 50
PROMPTS = ["a", "ab " * 7, "abc " * 40, "ab" * 300]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    root = tmp_path_factory.mktemp("request-sweep")
    with serving({"tiny": write_tiny_model(root / "tiny.gguf")}, root) as h:
        yield h


def _ollama_case(rng: random.Random) -> dict[str, Any]:
    predict = rng.choice([-2, -1, 0, 1, 7, 40, 100000])
    options: dict[str, Any] = {
        "num_predict": predict,
        # a long generation only in a small context, so the sweep stays quick
        "num_ctx": rng.choice([1, 16, 17, 31, 64, 255, 300] + ([] if predict in (-1, -2, 100000)
                                                               else [4096, 1 << 20])),
        "temperature": rng.choice([0, 0.7, 2.5]),
        "seed": rng.choice([-1, 0, 7, 2**31]),
    }
    for key, values in (("num_batch", [1, 7, 16, 17, 512, 100000]),
                        ("num_thread", [0, 1, 2, 3, 64]),
                        ("top_k", [0, 1, 40, 10**6]), ("top_p", [0.0, 0.01, 0.5, 1.0]),
                        ("min_p", [0.0, 0.5, 1.0]), ("repeat_penalty", [0.5, 1.0, 1.3]),
                        ("repeat_last_n", [-1, 0, 64]), ("stop", [[], ["a"], ["\n"]]),
                        ("typical_p", [0.5, 1.0]), ("presence_penalty", [-2.0, 0.0, 2.0])):
        if rng.random() < 0.4:
            options[key] = rng.choice(values)
    return {"model": "tiny", "prompt": rng.choice(PROMPTS), "raw": True,
            "stream": rng.random() < 0.3, "options": options}


def _openai_case(rng: random.Random) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "tiny", "prompt": rng.choice(PROMPTS),
                            "max_tokens": rng.choice([1, 7, 40, 300]),
                            "temperature": rng.choice([0, 0.7, 2.0])}
    for key, values in (("top_p", [0.0, 0.5, 1.0]), ("seed", [0, 7, 2**31]),
                        ("presence_penalty", [-2.0, 2.0]), ("frequency_penalty", [-2.0, 2.0]),
                        ("logprobs", [0, 1, 5]), ("stop", ["a", ["b", "c"]]),
                        ("stream", [True, False])):
        if rng.random() < 0.4:
            body[key] = rng.choice(values)
    return body


def _check(r: httpx.Response, case: dict[str, Any]) -> None:
    """A result, or a 4xx with a one-line message; never a 5xx or a dead worker."""
    assert r.status_code < 500, (r.status_code, r.text[:500], case)
    text = r.text
    assert "Traceback" not in text and "worker died" not in text, (text[:500], case)
    if r.status_code >= 400:
        message = json.dumps(r.json())
        assert "\\n" not in message.strip(), (message, case)


def test_per_request_options_never_kill_the_worker(server: Harness) -> None:
    rng = random.Random(20261204)
    with httpx.Client(timeout=120) as client:
        for i in range(CASES):
            if i % 2:
                case = _openai_case(rng)
                r = client.post(server.v1 + "/completions", json=case)
            else:
                case = _ollama_case(rng)
                r = client.post(server.url + "/api/generate", json=case)
            _check(r, case)
        assert client.get(server.url + "/health").json()["status"] == "ok"
