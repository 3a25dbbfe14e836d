"""llama-server's response figures, shared by the llama.cpp and OpenAI routes.

- `timings(metrics)`: llama-server's `timings` object (prompt and generation counts,
  milliseconds and speeds) from our `GenerationMetrics`;
- `generation_settings(...)`: its `generation_settings` for what our sampler chain runs;
- `probabilities(events, post)`: its `completion_probabilities` from the engine's
  token log-probabilities.
"""

from __future__ import annotations

import math
from typing import Any

from inferenceos.engine.generation import GenerationMetrics, TokenEvent
from inferenceos.engine.logprobs import TokenLogprob
from inferenceos.engine.sampling import SamplingParams
from inferenceos.server.logprobs import FLOOR

RANDOM_SEED = 0xFFFFFFFF  # LLAMA_DEFAULT_SEED: "pick a random seed"


def timings(m: GenerationMetrics) -> dict[str, Any]:
    """llama-server's `timings` from our metrics (prompt_n counts the tokens actually
    evaluated, cache_n those reused from the KV cache)."""
    prompt_n = max(0, m.prompt_tokens - m.cached_tokens)
    prompt_ms = prompt_n / m.prompt_tps * 1000 if m.prompt_tps else m.ttft_s * 1000
    predicted_ms = m.completion_tokens / m.decode_tps * 1000 if m.decode_tps else 0.0
    return {
        "cache_n": m.cached_tokens,
        "prompt_n": prompt_n, "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
        "prompt_per_second": m.prompt_tps,
        "predicted_n": m.completion_tokens, "predicted_ms": predicted_ms,
        "predicted_per_token_ms": predicted_ms / m.completion_tokens if m.completion_tokens
        else 0.0,
        "predicted_per_second": m.decode_tps,
    }


def generation_settings(s: SamplingParams, n_predict: int, stream: bool, n_probs: int = 0,
                        eog_bias: tuple[int, ...] = (), post_sampling_probs: bool = False
                        ) -> dict[str, Any]:
    """llama-server's `generation_settings` for what our sampler chain really runs
    (samplers we do not have are reported at their disabled values)."""
    bias = [{"bias": None if math.isinf(b) else b, "token": t} for t, b in s.logit_bias]
    bias += [{"bias": None, "token": t} for t in eog_bias]
    samplers = (["penalties"] if s.repeat_penalty != 1 or s.frequency_penalty
                or s.presence_penalty else [])
    samplers += (["top_k", "top_p", "min_p", "temperature"] if s.temperature > 0 else [])
    return {
        "seed": RANDOM_SEED if s.seed is None else s.seed, "temperature": s.temperature,
        "dynatemp_range": 0.0, "dynatemp_exponent": 1.0, "top_k": s.top_k, "top_p": s.top_p,
        "min_p": s.min_p, "top_n_sigma": -1.0, "xtc_probability": 0.0, "xtc_threshold": 0.1,
        "typical_p": 1.0, "repeat_last_n": s.repeat_last_n, "repeat_penalty": s.repeat_penalty,
        "presence_penalty": s.presence_penalty, "frequency_penalty": s.frequency_penalty,
        "dry_multiplier": 0.0, "dry_base": 1.75, "dry_allowed_length": 2,
        "dry_penalty_last_n": -1, "dry_sequence_breakers": [], "mirostat": 0,
        "mirostat_tau": 5.0, "mirostat_eta": 0.1, "adaptive_target": -1.0,
        "adaptive_decay": 0.9, "stop": list(s.stop), "max_tokens": n_predict,
        "n_predict": n_predict, "n_keep": 0, "n_discard": 0, "ignore_eos": s.ignore_eos,
        "stream": stream, "logit_bias": bias, "n_probs": n_probs, "min_keep": 0,
        "grammar": s.grammar or "", "grammar_lazy": bool(s.grammar_triggers),
        "grammar_triggers": [], "preserved_tokens": [], "chat_format": "Content-only",
        "reasoning_format": "none", "reasoning_in_content": False, "samplers": samplers,
        "speculative.types": "none", "timings_per_token": False,
        "post_sampling_probs": post_sampling_probs, "backend_sampling": False, "lora": [],
    }


def _piece_text(piece: bytes) -> str:
    # llama.cpp cuts a piece to its valid UTF-8 prefix; `bytes` carries it exactly
    return piece.decode("utf-8", errors="ignore")


def _prob_entry(lp: TokenLogprob, post: bool) -> dict[str, Any]:
    logprob = lp.logprob if math.isfinite(lp.logprob) and lp.logprob > FLOOR else FLOOR
    value = {"prob": math.exp(logprob)} if post else {"logprob": logprob}
    return {"id": lp.token, "token": _piece_text(lp.piece), "bytes": list(lp.piece), **value}


def probabilities(events: list[TokenEvent], post: bool) -> list[dict[str, Any]]:
    """`completion_probabilities`: per token, its figure and the n most likely. The
    figures are the model's own distribution (before temperature and truncation), also
    under `post_sampling_probs` (then as probabilities, `prob` / `top_probs`)."""
    out = []
    for ev in events:
        if ev.logprob is None:
            continue
        top = [_prob_entry(t, post) for t in ev.top_logprobs]
        if post:
            top = [t for t in top if t["prob"] > 0.0]
        key = "top_probs" if post else "top_logprobs"
        out.append({**_prob_entry(ev.logprob, post), key: top})
    return out


def stopping_word(stops: tuple[str, ...], reason: str, tail: str) -> str:
    """Which stop string ended the text: the one found in what the engine held back."""
    if reason != "stop":
        return ""
    return next((s for s in stops if s in tail), stops[0] if len(stops) == 1 else "")
