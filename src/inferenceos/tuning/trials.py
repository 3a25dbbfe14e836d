"""One short real trial: prefill and decode t/s of one configuration, on llama.cpp.

`TrialRunner` keeps the loaded models between trials: a configuration that differs only
in thread counts reuses the live context (`llama_set_n_threads`); one that differs in
batch shape, flash attention, KV types or layer placement is a new `LoadedModel` (the
weights are mmap'd, so their second load mostly hits the page cache; load time is
reported apart and never counted as measurement). It holds at most two, so a duel that
alternates two configurations does not reload at every round.

A trial: a warm-up (8 prompt tokens and 2 decode steps: the first evaluation on a new
thread count pays for waking the thread pool; the whole prompt on a new context, whose
first evaluation pays for faulting in its buffers), then the prompt in n_batch chunks
(prefill t/s), then single-token decode steps on top of it in chunks of `DECODE_CHUNK` (decode
t/s), stopped early when `stop` says the rate is hopeless, or cut short (fewer tokens,
still a measurement) past `max_trial_s`. Every evaluation ends with
`llama_synchronize`, so a GPU's asynchronous work is inside the timed span.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inferenceos.engine.llama.lib import lib
from inferenceos.engine.session import LoadedModel
from inferenceos.errors import InferenceOSError
from inferenceos.plan.llama_params import LlamaParams
from inferenceos.tuning.space import Knobs

DECODE_CHUNK = 16
# English prose tokenizes to realistic ids for any vocabulary; repeated to any length
PROSE = (
    "The river rose in the night and by morning the low fields were a grey sheet of "
    "water. Farmers walked the dykes with lanterns, counting the sandbags and the hours "
    "until the tide turned, while the radio in the mill repeated the same warning. "
)


@dataclass
class TrialResult:
    """What one trial measured. `decode_tps` covers `decode_tokens` steps (fewer than
    asked when `stopped_early`); `error` is set, and both rates 0, when llama.cpp
    refused the configuration; `load_s` is 0 when a loaded context was reused."""

    knobs: Knobs
    phase: str  # baseline | search | duel | confirm
    prefill_tps: float = 0.0
    decode_tps: float = 0.0
    prompt_tokens: int = 0
    decode_tokens: int = 0
    stopped_early: bool = False
    load_s: float = 0.0
    warmup_s: float = 0.0
    elapsed_s: float = 0.0
    error: str = ""
    dimension: str = ""

    @property
    def ok(self) -> bool:
        return not self.error

    @property
    def steady_s(self) -> float:
        """What a trial of these settings costs on a context already warm: the
        measurement alone (the budget's unit)."""
        return max(self.elapsed_s - self.load_s - self.warmup_s, 0.0)

    def to_json(self) -> dict[str, Any]:
        return {
            "phase": self.phase,
            "dimension": self.dimension,
            "settings": self.knobs.to_json(),
            "label": self.knobs.label(),
            "prefill_tps": round(self.prefill_tps, 2),
            "decode_tps": round(self.decode_tps, 2),
            "prompt_tokens": self.prompt_tokens,
            "decode_tokens": self.decode_tokens,
            "stopped_early": self.stopped_early,
            "load_s": round(self.load_s, 4),
            "warmup_s": round(self.warmup_s, 4),
            "elapsed_s": round(self.elapsed_s, 4),
            "error": self.error,
        }


def load_settings(knobs: Knobs, n_ctx: int) -> LlamaParams:
    """The engine's LlamaParams for `knobs` (everything else at LlamaParams' defaults)."""
    return LlamaParams(n_ctx=n_ctx, n_batch=knobs.n_batch, n_ubatch=knobs.n_ubatch,
                       n_threads=knobs.n_threads, n_threads_batch=knobs.n_threads_batch,
                       n_gpu_layers=knobs.n_gpu_layers, flash_attn=knobs.flash_attn,
                       type_k=knobs.type_k, type_v=knobs.type_v)


def prompt_tokens(lm: LoadedModel, n: int) -> list[int]:
    """`n` tokens of English prose (the text repeated as needed), BOS first."""
    tokens = lm.tokenize(PROSE)
    body = tokens[1:] if tokens and tokens[0] == lm.bos_token else tokens
    while len(tokens) < n:
        tokens += body
    return tokens[:n]


@dataclass
class TrialRunner:
    """Runs trials of one model; `close()` frees every loaded context."""

    path: Path
    prompt_len: int = 512
    decode_len: int = 64
    # a trial's decode ends after the chunk that crosses this many seconds (a machine
    # so busy that one trial would eat the budget): fewer tokens, still a measurement
    max_trial_s: float | None = None
    _models: OrderedDict[tuple[Any, ...], LoadedModel] = field(default_factory=OrderedDict)
    _tokens: list[int] = field(default_factory=list)

    @property
    def n_ctx(self) -> int:
        """Context of every trial: the prompt, the decode steps and the warm-up."""
        return self.prompt_len + self.decode_len + 64

    def _model(self, knobs: Knobs) -> tuple[LoadedModel, float]:
        key = knobs.context_key()
        lm = self._models.get(key)
        if lm is not None:
            self._models.move_to_end(key)
            return lm, 0.0
        while len(self._models) >= 2:
            self._models.popitem(last=False)[1].close()
        t0 = time.perf_counter()
        lm = LoadedModel(self.path, load_settings(knobs, self.n_ctx))
        self._models[key] = lm
        if not self._tokens:
            self._tokens = prompt_tokens(lm, self.prompt_len)
        return lm, time.perf_counter() - t0

    def run(
        self,
        knobs: Knobs,
        phase: str,
        stop: Callable[[float], bool] | None = None,
        skip_decode: Callable[[float], bool] | None = None,
        dimension: str = "",
    ) -> TrialResult:
        """Measure `knobs`. `skip_decode(prefill_tps)` may skip the decode part and
        `stop(partial_decode_tps)` end it after any chunk (the trial is then marked
        `stopped_early`). A configuration llama.cpp refuses gives a result with `error`."""
        res = TrialResult(knobs, phase, dimension=dimension)
        t_start = time.perf_counter()
        try:
            lm, res.load_s = self._model(knobs)
            self._measure(lm, knobs, res, stop, skip_decode)
        except InferenceOSError as exc:
            res.error = str(exc)
            res.prefill_tps = res.decode_tps = 0.0
        res.elapsed_s = time.perf_counter() - t_start
        return res

    def _measure(
        self,
        lm: LoadedModel,
        knobs: Knobs,
        res: TrialResult,
        stop: Callable[[float], bool] | None,
        skip_decode: Callable[[float], bool] | None,
    ) -> None:
        ll = lib()
        ll.llama_set_n_threads(lm.ctx, knobs.n_threads, knobs.n_threads_batch)
        tokens = self._tokens
        t_start = time.perf_counter()
        lm.reset()  # warm-up: wake the thread pool at this thread count; on a new
        # context the whole prompt, so the first touch of the compute buffers is untimed
        lm.prefill(tokens if res.load_s else tokens[:8])
        lm.decode_one(tokens[8])
        lm.decode_one(tokens[9])
        ll.llama_synchronize(lm.ctx)
        lm.reset()
        t0 = time.perf_counter()
        res.warmup_s = t0 - t_start
        lm.prefill(tokens)
        ll.llama_synchronize(lm.ctx)
        res.prompt_tokens = len(tokens)
        res.prefill_tps = len(tokens) / (time.perf_counter() - t0)
        if skip_decode is not None and skip_decode(res.prefill_tps):
            res.stopped_early = True
            return
        token = tokens[-1]
        t0 = time.perf_counter()
        while res.decode_tokens < self.decode_len:
            for _ in range(min(DECODE_CHUNK, self.decode_len - res.decode_tokens)):
                lm.decode_one(token)
                res.decode_tokens += 1
            ll.llama_synchronize(lm.ctx)
            now = time.perf_counter()
            res.decode_tps = res.decode_tokens / (now - t0)
            if res.decode_tokens < self.decode_len and stop is not None and stop(res.decode_tps):
                res.stopped_early = True
                return
            if self.max_trial_s is not None and now - t_start > self.max_trial_s:
                return

    def close(self) -> None:
        while self._models:
            self._models.popitem()[1].close()

    def __enter__(self) -> TrialRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
