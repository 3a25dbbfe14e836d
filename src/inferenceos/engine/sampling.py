"""Sampling settings and the llama.cpp sampler chain built from them.

Sampling runs inside llama.cpp's sampler chain; Python never copies the vocabulary-sized
logits array on the normal path (the greedy and top-k fast paths view it in place and
hand the chain only the best candidates, see engine.candidates).
"""

from __future__ import annotations

import ctypes
import random
from dataclasses import dataclass, field
from typing import Any

from inferenceos.engine import candidates
from inferenceos.engine.llama.lib import lib
from inferenceos.engine.logprobs import MAX_TOP_LOGPROBS
from inferenceos.errors import UsageError


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each next token. temperature 0 means greedy (deterministic)."""

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    seed: int | None = None  # None: a fresh random seed per request
    max_tokens: int = 512
    stop: tuple[str, ...] = field(default_factory=tuple)
    ignore_eos: bool = False  # generate max_tokens even past end-of-generation (benchmarks)
    grammar: str | None = None  # GBNF: output constrained to this grammar (root rule "root")
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias); -inf bans a token
    logprobs: int | None = None  # None: off; n: each token's logprob and the n most likely
    # regexes over the whole output: with any, `grammar` is lazy (llama.cpp): free text
    # until one matches, then the grammar applies from the match's first group on
    grammar_triggers: tuple[str, ...] = ()
    # speculative decoding for this request: "ngram", "self", "none", or None for the
    # engine's default (engine.speculative); verified draft tokens follow the same
    # distribution, so it changes speed, never what may be sampled
    draft: str | None = None
    # LoRA adapters for this request: (adapter file, scale) pairs, engine/lora.lora_set's
    # normal form; () is the base model. Not a sampler stage: the scheduler applies the
    # set to the context for the steps that evaluate this request (engine/lora.py)
    lora: tuple[tuple[str, float], ...] = ()

    def validate(self) -> None:
        """Raise UsageError for values llama.cpp would misbehave on."""
        checks = [
            (self.temperature >= 0, f"temperature must be >= 0, got {self.temperature}"),
            (self.top_k >= 0, f"top-k must be >= 0, got {self.top_k}"),
            # top-p 0 keeps only the most likely token (llama.cpp keeps min_keep = 1), as
            # Ollama and OpenAI pass it; it is not a refusal
            (0 <= self.top_p <= 1, f"top-p must be in [0, 1], got {self.top_p}"),
            (0 <= self.min_p <= 1, f"min-p must be in [0, 1], got {self.min_p}"),
            (self.max_tokens >= 0, f"max-tokens must be >= 0, got {self.max_tokens}"),
            (self.repeat_penalty > 0, f"repeat penalty must be > 0, got {self.repeat_penalty}"),
            (all(self.stop), "stop strings must not be empty"),
            (all(t >= 0 for t, _ in self.logit_bias), "logit bias token ids must be >= 0"),
            (
                self.draft is None or (0 < len(self.draft) <= 4096 and "\0" not in self.draft),
                "draft must name a drafter (ngram, self, none)",
            ),
            (
                self.logprobs is None or 0 <= self.logprobs <= MAX_TOP_LOGPROBS,
                f"top logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {self.logprobs}",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise UsageError(message)


def grammar_from_json_schema(schema: str) -> str:
    """A GBNF grammar accepting exactly the JSON documents valid under `schema` (JSON text).

    Raises UsageError for a schema that is not JSON or that the converter cannot handle.
    """
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    try:
        return str(json_schema_to_gbnf(schema))
    except Exception as exc:  # untrusted input into third-party code: any failure is a "no"
        raise UsageError(f"unsupported JSON schema: {type(exc).__name__}: {exc}"[:300]) from None


def _fast_path(p: SamplingParams) -> str | None:
    """"greedy" or "top_k" when the chain has an exact fast path, else None."""
    if p.grammar or p.logit_bias:
        return None
    if p.repeat_penalty != 1.0 or p.frequency_penalty or p.presence_penalty:
        return None
    if p.temperature == 0:
        return "greedy"
    return "top_k" if p.top_k > 0 else None


class SamplerChain:
    """An owned llama.cpp sampler chain; call `close()` (or use `with`) to free it.

    `vocab` (a llama_vocab pointer) is needed for grammars and logit bias.
    """

    def __init__(self, params: SamplingParams, vocab: Any = None) -> None:
        params.validate()
        ll = lib()
        self._ll = ll
        self.vocab = vocab
        self.seed = params.seed if params.seed is not None else random.randrange(2**32 - 1)
        self.ptr: Any = ll.llama_sampler_chain_init(ll.llama_sampler_chain_default_params())
        self._fast = _fast_path(params)
        self._top_k = params.top_k
        self._n_vocab = 0
        try:
            for s in self._stages(params):
                ll.llama_sampler_chain_add(self.ptr, s)
        except UsageError:
            self.close()
            raise

    def _constraints(self, p: SamplingParams) -> list[Any]:
        """Grammar and logit-bias stages, applied before any filtering."""
        ll, stages = self._ll, []
        if (p.grammar or p.logit_bias) and self.vocab is None:
            raise UsageError("grammar and logit bias need the model's vocabulary")
        if p.logit_bias:
            n_vocab = int(ll.llama_vocab_n_tokens(self.vocab))
            bad = [t for t, _ in p.logit_bias if t >= n_vocab]
            if bad:
                raise UsageError(f"logit bias names token {bad[0]}; the vocabulary has {n_vocab}")
            arr = (ll.llama_logit_bias * len(p.logit_bias))(*p.logit_bias)
            stages.append(ll.llama_sampler_init_logit_bias(n_vocab, len(p.logit_bias), arr))
        if p.grammar:
            stages.append(self._grammar(p))
        return stages

    def _grammar(self, p: SamplingParams) -> Any:
        """The grammar stage; lazy (llama.cpp's trigger patterns) when triggers are given."""
        ll = self._ll
        assert p.grammar is not None
        if p.grammar_triggers:
            pats = [t.encode() for t in p.grammar_triggers]
            arr = (ctypes.c_char_p * len(pats))(*pats)
            g = ll.llama_sampler_init_grammar_lazy_patterns(
                self.vocab, p.grammar.encode(), b"root", arr, len(pats), None, 0
            )
        else:
            g = ll.llama_sampler_init_grammar(self.vocab, p.grammar.encode(), b"root")
        if not g:
            raise UsageError("the grammar does not parse (GBNF with a 'root' rule expected)"
                             + (" or a trigger pattern is not a regex" if p.grammar_triggers
                                else ""))
        return g

    def _stages(self, p: SamplingParams) -> list[Any]:
        ll = self._ll
        stages = self._constraints(p)
        if p.repeat_penalty != 1.0 or p.frequency_penalty or p.presence_penalty:
            if self.vocab is None:
                raise UsageError("repetition penalties need the model's vocabulary")
            n_vocab = int(ll.llama_vocab_n_tokens(self.vocab))
            # this llama.cpp takes n_vocab first (llama.h of the vendored version)
            stages.append(
                ll.llama_sampler_init_penalties(
                    n_vocab, p.repeat_last_n, p.repeat_penalty, p.frequency_penalty,
                    p.presence_penalty,
                )
            )
        if p.temperature == 0:
            stages.append(ll.llama_sampler_init_greedy())
            return stages
        # llama.cpp's own default order: top-k, top-p, min-p, temperature, then draw
        if p.top_k > 0:
            stages.append(ll.llama_sampler_init_top_k(p.top_k))
        if p.top_p < 1:
            stages.append(ll.llama_sampler_init_top_p(p.top_p, 1))
        if p.min_p > 0:
            stages.append(ll.llama_sampler_init_min_p(p.min_p, 1))
        stages.append(ll.llama_sampler_init_temp(p.temperature))
        stages.append(ll.llama_sampler_init_dist(self.seed))
        return stages

    def sample(self, ctx: Any, idx: int = -1) -> int:
        """Sample (and accept) the next token from the logits of batch row `idx`.

        Greedy and top-k-first chains take the exact fast paths of engine.candidates;
        chains with grammar, logit bias or penalties go through llama_sampler_sample.
        """
        ll = self._ll
        if self._fast is None:
            return int(ll.llama_sampler_sample(self.ptr, ctx, idx))
        if not self._n_vocab:
            self._n_vocab = int(ll.llama_vocab_n_tokens(ll.llama_model_get_vocab(
                ll.llama_get_model(ctx))))
        logits = candidates.logits_row(ll, ctx, idx, self._n_vocab)
        if self._fast == "greedy":
            return int(logits.argmax())  # the first maximum, as llama.cpp's greedy picks
        token = candidates.sample_from(ll, self.ptr, logits,
                                       candidates.top_k_ids(logits, self._top_k))
        ll.llama_sampler_accept(self.ptr, token)
        return token

    @property
    def greedy(self) -> bool:
        """Whether `sample` is the argmax of the row (the greedy fast path): a step's
        greedy rows may then be picked together (candidates.greedy_rows) and each
        chain told its token with `accept`."""
        return self._fast == "greedy"

    def accept(self, token: int) -> None:
        """Tell the chain that `token` was chosen (what `sample` does after picking).
        Nothing to tell a greedy fast-path chain: its one stage (greedy) keeps no state
        (llama.cpp's chain accept would only count the token), and a ctypes call per
        token is ~1 us of the step (issue 44)."""
        if self._fast != "greedy":
            self._ll.llama_sampler_accept(self.ptr, token)

    def close(self) -> None:
        if self.ptr is not None:
            self._ll.llama_sampler_free(self.ptr)
            self.ptr = None

    def __enter__(self) -> SamplerChain:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
