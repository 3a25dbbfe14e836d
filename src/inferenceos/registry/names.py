"""Model names and digests, validated strictly before they ever touch a path.

A name is `[host/][namespace/]model[:tag]` (`gemma3-270m`, `gemma3-270m:latest`,
`me/tiny:q8`, `hf.co/bartowski/llama-3.2-1b-instruct-gguf:Q4_K_M`). A host, as in
Ollama's names, holds a dot and is only allowed in front of a namespace.
Names arrive from HTTP clients, so they are untrusted: Ollama's "Probllama"
(CVE-2024-37032) came from a digest that was joined into a file path unchecked. Here a
name or digest either matches a narrow pattern or is refused with `InvalidNameError`;
nothing else in the registry builds a path from raw client text.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from typing import NamedTuple

from inferenceos.errors import UsageError

DEFAULT_TAG = "latest"
# 96 characters: the longest repository name the Hugging Face Hub allows
_PART = r"[a-z0-9](?:[a-z0-9._-]{0,94}[a-z0-9])?"
_HOST = r"[a-z0-9](?:[a-z0-9-]{0,62}[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]{0,62}[a-z0-9])?)+"
_TAG = r"[A-Za-z0-9_](?:[A-Za-z0-9._-]{0,126}[A-Za-z0-9_])?"
_NAME_RE = re.compile(
    rf"(?:(?:(?P<host>{_HOST})/)?(?P<ns>{_PART})/)?(?P<model>{_PART})(?::(?P<tag>{_TAG}))?"
)
_DIGEST_RE = re.compile(r"sha256[:-](?P<hex>[0-9a-f]{64})")


class InvalidNameError(UsageError):
    """A model name or digest does not have the allowed shape."""


class ModelName(NamedTuple):
    """A parsed, validated model name; `str()` gives the canonical `[host/]ns/model:tag`."""

    namespace: str
    model: str
    tag: str
    host: str = ""

    def __str__(self) -> str:
        base = f"{self.namespace}/{self.model}" if self.namespace else self.model
        base = f"{self.host}/{base}" if self.host else base
        return f"{base}:{self.tag}"


def parse_name(text: str) -> ModelName:
    """Validate `text` and return its parts; the tag defaults to `latest`.

    Host, namespace and model are lower case letters, digits, `.`, `_`, `-` (not at
    either end, no `..`; a host has a dot and no `_`); the tag may also hold upper case.
    Raises InvalidNameError otherwise.
    """
    if not isinstance(text, str) or len(text) > 200:
        raise InvalidNameError("invalid model name: too long")
    base, sep, tag = text.partition(":")
    m = _NAME_RE.fullmatch(base.lower() + sep + tag)  # names are case-insensitive, tags not
    if m is None or ".." in text:
        raise InvalidNameError(
            f"invalid model name {text[:80]!r}: use [namespace/]name[:tag] with letters, "
            "digits, '.', '_' and '-'"
        )
    return ModelName(m["ns"] or "", m["model"], m["tag"] or DEFAULT_TAG, m["host"] or "")


def canonical(text: str) -> str:
    """`text` as a canonical name string (validated)."""
    return str(parse_name(text))


def parse_digest(text: str) -> str:
    """Validate a sha256 digest (`sha256:<64 hex>` or `sha256-<64 hex>`); return the hex."""
    m = _DIGEST_RE.fullmatch(text) if isinstance(text, str) else None
    if m is None:
        raise InvalidNameError(f"invalid digest {str(text)[:80]!r}: expected sha256:<64 hex>")
    return m["hex"]


def close_names(text: str, names: Iterable[str], n: int = 3) -> list[str]:
    """Up to `n` of `names` closest to the name `text` (a typo, a short form), best
    first: names that start with what was typed (`qwen` → `qwen2.5-coder-0.5b:latest`),
    then difflib's closest. The `:latest` tag is ignored on both sides."""
    def stem(name: str) -> str:
        return name.lower().removesuffix(f":{DEFAULT_TAG}")

    typed = stem(str(text))
    by_stem: dict[str, str] = {}
    for name in names:
        by_stem.setdefault(stem(name), name)
    by_stem.pop(typed, None)  # the name itself is no suggestion
    starts = [s for s in sorted(by_stem) if len(typed) >= 3 and s.startswith(typed)]
    similar = difflib.get_close_matches(typed, list(by_stem), n=n, cutoff=0.6)
    return [by_stem[s] for s in dict.fromkeys([*starts, *similar])][:n]


def did_you_mean(text: str, names: Iterable[str]) -> str:
    """"; did you mean 'a' or 'b'?" for a not-found message, or "" when nothing is close."""
    hits = [f"'{h}'" for h in close_names(text, names)]
    if not hits:
        return ""
    listed = hits[0] if len(hits) == 1 else f"{', '.join(hits[:-1])} or {hits[-1]}"
    return f"; did you mean {listed}?"
