"""Fill in the middle: the prompt a FIM model completes, from its GGUF's FIM tokens.

One builder serves llama-server's `/infill`, Ollama's `suffix` on /api/generate and
OpenAI's `suffix` on /v1/completions. It is llama-server's `format_prompt_infill`
(tools/server/server-common.cpp in the vendored llama.cpp), token for token:

    [extra][BOS?][FIM_PRE] prefix prompt [FIM_SUF] suffix [FIM_MID]

(`spm`: the suffix part first, then the prefix part). `extra`, for /infill only, is
the repository-level header of Qwen2.5-Coder's paper (arXiv 2409.12186), built when
the request has `input_extra` or the model has the tokens for it:

    [FIM_REP]myproject\\n [FIM_SEP]{filename}\\n{text} ... [FIM_SEP]filename\\n

(without FIM_SEP a chunk is introduced by "\\n\\n--- snippet ---\\n\\n"). As in
llama-server, the prefix keeps its last 3/4 of a batch of tokens, the suffix its first
`n_batch/4 - 2 - len(prompt)`, and the extra part its last `n_ctx - n_batch -
2*n_predict` tokens (`n_predict` is the server's default, -1 unless set). Text is
tokenized without special tokens (a `<|fim_middle|>` typed in code stays text).
`require_fim` refuses, with a 400 in the route's dialect, a model without the
prefix, suffix and middle tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from inferenceos.errors import UsageError
from inferenceos.server.errors import APIError
from inferenceos.server.vocab import Vocab

N_BATCH = 2048  # llama-server's default -b: the FIM prefix and suffix fit one batch
REPO_NAME = "myproject\n"  # llama-server's fixed project name (its TODO: an input)
FILE_NAME = "filename\n"  # ... and the current file's name
SNIPPET = "\n\n--- snippet ---\n\n"  # a chunk's header without FIM_SEP
MAX_EXTRA = 256  # input_extra chunks per request


@dataclass(frozen=True)
class FimTokens:
    """The model's FIM token ids (-1: none)."""

    pre: int
    suf: int
    mid: int
    rep: int = -1
    sep: int = -1


@dataclass(frozen=True)
class Limits:
    """What trims a FIM prompt (llama-server's `n_batch`, server `n_predict`, slot `n_ctx`)."""

    n_ctx: int
    n_batch: int = N_BATCH
    n_predict: int = -1


def require_fim(vocab: Vocab, refusal: str) -> FimTokens:
    """The model's FIM tokens; APIError 400 (`refusal`, then what is missing, as
    llama-server words it) when it lacks the prefix, suffix or middle token."""
    s = vocab.specials
    missing = [f"{what} token is missing." for what, key in
               (("prefix", "fim_pre"), ("suffix", "fim_suf"), ("middle", "fim_mid"))
               if s[key] < 0]
    if missing:
        raise APIError(400, f"{refusal}: {' '.join(missing)}", "not_supported")
    return FimTokens(s["fim_pre"], s["fim_suf"], s["fim_mid"], s["fim_rep"], s["fim_sep"])


def text_ids(vocab: Vocab, value: Any, name: str) -> list[int]:
    """llama.cpp's `tokenize_mixed` without special tokens: text, or a list of text
    pieces and token ids; APIError 400 for anything else."""
    if isinstance(value, str):
        return vocab.tokenize(value, add_special=False, parse_special=False)
    if isinstance(value, list) and all(isinstance(x, (str, int)) and not isinstance(x, bool)
                                       for x in value):
        out: list[int] = []
        for x in value:
            try:
                out += (vocab.check([x]) if isinstance(x, int)
                        else vocab.tokenize(x, add_special=False, parse_special=False))
            except UsageError as exc:
                raise APIError(400, str(exc), "invalid_request") from None
        return out
    raise APIError(400, f'"{name}" must be text (or text and token ids mixed)',
                   "invalid_request")


def extra_chunks(raw: Any) -> list[tuple[str, str]]:
    """`input_extra` → (filename, text) pairs (filename "tmp" when absent, as
    llama-server); APIError 400 in llama-server's words for a bad one."""
    if raw is None:
        return []
    if not isinstance(raw, list) or len(raw) > MAX_EXTRA:
        raise APIError(400, '"input_extra" must be an array of {"filename": string, '
                       f'"text": string}} (at most {MAX_EXTRA})', "invalid_request")
    out = []
    for chunk in raw:
        if not isinstance(chunk, dict) or not isinstance(chunk.get("text"), str):
            raise APIError(400, 'extra_context chunk must contain a "text" field with a '
                           "string value", "invalid_request")
        name = chunk.get("filename", "tmp")
        if not isinstance(name, str):
            raise APIError(400, "extra_context chunk's \"filename\" field must be a string",
                           "invalid_request")
        out.append((name, chunk["text"]))
    return out


def _repo_tokens(vocab: Vocab, fim: FimTokens, extra: Sequence[tuple[str, str]]) -> list[int]:
    """The repository-level part before the FIM prefix (see the module contract)."""
    def ids(text: str) -> list[int]:
        return vocab.tokenize(text, add_special=False, parse_special=False)

    out = [fim.rep, *ids(REPO_NAME)] if fim.rep >= 0 else []
    for filename, text in extra:
        out += [fim.sep, *ids(filename + "\n")] if fim.sep >= 0 else ids(SNIPPET)
        out += ids(text)
    if fim.sep >= 0:
        out += [fim.sep, *ids(FILE_NAME)]
    return out


def infill_prompt(vocab: Vocab, fim: FimTokens, prefix: list[int], suffix: list[int],
                  limits: Limits, prompt: Sequence[int] = (),
                  extra: Sequence[tuple[str, str]] | None = None,
                  spm: bool = False) -> list[int]:
    """The FIM prompt's token ids (module contract). `extra` None: no repository-level
    part at all (Ollama's and OpenAI's `suffix`); a list (maybe empty): /infill's."""
    b = limits.n_batch
    n_prefix = min(len(prefix), 3 * (b // 4))
    n_suffix = min(len(suffix), max(0, b // 4 - (2 + len(prompt))))
    head = [fim.pre, *prefix[len(prefix) - n_prefix:], *prompt]
    tail = [fim.suf, *suffix[:n_suffix]]
    first, second = (tail, head) if spm else (head, tail)
    if vocab.add_bos and vocab.bos >= 0:
        first = [vocab.bos, *first]
    repo = _repo_tokens(vocab, fim, extra) if extra is not None else []
    n_extra = min(max(0, limits.n_ctx - b - 2 * limits.n_predict), len(repo))
    return [*repo[len(repo) - n_extra:], *first, *second, fim.mid]
