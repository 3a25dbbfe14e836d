"""Same request, same file: our server against llama.cpp's own llama-server, in one run.

Each check in `CHECKS` (a small registry: `@check("name")`) starts llama-server (built
from the vendored llama.cpp, benchmarks/llama_tools.py) and our server (in process,
over real HTTP on loopback) on the same GGUF, sends both the same requests and lists
every difference. It prints one line per request and exits non-zero on any mismatch.

- `infill`: llama-server's /infill on Qwen2.5-Coder-0.5B-Instruct (a FIM model), greedy,
  with and without `input_extra`: the same generated text (and the same prompt tokens
  evaluated).
- `rerank`: /v1/rerank on the tiny reranker GGUFs tests/tiny_reranker.py writes
  (Qwen3-style with its rerank template, and without: llama.cpp's BOS query EOS
  document EOS; BERT-style), against `llama-server --reranking`: the same order,
  scores within 5e-4 (float noise from batching: we score up to 8 pairs in one decode,
  llama-server one per slot) and the same token counts.

    .venv/bin/python benchmarks/llama_server_parity.py [--only infill,rerank] [--threads 2]
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "benchmarks"), str(ROOT / "tests")]

from inferenceos.cluster.spawn import free_port  # noqa: E402
from inferenceos.model.packaged_models import QWEN_05B, ensure_packaged_model  # noqa: E402
from inferenceos.plan.entry import LoadRequest  # noqa: E402
from llama_tools import llama_tool  # noqa: E402
from serve_load import wait_healthy  # noqa: E402
from server_harness import start_server  # noqa: E402
from tiny_reranker import write_tiny_reranker  # noqa: E402


@dataclass
class Ctx:
    """What every check gets: the llama-server binary, a scratch folder, CPU threads."""

    binary: Path
    work: Path
    threads: int


Check = Callable[[Ctx], list[str]]  # → the mismatches found (empty: equal)
CHECKS: dict[str, Check] = {}


def check(name: str) -> Callable[[Check], Check]:
    """Register a parity check under `name` (--only picks checks by name)."""
    def register(fn: Check) -> Check:
        CHECKS[name] = fn
        return fn
    return register


def post(port: int, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    """POST JSON to 127.0.0.1:`port`; (status, decoded body)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=900)
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    r = conn.getresponse()
    out = r.status, json.loads(r.read() or b"null")
    conn.close()
    return out


@contextlib.contextmanager
def llama_server(ctx: Ctx, model: Path, args: list[str]) -> Iterator[int]:
    """llama-server on `model` with `args`; yields its port once /health answers 200."""
    port = free_port()
    log = (ctx.work / f"llama-server-{port}.log").open("w")
    proc = subprocess.Popen(
        [str(ctx.binary), "-m", str(model), "-t", str(ctx.threads), "-np", "1",
         "--host", "127.0.0.1", "--port", str(port), *args], stdout=log, stderr=log)
    try:
        try:
            wait_healthy(f"http://127.0.0.1:{port}", proc)
        except RuntimeError as exc:
            raise RuntimeError(f"llama-server: {exc}; see {log.name}") from None
        yield port
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


@contextlib.contextmanager
def our_server(ctx: Ctx, models: dict[str, Path], base: LoadRequest) -> Iterator[int]:
    """Our server, in this process, serving `models`; yields its port."""
    root = Path(tempfile.mkdtemp(dir=ctx.work))
    os.environ["INFERENCEOS_HOME"] = str(root / "home")
    h = start_server(models, root, manager_kw={"base": base})
    try:
        yield h.port
    finally:
        h.stop()


# -- infill -------------------------------------------------------------------------------

FIB_PREFIX = "def fibonacci(n: int) -> int:\n    if n < 2:\n        return n\n"
FIB_SUFFIX = '\n\n\nif __name__ == "__main__":\n    print(fibonacci(10))\n'
INFILL_REQUESTS: list[dict[str, Any]] = [
    {"input_prefix": FIB_PREFIX, "input_suffix": FIB_SUFFIX},
    {"input_prefix": FIB_PREFIX, "input_suffix": FIB_SUFFIX,
     "input_extra": [{"filename": "math_utils.py", "text": "def square(x):\n    return x * x\n"}]},
    {"input_prefix": "def is_even(n: int) -> bool:\n    return ",
     "input_suffix": "\n\n\ndef is_odd(n: int) -> bool:\n    return not is_even(n)\n",
     "prompt": "n"},
]
N_CTX = 4096  # one sequence's context on both: input_extra fits (n_ctx - n_batch + 2)
# the test suite's copy of the model (tests/conftest.py), not assembled a second time
TEST_CACHE = Path(os.environ.get("INFERENCEOS_TEST_CACHE",
                                 Path.home() / ".cache" / "inferenceos-test"))


@check("infill")
def infill(ctx: Ctx) -> list[str]:
    """/infill, greedy, on Qwen2.5-Coder-0.5B-Instruct: the same text on both."""
    model = ensure_packaged_model(QWEN_05B, base=TEST_CACHE)
    common = {"temperature": 0, "n_predict": 48, "cache_prompt": False}
    bodies = [{**b, **common} for b in INFILL_REQUESTS]
    with llama_server(ctx, model, ["-c", str(N_CTX)]) as port:
        theirs = [post(port, "/infill", b) for b in bodies]
    with our_server(ctx, {"qwen": model}, LoadRequest(n_ctx=N_CTX, threads=ctx.threads)) as port:
        ours = [post(port, "/infill", b) for b in bodies]
    bad = []
    for i, ((s1, a), (s2, b)) in enumerate(zip(theirs, ours, strict=True)):
        same = (s1 == s2 == 200 and a["content"] == b["content"]
                and a["tokens_evaluated"] == b["tokens_evaluated"])
        print(f"infill {i}: {'same' if same else 'DIFFERENT'} "
              f"(evaluated {a.get('tokens_evaluated')} / {b.get('tokens_evaluated')}) "
              f"{b.get('content')!r}")
        if not same:
            bad.append(f"infill {i}: llama-server {s1} {a!r:.300} / ours {s2} {b!r:.300}")
    return bad


# -- rerank -------------------------------------------------------------------------------

QUERY = "which words are full of vowels"
DOCUMENTS = ["xyz", "banana", "aeiou aeiou", "the cat sat", "zzz a", "a queue of ideas"]


@check("rerank")
def rerank(ctx: Ctx) -> list[str]:
    """/v1/rerank on the tiny rerankers against llama-server --reranking: the same
    order and scores."""
    bad = []
    for kind, template, arch in (("qwen3 template", True, "qwen3"),
                                 ("qwen3 plain", False, "qwen3"), ("bert", False, "bert")):
        model = write_tiny_reranker(ctx.work / f"reranker-{arch}-{template}.gguf", template,
                                    arch)
        body = {"query": QUERY, "documents": DOCUMENTS, "top_n": 5}
        with llama_server(ctx, model, ["-c", "512", "--reranking"]) as port:
            s1, a = post(port, "/v1/rerank", body)
        with our_server(ctx, {"reranker": model}, LoadRequest(n_ctx=512)) as port:
            s2, b = post(port, "/v1/rerank", body)
        ra, rb = (a or {}).get("results", []), (b or {}).get("results", [])
        same = (s1 == s2 == 200 and [r["index"] for r in ra] == [r["index"] for r in rb]
                and len(ra) == len(rb) and a["usage"] == b["usage"])
        diff = max((abs(x["relevance_score"] - y["relevance_score"])
                    for x, y in zip(ra, rb, strict=False)), default=0.0)
        same = same and diff <= 5e-4
        print(f"rerank ({kind}): {'same' if same else 'DIFFERENT'} order "
              f"{[r['index'] for r in rb]}, scores "
              f"{[round(r['relevance_score'], 5) for r in rb]} / llama-server "
              f"{[round(r['relevance_score'], 5) for r in ra]} (max diff {diff:.1e}), "
              f"usage {b.get('usage')}")
        if not same:
            bad.append(f"rerank ({kind}): llama-server {s1} {a!r:.400} / "
                       f"ours {s2} {b!r:.400}")
    return bad


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="comma-separated check names "
                    f"({', '.join(CHECKS)}); all when empty")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    names = [n for n in args.only.split(",") if n] or list(CHECKS)
    unknown = [n for n in names if n not in CHECKS]
    if unknown:
        ap.error(f"unknown checks: {', '.join(unknown)}")
    with tempfile.TemporaryDirectory() as tmp:
        ctx = Ctx(llama_tool("llama-server"), Path(tmp), args.threads)
        failures = {n: CHECKS[n](ctx) for n in names}
    for name, bad in failures.items():
        print(f"{name}: {'OK' if not bad else f'{len(bad)} mismatch(es)'}")
        for line in bad:
            print("  " + line)
    sys.exit(1 if any(failures.values()) else 0)


if __name__ == "__main__":
    main()
