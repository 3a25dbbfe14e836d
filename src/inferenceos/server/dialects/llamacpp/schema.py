"""llama.cpp's /completion request body → prompts and sampling (llama-server's rules).

llama-server reads a loose JSON object: `prompt` as text, token ids, text and ids mixed
in one sequence, `{"prompt_string": ...}`, or a list of those (one completion each);
`n_predict` (aliases `max_tokens`, `max_completion_tokens`; -1 unlimited), the sampling
fields, `n_probs`, `grammar` / `json_schema`, `logit_bias` as `[[token or text, bias or
false], ...]` or `{token or text: bias}`, `ignore_eos`, `stop`, `seed` (-1 random).

`parse_completion(body, vocab)` turns that into a `CompletionParams` or raises
APIError 400 with a one-line reason. Fields whose llama.cpp samplers we do not run
(mirostat, DRY, XTC, typical-p, ...) are refused when set to anything but their
"disabled" value, rather than silently ignored; fields that only tune llama-server's
own slots (`id_slot`, `cache_prompt`, `n_keep`, ...) are accepted and have no effect
beyond what our engine does anyway (it always reuses a cached prefix).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from inferenceos.engine.sampling import SamplingParams
from inferenceos.errors import UsageError
from inferenceos.media.collect import MediaSet
from inferenceos.media.item import MEDIA_MARKER, MediaItem, count_markers
from inferenceos.server.dialects.openai.schema import EmbeddingText
from inferenceos.server.errors import APIError
from inferenceos.server.json_grammar import gbnf_grammar, output_grammar
from inferenceos.server.llama_shapes import RANDOM_SEED
from inferenceos.server.options import UNLIMITED, sampling_from, stops
from inferenceos.server.vocab import Vocab

MAX_PROMPTS = 16
MAX_N_PROBS = 20

# samplers we do not run: field → the value that means "off" in llama.cpp
_DISABLED: dict[str, float] = {
    "mirostat": 0, "dry_multiplier": 0.0, "xtc_probability": 0.0, "typical_p": 1.0,
    "dynatemp_range": 0.0, "top_n_sigma": -1.0,
}
_NUMERIC = {
    "temperature": float, "top_k": int, "top_p": float, "min_p": float,
    "repeat_penalty": float, "repeat_last_n": int, "presence_penalty": float,
    "frequency_penalty": float,
}


@dataclass(frozen=True)
class MediaPrompt:
    """A prompt object with `multimodal_data`: its text (one media marker per item, in
    order) and the decoded items; `ids` are the text's own tokens without the markers
    (its length is what `len()` gives, as for a token prompt)."""

    text: str
    items: tuple[MediaItem, ...]
    ids: list[int]

    def __len__(self) -> int:
        return len(self.ids)


Prompt = list[int] | MediaPrompt
# a fresh MediaSet under the server's limits, for one prompt's multimodal_data
MediaFactory = Callable[[], MediaSet]


@dataclass(frozen=True)
class CompletionParams:
    """One /completion request, parsed. `prompts` are token ids (text already
    tokenized with the model's vocabulary, a BOS first as llama-server adds one), or
    a MediaPrompt for a prompt object with `multimodal_data`."""

    prompts: list[Prompt]
    sampling: SamplingParams
    n_predict: int  # as the client asked (-1: unlimited), for generation_settings
    stream: bool = False
    n_probs: int = 0
    post_sampling_probs: bool = False
    return_tokens: bool = False
    response_fields: list[str] = field(default_factory=list)
    n_cmpl: int = 1
    timings_per_token: bool = False
    return_progress: bool = False  # with stream: `prompt_progress` events first
    eog_bias: tuple[int, ...] = ()  # ignore_eos: the EOG tokens llama.cpp biases to -inf
    lora: dict[int, float] | None = None  # per-request adapter scales by id (None: global)


def _bad(message: str) -> APIError:
    return APIError(400, message[:300], "invalid_request")


def _number(body: dict[str, Any], name: str, kind: type) -> Any:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _bad(f'"{name}" must be a number, got {value!r}')
    if kind is int:
        if not math.isfinite(value) or float(value) != int(value):
            raise _bad(f'"{name}" must be an integer, got {value!r}')
        return int(value)
    if not math.isfinite(value):
        raise _bad(f'"{name}" must be a finite number')
    return float(value)


def _flag(body: dict[str, Any], name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise _bad(f'"{name}" must be true or false, got {value!r}')
    return value


def _is_ids(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _one_prompt(item: Any, vocab: Vocab, media: MediaFactory | None = None) -> Prompt:
    """One prompt: text, ids, ids and text mixed, or {"prompt_string": text} (with
    `multimodal_data`, base64 images / audio for its media markers, when `media`)."""
    if isinstance(item, dict):
        text = item.get("prompt_string")
        if not isinstance(text, str):
            raise _bad('a prompt object needs "prompt_string" as text')
        if item.get("multimodal_data"):
            return _media_prompt(text, item["multimodal_data"], vocab, media)
        return vocab.tokenize(text, add_special=True)
    if isinstance(item, str):
        return vocab.tokenize(item, add_special=True)
    if isinstance(item, list) and item and all(_is_ids(x) or isinstance(x, str) for x in item):
        out: list[int] = []
        for i, x in enumerate(item):  # llama.cpp's tokenize_mixed: BOS for leading text only
            out += vocab.check([x]) if _is_ids(x) else vocab.tokenize(x, add_special=i == 0)
        return out
    raise _bad('"prompt" must be text, token ids, a mix of both, or a list of those')


def _media_prompt(text: str, data: Any, vocab: Vocab, media: MediaFactory | None
                  ) -> MediaPrompt:
    """A prompt object's `multimodal_data` decoded for its markers (llama-server's
    form: `"<__media__>"` in `prompt_string` once per item, in order)."""
    if media is None:
        raise APIError(400, "multimodal_data is not supported here (only in /completion "
                       "prompts)", "not_supported")
    if not isinstance(data, list) or not all(isinstance(d, str) for d in data):
        raise _bad('"multimodal_data" must be a list of base64 strings')
    if count_markers(text) != len(data):
        raise _bad(f'"prompt_string" holds {count_markers(text)} media markers '
                   f"({MEDIA_MARKER}) for {len(data)} multimodal_data items")
    items = media()
    for d in data:
        items.sniffed(d)
    return MediaPrompt(text, tuple(items.items),
                       vocab.tokenize(text.replace(MEDIA_MARKER, ""), add_special=True))


def parse_prompts(prompt: Any, vocab: Vocab, media: MediaFactory | None = None
                  ) -> list[Prompt]:
    """llama-server's prompt forms → token ids, one list per completion (a MediaPrompt
    for a prompt object with multimodal_data, when `media` makes their items)."""
    if prompt is None:
        raise _bad('"prompt" must be provided')
    if isinstance(prompt, list) and prompt and all(_is_ids(x) or isinstance(x, str)
                                                   for x in prompt):
        # a flat list: one mixed sequence, unless it holds only strings (several prompts)
        if any(_is_ids(x) for x in prompt):
            prompts = [_one_prompt(prompt, vocab)]
        else:
            prompts = [_one_prompt(x, vocab) for x in prompt]
    elif isinstance(prompt, list):
        if not prompt:
            raise _bad('"prompt" must not be empty')
        prompts = [_one_prompt(x, vocab, media) for x in prompt]
    else:
        prompts = [_one_prompt(prompt, vocab, media)]
    if len(prompts) > MAX_PROMPTS:
        raise _bad(f"at most {MAX_PROMPTS} prompts per request, got {len(prompts)}")
    if any(not p for p in prompts):
        raise _bad("a prompt must not be empty")
    return prompts


def _bias_value(v: Any) -> float | None:
    if v is False:
        return float("-inf")
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None  # llama.cpp skips entries it cannot read
    return float("-inf") if v == float("-inf") else float(v)


def parse_logit_bias(raw: Any, vocab: Vocab) -> tuple[tuple[int, float], ...]:
    """`[[token or text, bias or false], ...]` or `{"token id or text": bias}`; text is
    tokenized (every one of its tokens biased); out-of-vocabulary ids are skipped."""
    pairs: list[tuple[Any, Any]] = []
    if isinstance(raw, list):
        pairs = [(e[0], e[1]) for e in raw if isinstance(e, list) and len(e) == 2]
    elif isinstance(raw, dict):
        pairs = list(raw.items())
    elif raw is not None:
        raise _bad('"logit_bias" must be a list of [token, bias] pairs or an object')
    out: list[tuple[int, float]] = []
    for key, value in pairs[: vocab.n_vocab]:
        bias = _bias_value(value)
        if bias is None:
            continue
        if isinstance(key, str) and key.strip().lstrip("-").isdigit():
            key = int(key)
        if _is_ids(key):
            if 0 <= key < vocab.n_vocab:
                out.append((key, bias))
        elif isinstance(key, str):
            out += [(t, bias) for t in vocab.tokenize(key, add_special=False)]
    return tuple(out)


def grammar_of(body: dict[str, Any]) -> str | None:
    """The grammar a body asks for: `json_schema` (a schema; `{}` any object) unless a
    `grammar` (GBNF) is given. A bad schema or grammar is a 400 (the grammar is checked
    before it reaches llama.cpp: server/gbnf.py)."""
    grammar = body.get("grammar")
    if grammar is not None and not isinstance(grammar, str):
        raise _bad('"grammar" must be GBNF text')
    if grammar:
        return gbnf_grammar(grammar)
    schema = body.get("json_schema")
    if schema is None:
        return None
    if isinstance(schema, dict) and not schema:
        schema = {"type": "object"}
    return output_grammar("json_schema", schema)


def _refuse_unsupported(body: dict[str, Any]) -> None:
    for name, off in _DISABLED.items():
        value = body.get(name)
        if value is not None and not isinstance(value, bool) and value != off:
            raise APIError(400, f'"{name}" is not supported by this server (only {off}, '
                           "its disabled value, is accepted)", "unsupported_parameter")


def parse_completion(body: dict[str, Any], vocab: Vocab, n_predict_default: int = -1,
                     seed_default: int | None = None,
                     media: MediaFactory | None = None) -> CompletionParams:
    """A /completion body → CompletionParams; APIError 400 for anything unusable.
    `n_predict_default` and `seed_default` (llama-server's `--n-predict` and `--seed`)
    apply when the body sets none (a request's own value wins, as in llama-server)."""
    _refuse_unsupported(body)
    n_predict = -1
    for name in ("max_completion_tokens", "max_tokens", "n_predict"):  # n_predict wins
        value = _number(body, name, int)
        if value is not None:
            n_predict = value
    if n_predict < -1:
        raise _bad(f'"n_predict" must be -1 (unlimited) or more, got {n_predict}')
    if n_predict < 0:
        n_predict = n_predict_default
    fields: dict[str, Any] = {name: _number(body, name, kind) for name, kind in _NUMERIC.items()}
    seed = _number(body, "seed", int)
    if seed is not None and seed != -1 and not 0 <= seed < RANDOM_SEED:
        raise _bad(f'"seed" must be -1 (random) or in [0, {RANDOM_SEED}), got {seed}')
    stop = body.get("stop")
    if stop is not None and not isinstance(stop, (str, list)):
        raise _bad('"stop" must be a string or a list of strings')
    if isinstance(stop, list) and not all(isinstance(s, str) for s in stop):
        raise _bad('"stop" must be a string or a list of strings')
    n_probs = _number(body, "n_probs", int)
    if n_probs is None:
        n_probs = _number(body, "logprobs", int) if not isinstance(body.get("logprobs"),
                                                                   bool) else None
    n_probs = n_probs or 0
    if not 0 <= n_probs <= MAX_N_PROBS:
        raise _bad(f'"n_probs" must be in [0, {MAX_N_PROBS}], got {n_probs}')
    ignore_eos = _flag(body, "ignore_eos")
    n_cmpl = _number(body, "n_cmpl", int) or _number(body, "n", int) or 1
    if not 1 <= n_cmpl <= 8:
        raise _bad(f'"n_cmpl" must be in [1, 8], got {n_cmpl}')
    response_fields = body.get("response_fields") or []
    if not isinstance(response_fields, list) or not all(isinstance(f, str)
                                                        for f in response_fields):
        raise _bad('"response_fields" must be a list of field names')
    prompts = parse_prompts(body.get("prompt"), vocab, media)
    fields.update({
        "seed": seed_default if seed is None else None if seed == -1 else seed,
        "max_tokens": UNLIMITED if n_predict < 0 else n_predict,
        "stop": stops(stop) if stop is not None else None,
        "ignore_eos": ignore_eos,
        "grammar": grammar_of(body),
        "logit_bias": parse_logit_bias(body.get("logit_bias"), vocab),
        # n_probs 0 still reports nothing; 1+ asks the engine for that many alternatives
        "logprobs": n_probs if n_probs > 0 else None,
    })
    try:
        sampling = sampling_from(fields)
    except UsageError as exc:
        raise _bad(str(exc)) from None
    return CompletionParams(
        prompts=prompts, sampling=sampling, n_predict=n_predict, stream=_flag(body, "stream"),
        n_probs=n_probs, post_sampling_probs=_flag(body, "post_sampling_probs"),
        return_tokens=_flag(body, "return_tokens"), response_fields=list(response_fields),
        n_cmpl=n_cmpl, timings_per_token=_flag(body, "timings_per_token"),
        return_progress=_flag(body, "return_progress"),
        eog_bias=vocab.eog if ignore_eos else (),
        lora=parse_lora(body.get("lora")),
    )


def parse_lora(raw: Any) -> dict[int, float] | None:
    """llama-server's `lora`: [{"id": int, "scale": number}] → {id: scale} (None when
    absent: the global scales apply). Whether each id exists is the route's check."""
    if raw is None or raw == []:  # llama-server: an empty list is the global scales
        return None
    if not isinstance(raw, list) or len(raw) > 64:
        raise _bad('"lora" must be a list of {"id": int, "scale": number} objects')
    out: dict[int, float] = {}
    for entry in raw:
        if not isinstance(entry, dict):
            raise _bad('"lora" must be a list of {"id": int, "scale": number} objects')
        i, scale = entry.get("id"), entry.get("scale", 0.0)
        if not _is_ids(i) or isinstance(scale, bool) or not isinstance(scale, (int, float)):
            raise _bad('each "lora" entry needs an integer "id" and a numeric "scale"')
        if scale != scale or abs(scale) == float("inf"):
            raise _bad('a "lora" scale must be a finite number')
        out[int(i or 0)] = float(scale)
    return out


def embedding_input(item: Any, vocab: Vocab) -> str | list[int]:
    """One embedding input, as llama-server reads it: text; `{"prompt_string": text}`
    or `{"content": [text parts]}`; token ids, or ids and text mixed (→ ids). An empty
    text is the model's special tokens alone (a BOS), as llama.cpp embeds it."""
    if isinstance(item, EmbeddingText):
        if item.prompt_string is not None:
            item = item.prompt_string
        elif item.content and all(p.type == "text" for p in item.content):
            item = "".join(p.text or "" for p in item.content)
        else:
            raise APIError(400, "an input object needs prompt_string or text content parts "
                           "(embeddings take text only)", "invalid_input")
    if isinstance(item, str):
        return item if item else vocab.tokenize("", add_special=True) or _empty()
    if isinstance(item, list) and item and all(_is_ids(x) or isinstance(x, str) for x in item):
        ids = _one_prompt(item, vocab)
        assert isinstance(ids, list)  # a list prompt is always token ids
        return ids
    raise _bad("each embedding input must be text, token ids, or both mixed")


def _empty() -> list[int]:
    raise _bad("an empty text has no tokens to embed with this model")
