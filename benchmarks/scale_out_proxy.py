"""Run docs/scale-out.md's LiteLLM proxy config as written, in front of two replicas.

Copies the first ```yaml block of docs/scale-out.md to a temporary file, starts two
`inferenceos serve` replicas (benchmarks/scale_out.py's `start_replica`) and
`litellm --config` on 127.0.0.1:4011 with the replicas' addresses in the environment
variables the config names, then sends through the proxy: one chat, four two-turn
conversations with `x-litellm-session-id` (which replica answered each turn, and the
second turn's cached tokens), one chat to the `gemma-ollama` group, one bad request
(`top_p: 7`: how many replicas saw it), and `GET /health`. Prints what it saw.

    python benchmarks/scale_out_proxy.py [--model PATH]

Needs LiteLLM's proxy dependencies (`pip install 'litellm[proxy]'`, not in the test
extra); LITELLM_PROXY_PATH is prepended to the proxy's PYTHONPATH for a directory of
them installed beside the venv. Loopback only; every wait is bounded.
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scale_out import DEFAULT_MODEL, ROOT, start_replica

PROXY = "http://127.0.0.1:4011"
MASTER_KEY = "sk-" + secrets.token_hex(16)


def proxy_env(bases: list[str]) -> dict[str, str]:
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_OFFLINE_MODE": "true",
           "INFERENCEOS_API_KEY": "none", "LITELLM_MASTER_KEY": MASTER_KEY}
    if os.environ.get("LITELLM_PROXY_PATH"):
        env["PYTHONPATH"] = os.environ["LITELLM_PROXY_PATH"]
    for i, base in enumerate(bases):
        env[f"INFERENCEOS_REPLICA_{i}"], env[f"INFERENCEOS_V1_{i}"] = base, base + "/v1"
    return env


def chat(model: str = "gemma", session: str | None = None,
         messages: list[dict[str, str]] | None = None, **kw: Any) -> httpx.Response:
    headers = {"Authorization": "Bearer " + MASTER_KEY}
    if session:
        headers["x-litellm-session-id"] = session
    body = {"model": model, "max_tokens": 8, "temperature": 0,
            "messages": messages or [{"role": "user", "content": "Say hi"}], **kw}
    return httpx.post(PROXY + "/v1/chat/completions", json=body, headers=headers, timeout=120)


def chat_4xx(bases: list[str]) -> float:
    """4xx answers of /v1/chat/completions over the replicas, from their /metrics."""
    total = 0.0
    for base in bases:
        for line in httpx.get(base + "/metrics", timeout=10).text.splitlines():
            if (line.startswith("inferenceos:http_requests_total{")
                    and 'route="/v1/chat/completions"' in line and 'status="4' in line):
                total += float(line.rsplit(" ", 1)[1])
    return total


def exercise(bases: list[str]) -> None:
    r = chat()
    print("chat:", r.status_code, r.headers.get("x-litellm-model-id"))
    story = "A long shared system prompt about lighthouses and their keepers. " * 8
    for s in ("conv-a", "conv-b", "conv-c", "conv-d"):
        msgs = [{"role": "system", "content": story}, {"role": "user", "content": f"Name {s}."}]
        first = chat(session=s, messages=msgs)
        msgs += [{"role": "assistant", "content": first.json()["choices"][0]["message"]["content"]},
                 {"role": "user", "content": "Again."}]
        second = chat(session=s, messages=msgs)
        print(f"session {s}: turn 1 {first.headers.get('x-litellm-model-id')}, turn 2 "
              f"{second.headers.get('x-litellm-model-id')}, cached "
              f"{second.json()['usage'].get('prompt_tokens_details')}")
    r = chat("gemma-ollama")
    print("gemma-ollama:", r.status_code, r.headers.get("x-litellm-model-id"))
    before = chat_4xx(bases)
    r = chat(top_p=7)
    seen = chat_4xx(bases) - before
    print("top_p 7:", r.status_code, f"(answered 4xx by the replicas' /v1: {seen:g})")
    health = httpx.get(PROXY + "/health", headers={"Authorization": "Bearer " + MASTER_KEY},
                       timeout=120).json()
    print("health: healthy", len(health.get("healthy_endpoints", [])), "unhealthy",
          len(health.get("unhealthy_endpoints", [])))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    args = ap.parse_args()
    litellm = shutil.which("litellm", path=str(Path(sys.executable).parent)) or "litellm"
    doc = (ROOT / "docs" / "scale-out.md").read_text()
    found = re.search(r"```yaml\n(.*?)```", doc, re.S)
    if found is None:
        raise SystemExit("no ```yaml block in docs/scale-out.md")
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "litellm.yaml"
        config.write_text(found.group(1))
        replicas = [start_replica(args.model, 1, 4, Path(tmp) / str(i)) for i in range(2)]
        bases = [b for _, b in replicas]
        log = (Path(tmp) / "proxy.log").open("w")
        proxy = subprocess.Popen([litellm, "--config", str(config), "--host", "127.0.0.1",
                                  "--port", "4011"], env=proxy_env(bases), stdout=log,
                                 stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 240
            while True:
                try:
                    if httpx.get(PROXY + "/health/liveliness", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if proxy.poll() is not None or time.monotonic() > deadline:
                    log.flush()
                    tail = (Path(tmp) / "proxy.log").read_text()[-3000:]
                    raise SystemExit(f"the proxy did not start:\n{tail}")
                time.sleep(1)
            exercise(bases)
        finally:
            proxy.terminate()
            proxy.wait(30)
            for p, _ in replicas:
                p.terminate()
                p.wait(30)


if __name__ == "__main__":
    main()
