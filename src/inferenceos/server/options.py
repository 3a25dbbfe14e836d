"""Request parameters → `SamplingParams`, load overrides and keep-alive seconds.

The dialects name the same knobs differently; all end up here so the mapping is
written once (`request_sampling` for request models whose fields share SamplingParams'
names, `ollama_options` for Ollama's `options`; llama-server's body: llamacpp_schema).
Values are validated by `SamplingParams.validate()` (UsageError → 400).
"""

from __future__ import annotations

import re
from typing import Any

from inferenceos.engine.sampling import SamplingParams
from inferenceos.errors import UsageError

UNLIMITED = 1 << 30  # "until end of text or context": the engine caps at the context
MAX_STOPS = 16
_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_keep_alive(value: str | float | int | None) -> float | None:
    """Ollama's keep_alive: seconds as a number, or a Go duration ("5m", "1h30m",
    "-1m"); negative means forever, 0 unload at once, None the server's default."""
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise UsageError("keep_alive must be a duration such as '5m' or a number of seconds")
    if isinstance(value, (int, float)):
        return float(value)
    text = value.strip()
    sign = -1.0 if text.startswith("-") else 1.0
    body = text.lstrip("+-")
    try:
        return sign * float(body)  # a bare number: seconds
    except ValueError:
        pass
    parts = _DURATION.findall(body)
    if not parts or "".join(n + u for n, u in parts) != body:
        raise UsageError(f"invalid keep_alive duration {value[:40]!r}; use e.g. '5m' or '30s'")
    return sign * sum(float(n) * _UNIT_S[u] for n, u in parts)


def stops(value: str | list[str] | None) -> tuple[str, ...]:
    """A stop string or list of them, bounded in number."""
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else list(value)
    if len(items) > MAX_STOPS:
        raise UsageError(f"at most {MAX_STOPS} stop strings, got {len(items)}")
    return tuple(s for s in items if s)


def sampling_from(fields: dict[str, Any]) -> SamplingParams:
    """SamplingParams from the non-None entries of `fields` (our own field names)."""
    known = SamplingParams.__dataclass_fields__
    params = SamplingParams(**{k: v for k, v in fields.items() if v is not None and k in known})
    params.validate()
    return params


# request fields every dialect that has them names as SamplingParams does (OpenAI's,
# the Responses API's, sessions', Anthropic's; llama.cpp's extensions among them)
SHARED_SAMPLING = ("temperature", "top_p", "top_k", "min_p", "seed", "repeat_penalty",
                   "presence_penalty", "frequency_penalty", "draft")


def request_sampling(body: object, **fields: Any) -> SamplingParams:
    """SamplingParams from a request model: its `SHARED_SAMPLING` fields (those it
    has), then the dialect's own mapping in `fields` (stop, max_tokens, grammar...;
    None entries, in either, are left to the defaults)."""
    shared = {name: getattr(body, name, None) for name in SHARED_SAMPLING}
    return sampling_from({**shared, **fields})


# Ollama's option names → SamplingParams fields
_OLLAMA_SAMPLING = {
    "temperature": "temperature", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p",
    "repeat_penalty": "repeat_penalty", "repeat_last_n": "repeat_last_n",
    "frequency_penalty": "frequency_penalty", "presence_penalty": "presence_penalty",
    "seed": "seed",
}
# Ollama's option names → LoadRequest fields (the planner's input: a change of context
# resizes an idle model, any other change reloads it)
_OLLAMA_LOAD = {"num_ctx": "n_ctx", "num_batch": "n_batch", "num_thread": "threads",
                "num_gpu": "gpu_layers"}


def _number(name: str, value: Any, kind: type) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UsageError(f"option {name} must be a number, got {value!r}"[:200])
    if kind is int:
        if float(value) != int(value):
            raise UsageError(f"option {name} must be an integer, got {value!r}")
        return int(value)
    return float(value)


def ollama_options(options: dict[str, Any] | None) -> tuple[SamplingParams, dict[str, Any]]:
    """Ollama `options` → (sampling, load overrides). Unknown options are ignored, as
    Ollama does; num_predict -1 means unlimited and -2 fill the context."""
    opts = options or {}
    fields: dict[str, Any] = {}
    for key, field in _OLLAMA_SAMPLING.items():
        if opts.get(key) is not None:
            kind = int if field in ("top_k", "repeat_last_n", "seed") else float
            fields[field] = _number(key, opts[key], kind)
    if opts.get("num_predict") is not None:
        n = _number("num_predict", opts["num_predict"], int)
        fields["max_tokens"] = UNLIMITED if n < 0 else n
    if opts.get("stop") is not None:
        fields["stop"] = stops(opts["stop"])
    if opts.get("draft") is not None:  # InferenceOS extension: speculative decoding
        if not isinstance(opts["draft"], str) or len(opts["draft"]) > 64:
            raise UsageError("option draft must name a drafter (ngram, none)")
        fields["draft"] = opts["draft"]
    overrides: dict[str, int] = {}
    for key, field in _OLLAMA_LOAD.items():
        if opts.get(key) is not None:
            value = _number(key, opts[key], int)
            if value == 0 and key == "num_thread":
                continue  # Ollama's 0: the runtime decides (here: the plan's threads)
            if value <= 0 and key != "num_gpu":
                raise UsageError(f"option {key} must be positive, got {value}")
            overrides[field] = value
    if "n_ctx" in overrides and overrides["n_ctx"] < 16:
        raise UsageError("option num_ctx must be at least 16")
    return sampling_from(fields), {**overrides, **kv_options(opts)}


def kv_options(opts: dict[str, Any]) -> dict[str, Any]:
    """InferenceOS extensions: `cache_type_k` / `cache_type_v` (load overrides: the model
    is re-planned with them) and `kv_policy` (this request's eviction policy: none,
    streaming, or h2o when the model was loaded for it)."""
    from inferenceos.plan.llama_params import KV_CACHE_TYPES

    out: dict[str, Any] = {}
    for key, field in (("cache_type_k", "type_k"), ("cache_type_v", "type_v")):
        value = opts.get(key)
        if value is None:
            continue
        if value not in KV_CACHE_TYPES:
            raise UsageError(f"option {key} must be one of {', '.join(KV_CACHE_TYPES)}")
        out[field] = value
    policy = opts.get("kv_policy")
    if policy is not None:
        if not isinstance(policy, str) or not policy.isidentifier() or len(policy) > 32:
            raise UsageError("option kv_policy must name a KV policy (none, streaming, h2o)")
        out["kv_policy"] = policy
    return out
