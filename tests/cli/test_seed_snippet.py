"""The seed README's quick start, verbatim: `inferenceos serve models/llama-3-8b-instruct.
Q4_K_M.gguf --port N --backend auto`, then its OpenAI snippet streams an answer from
`model="llama-3-8b-instruct"` (only the port differs: 11434 may be taken here). A name
that is not served gets a 404 that lists the names that work."""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from cli_helpers import cli_env
from tiny_models import write_tiny_model

SNIPPET = '''
from openai import OpenAI

client = OpenAI(base_url="http://localhost:{port}/v1", api_key="inferenceos")
response = client.chat.completions.create(
    model="llama-3-8b-instruct",
    messages=[{{"role": "user", "content": "What makes InferenceOS adaptive?"}}],
    stream=True
)

for chunk in response:
    if chunk.choices[0].delta.content:
        print(chunk.choices[0].delta.content, end="", flush=True)
'''


@contextlib.contextmanager
def _serve(model: Path, port: int, *extra: str) -> Iterator[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "inferenceos", "serve", str(model), "--port", str(port),
         "--backend", "auto", "--ctx", "256", "--threads", "1", "--parallel", "1", *extra],
        env=cli_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(base + "/health", timeout=1).status_code == 200:
                    break
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr
            time.sleep(0.2)
        yield base
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)


def test_the_seed_quick_start_works_verbatim(tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    model = write_tiny_model(tmp_path / "models" / "llama-3-8b-instruct.Q4_K_M.gguf",
                             letters_only=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with _serve(model, port) as base:
        res = subprocess.run([sys.executable, "-c", SNIPPET.format(port=port)],
                             capture_output=True, text=True, timeout=120, env=cli_env())
        assert res.returncode == 0, res.stderr
        assert res.stdout.strip()  # the tiny model streamed some text
        r = httpx.post(base + "/v1/chat/completions", timeout=30, json={
            "model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 404
        err = r.json()["error"]["message"]
        assert "llama-3-8b-instruct:latest" in err and "llama-3-8b-instruct.q4_k_m" in err


def test_llama_server_flags_any_model_and_n_predict(tmp_path: Path) -> None:
    """`serve --any-model --n-predict 3`: a hard-coded foreign model name reaches the
    default model, and a llama.cpp /completion without n_predict generates 3 tokens."""
    model = write_tiny_model(tmp_path / "tiny.gguf", letters_only=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with _serve(model, port, "--any-model", "--n-predict", "3", "--seed", "7") as base:
        r = httpx.post(base + "/v1/chat/completions", timeout=60, json={
            "model": "gpt-4o", "max_tokens": 2,
            "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200, r.text
        r = httpx.post(base + "/completion", timeout=60,
                       json={"prompt": "ab", "ignore_eos": True})
        assert r.status_code == 200, r.text
        assert r.json()["tokens_predicted"] == 3


def test_served_file_is_registered_and_kv_policy_is_served(tmp_path: Path) -> None:
    """`serve FILE --kv-policy h2o`: the planner turns flash attention off for H2O, a
    request is answered, and `models show NAME` finds the model serve named."""
    import json

    from cli_helpers import run_cli

    model = write_tiny_model(tmp_path / "tiny.gguf", letters_only=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with _serve(model, port, "--kv-policy", "h2o") as base:
        r = httpx.post(base + "/api/generate", timeout=60, json={
            "prompt": "ab", "stream": False, "options": {"num_predict": 3}})
        assert r.status_code == 200, r.text
        shown = run_cli("models", "show", "tiny", "--json")
        assert shown.returncode == 0, shown.stderr
        assert json.loads(shown.stdout)["name"] == "tiny:latest"
