"""The benchmark matrix behind `inferenceos benchmark`: threads × batch × context ×
concurrency, each point measured through the serving engine, against llama.cpp's
defaults measured in the same run.

Every point runs through `Engine` (the worker process and continuous-batching scheduler
the server uses), so the rows are comparable with each other and with what the server
does. One engine serves every concurrency level of one (threads, batch, context) group:
it is started with `n_parallel` = the largest concurrency, and `c` streams at once use
`c` of its slots. Each stream gets its own prompt (a distinct first token), so no stream
reuses another's cached prefix.

Per point: `prefill_tps` = all prompt tokens / the time until the last stream's first
token (the prompt work of the whole batch), `decode_tps` = the mean of the streams'
decode t/s (what one user sees), `total_tps` = generated tokens per second summed over
the streams (what the machine delivers), `ttft_s` = the mean time to first token.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inferenceos.engine.engine import Engine
from inferenceos.engine.generation import GenerationMetrics
from inferenceos.engine.sampling import SamplingParams
from inferenceos.errors import InferenceOSError, UsageError
from inferenceos.plan.llama_params import LlamaParams
from inferenceos.tuning.space import LLAMA_N_BATCH, LLAMA_N_UBATCH, physical_cores
from inferenceos.tuning.trials import PROSE

LLAMA_N_CTX = 4096  # llama-cli / llama-server's default context


@dataclass(frozen=True)
class Point:
    """One configuration of the matrix; `baseline` marks llama.cpp's defaults."""

    threads: int
    n_batch: int
    n_ctx: int
    concurrency: int
    baseline: bool = False

    @property
    def n_ubatch(self) -> int:
        return min(LLAMA_N_UBATCH, self.n_batch)

    def label(self) -> str:
        name = f"t{self.threads} b{self.n_batch} ctx{self.n_ctx} ×{self.concurrency}"
        return f"llama.cpp defaults ({name})" if self.baseline else name

    def settings(self) -> LlamaParams:
        return LlamaParams(n_ctx=self.n_ctx, n_batch=self.n_batch, n_ubatch=self.n_ubatch,
                           n_threads=self.threads, n_threads_batch=self.threads)

    def to_json(self) -> dict[str, Any]:
        return {"threads": self.threads, "n_batch": self.n_batch, "n_ubatch": self.n_ubatch,
                "n_ctx": self.n_ctx, "concurrency": self.concurrency,
                "baseline": self.baseline}


@dataclass
class Row:
    """What one point measured (medians over rounds); `error` when it could not run."""

    point: Point
    prefill_tps: float = 0.0
    decode_tps: float = 0.0
    total_tps: float = 0.0
    ttft_s: float = 0.0
    load_s: float = 0.0
    error: str = ""
    metrics: list[GenerationMetrics] = field(default_factory=list)

    def ratio(self, base: Row, key: str) -> float:
        ref = getattr(base, key)
        return getattr(self, key) / ref if ref > 0 else 0.0

    def to_json(self, base: Row | None = None) -> dict[str, Any]:
        out = {
            **self.point.to_json(),
            "label": self.point.label(),
            "prefill_tps": round(self.prefill_tps, 2),
            "decode_tps": round(self.decode_tps, 2),
            "total_tps": round(self.total_tps, 2),
            "ttft_s": round(self.ttft_s, 4),
            "load_s": round(self.load_s, 3),
            "error": self.error,
        }
        if base is not None and not self.error:
            out["vs_baseline"] = {k: round(self.ratio(base, k), 3)
                                  for k in ("prefill_tps", "decode_tps", "total_tps")}
        return out


def baseline_point() -> Point:
    """llama.cpp's defaults: a thread per physical core, batch 2048, context 4096, one
    stream."""
    return Point(physical_cores(), LLAMA_N_BATCH, LLAMA_N_CTX, 1, baseline=True)


def points(
    threads: Sequence[int],
    batches: Sequence[int],
    contexts: Sequence[int],
    concurrency: Sequence[int],
) -> list[Point]:
    """The baseline, then the cartesian product (threads outermost, concurrency
    innermost, so one engine serves consecutive points)."""
    for name, values in (("threads", threads), ("batch", batches), ("context", contexts),
                         ("concurrency", concurrency)):
        if not values or min(values) < 1:
            raise UsageError(f"--{name} needs positive values")
    out = [baseline_point()]
    for t in dict.fromkeys(threads):
        for b in dict.fromkeys(batches):
            for c in dict.fromkeys(contexts):
                out += [Point(t, b, c, n) for n in dict.fromkeys(concurrency)]
    return out


def _prompts(engine: Engine, n: int, length: int) -> list[list[int]]:
    """`n` prompts of `length` tokens that differ from their second token on."""
    tokens = engine.tokenize(PROSE * (1 + length // 40))
    bos, body = tokens[:1], tokens[1:]
    out = []
    for i in range(n):
        rotated = body[i % len(body):] + body[: i % len(body)]
        out.append((bos + rotated * (1 + length // max(1, len(body))))[:length])
    return out


def _measure(engine: Engine, point: Point, prompt_len: int, gen_len: int,
             first: int = 0) -> Row:
    """One round of `point.concurrency` streams at once (prompts `first`, `first` + 1,
    ... of `_prompts`)."""
    sampling = SamplingParams(temperature=0, max_tokens=gen_len, ignore_eos=True)
    prompts = _prompts(engine, first + point.concurrency, prompt_len)[first:]
    metrics: list[GenerationMetrics] = [GenerationMetrics() for _ in prompts]
    errors: list[str] = []
    first_token_at: list[float] = [0.0] * len(prompts)
    start = time.perf_counter()

    def stream(i: int) -> None:
        try:
            gen = engine.generate(prompts[i], sampling)
            for ev in gen:
                if ev.token >= 0 and not first_token_at[i]:
                    first_token_at[i] = time.perf_counter() - start
            metrics[i] = gen.metrics
        except InferenceOSError as exc:
            errors.append(str(exc))

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(len(prompts))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        return Row(point, error=errors[0])
    last_first = max(first_token_at) or 1e-9
    return Row(
        point,
        prefill_tps=sum(len(p) for p in prompts) / last_first,
        decode_tps=statistics.mean(m.decode_tps for m in metrics),
        total_tps=sum(m.decode_tps for m in metrics),
        ttft_s=statistics.mean(m.ttft_s for m in metrics),
        metrics=metrics,
    )


def _median_row(rounds: list[Row]) -> Row:
    ok = [r for r in rounds if not r.error]
    if not ok:
        return rounds[0]
    row = Row(rounds[0].point, metrics=[m for r in ok for m in r.metrics])
    for key in ("prefill_tps", "decode_tps", "total_tps", "ttft_s"):
        setattr(row, key, statistics.median(getattr(r, key) for r in ok))
    return row


def run_matrix(
    path: Path,
    pts: list[Point],
    prompt_len: int = 128,
    gen_len: int = 32,
    rounds: int = 1,
    on_row: Callable[[Row], None] = lambda r: None,
) -> list[Row]:
    """Measure every point (`rounds` rounds each, medians kept), in order. A group whose
    engine cannot start gives rows with `error` instead of raising."""
    if prompt_len < 2 or gen_len < 1 or rounds < 1:
        raise UsageError("--prompt-tokens must be >= 2, --gen-tokens and --rounds >= 1")
    too_small = [p.n_ctx for p in pts if p.n_ctx <= prompt_len + gen_len]
    if too_small:
        raise UsageError(f"a context of {min(too_small)} cannot hold {prompt_len} prompt + "
                         f"{gen_len} generated tokens")
    groups: dict[tuple[Any, ...], list[Point]] = {}
    for p in pts:
        groups.setdefault((p.threads, p.n_batch, p.n_ctx, p.baseline), []).append(p)
    rows: dict[Point, Row] = {}
    for group in groups.values():
        n_parallel = max(p.concurrency for p in group)
        try:
            engine = Engine(path, group[0].settings(), n_parallel=n_parallel)
        except InferenceOSError as exc:
            for p in group:
                rows[p] = Row(p, error=str(exc))
                on_row(rows[p])
            continue
        with engine:
            # the first request of a new worker pays for faulting in its buffers and
            # starting its threads: a warm-up stream, untimed, with its own prompt
            _measure(engine, group[0], prompt_len, min(gen_len, 4), first=len(group))
            for p in group:
                row = _median_row([_measure(engine, p, prompt_len, gen_len)
                                   for _ in range(rounds)])
                row.load_s = engine.load_s
                rows[p] = row
                on_row(row)
    return [rows[p] for p in pts]
