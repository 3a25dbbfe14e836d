"""Same request, same answer: how often an identical temperature-0 request changes its
output when its prompt prefix is cached, or when it is batched with another request,
against the same request run cold on a fresh engine.

    python benchmarks/determinism.py [--model GGUF] [--threads N] [--tokens N]

Each mode runs the same prompts: `separate` (the scheduler's rule: the last prompt token
evaluated in a step of its own where its sequence runs alone, engine/step_plan.py) and
`baseline` (that rule off: the whole prompt in one batch, as before). Per mode it
prints how many replies diverged from the cold reply (and at which token), and the cold
TTFT, so the rule's price is printed beside what it buys (ratio separate / baseline).
"""

from __future__ import annotations

import argparse
import statistics
import threading
from dataclasses import dataclass
from pathlib import Path

from inferenceos.engine import step_plan
from inferenceos.engine.chat_template import ChatMessage
from inferenceos.engine.local import LocalEngine
from inferenceos.engine.sampling import SamplingParams
from inferenceos.plan.llama_params import LlamaParams

QUESTIONS = [
    "What is the weather like in Berlin today? Use a tool if you need one.",
    "Write a Python function that reverses a string.",
    "Explain what a hash map is in two sentences.",
    "List three prime numbers greater than 100.",
    "What is the capital of Australia and why is it not Sydney?",
    "Translate 'good morning' into French, German and Spanish.",
    "Write a haiku about compilers.",
    "Give me a SQL query that counts rows per day in a table named events.",
    "What does the Unix command `grep -rn` do?",
    "Summarise the plot of Romeo and Juliet in one paragraph.",
    "Why is the sky blue? Answer for a ten-year-old.",
    "Write a bash loop that prints the numbers 1 to 5.",
]
OTHER = "Tell me a long story about a cat who learns to program."


def _reply(eng: LocalEngine, prompt: str, n: int) -> tuple[list[int], float]:
    gen = eng.generate(prompt, SamplingParams(temperature=0, max_tokens=n))
    tokens = [e.token for e in gen if e.token >= 0]
    return tokens, gen.metrics.ttft_s


def diverges(a: list[int], b: list[int]) -> int | None:
    """The first token where b differs from a (None: identical)."""
    i = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
    if i is None and len(a) != len(b):
        return min(len(a), len(b))
    return i


def _batched(model: Path, settings: LlamaParams, prompt: str, n: int) -> list[int]:
    """The reply to `prompt` while another request generates beside it."""
    with LocalEngine(model, settings, n_parallel=2) as eng:
        out: dict[str, list[int]] = {}
        other = eng.chat_prompt([ChatMessage("user", OTHER)])
        t = threading.Thread(target=lambda: out.setdefault("o", _reply(eng, other, n)[0]))
        t.start()
        out["x"] = _reply(eng, prompt, n)[0]
        t.join()
    return out["x"]


@dataclass(frozen=True)
class ModeResult:
    cached: list[int | None]  # per prompt: the first token that differed, None: same
    batched: list[int | None]
    ttft_ms: float  # the median cold TTFT


def run_mode(model: Path, settings: LlamaParams, n: int) -> ModeResult:
    cached: list[int | None] = []
    batched: list[int | None] = []
    ttft: list[float] = []
    for q in QUESTIONS:
        with LocalEngine(model, settings, n_parallel=2) as eng:
            prompt = eng.chat_prompt([ChatMessage("user", q)])
            cold, t = _reply(eng, prompt, n)
            again, _ = _reply(eng, prompt, n)  # the whole prompt but its last token cached
        ttft.append(t)
        cached.append(diverges(cold, again))
        batched.append(diverges(cold, _batched(model, settings, prompt, n)))
    return ModeResult(cached, batched, statistics.median(ttft) * 1000)


def _count(xs: list[int | None]) -> str:
    at = [x for x in xs if x is not None]
    return f"{len(at)}/{len(xs)}" + (f" (at tokens {at})" if at else "")


def main() -> None:
    from inferenceos.model.packaged_models import ensure_packaged_model

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=None,
                    help="a GGUF (default: Qwen2.5-Coder-0.5B-Instruct from its packages)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=48)
    args = ap.parse_args()
    model = args.model or ensure_packaged_model("qwen2.5-coder-0.5b-instruct")
    settings = LlamaParams(n_ctx=2048, n_batch=512, n_ubatch=512, n_threads=args.threads)
    results = {}
    for mode, flag in (("baseline", False), ("separate", True)):
        step_plan.SEPARATE_LAST_TOKEN = flag
        results[mode] = run_mode(model, settings, args.tokens)
    print(f"{model.name}, {args.threads} thread(s), {len(QUESTIONS)} prompts, "
          f"{args.tokens} tokens, temperature 0; replies that diverged from the cold one:")
    for mode, r in results.items():
        print(f"  {mode:9s} cached {_count(r.cached)}  batched {_count(r.batched)}  "
              f"cold TTFT {r.ttft_ms:.0f} ms")
    ratio = results["separate"].ttft_ms / results["baseline"].ttft_ms
    print(f"cold TTFT separate / baseline: {ratio:.2f}x")


if __name__ == "__main__":
    main()
