"""What a model name means to the server: a registry entry or a file named at startup.

`Catalog.resolve(name)` is the only way the server turns client text into a file: the
name is validated, then looked up among the aliases given on the command line (`serve
PATH` serves PATH under a name derived from its file name) and the registry. A client
can never name a path on the server's disk.

Each model comes with its multimodal projector when it has one (`ResolvedModel.mmproj`):
the one its registry entry records, or for a file served by path the one given at
startup (`serve --mmproj`) or found beside it (`model/projector_files.py`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from inferenceos.errors import ModelNotFoundError, StorageError
from inferenceos.registry.names import canonical, did_you_mean
from inferenceos.registry.store import (
    AUTO,
    ModelEntry,
    ModelStore,
    name_for_file,
    split_base,
    split_parts,
)


@dataclass(frozen=True)
class ResolvedModel:
    """A model the server may load: its canonical name, file, and a few header facts."""

    name: str
    path: Path
    digest: str
    size: int
    architecture: str
    file_type: str
    parameters: int
    context_length: int
    modified_at: float
    # the projector (mmproj GGUF) to load for images / audio; None: a text-only model,
    # or a recorded projector whose file has gone missing (`models show` says which)
    mmproj: Path | None = None
    preset: str | None = None  # a preset's JSON (registry/presets.Preset); None: plain


# a quantization suffix of a GGUF file name: .Q4_K_M, -q8_0, .IQ2_XXS, .f16, -BF16 ...
_QUANT_SUFFIX = re.compile(r"[._-](i?q\d[a-z0-9_]*|f16|f32|bf16)(?=:latest$)")
MAX_NAMES_SHOWN = 8


def plain_name(key: str) -> str | None:
    """`llama-3-8b-instruct.q4_k_m:latest` → `llama-3-8b-instruct:latest`: the name a
    served file also answers to (the seeds' OpenAI snippet uses it); None if the name
    has no quantization suffix."""
    plain = _QUANT_SUFFIX.sub("", key)
    return plain if plain != key else None


def _from_entry(e: ModelEntry, look_beside: bool = True) -> ResolvedModel:
    return ResolvedModel(e.name, e.path, e.digest, e.size, e.architecture, e.file_type,
                         e.parameters, e.context_length, e.modified_at,
                         entry_projector(e, look_beside), e.preset)


def entry_projector(e: ModelEntry, look_beside: bool = True) -> Path | None:
    """The projector to load with a registry entry: the one it records when its file
    is there; for an entry registered in place without one, the projector beside its
    file (entries from before projectors were recorded; `look_beside=False` skips
    that folder scan, for listings); else None."""
    from inferenceos.model.projector_files import find_projector

    if e.projector is not None:
        return e.projector if e.projector.is_file() else None
    return find_projector(e.path) if e.in_place and look_beside else None


class Catalog:
    """Registry names plus aliases for files served directly (aliases win)."""

    def __init__(self, store: ModelStore, files: list[Path] | None = None) -> None:
        self.store = store
        self._aliases: dict[str, ResolvedModel] = {}
        self._plain: dict[str, str] = {}  # plain name → alias (quant suffix dropped)
        self._resolved: dict[str, ResolvedModel] = {}  # registry names resolved so far
        for path in files or []:
            self.add_file(path)

    def add_file(self, path: Path, name: str | None = None,
                 mmproj: Path | str | None = AUTO) -> ResolvedModel:
        """Serve `path` under `name` (default: from the file name) without copying it.

        The first part of a split GGUF is named without its `-00001-of-0000N` suffix and
        sized with all its parts (llama.cpp finds them next to it). `mmproj`: AUTO (the
        projector beside the file, if any), a projector file (checked: UsageError when
        it is not one), or None / "none" (no projector)."""
        from inferenceos.model.digest import file_digest
        from inferenceos.model.projector_files import NONE, check_projector, find_projector
        from inferenceos.model.spec import load_spec

        spec = load_spec(Path(path).expanduser())
        if mmproj is None or (isinstance(mmproj, str) and mmproj.lower() == NONE):
            projector = None
        elif isinstance(mmproj, str) and mmproj == AUTO:
            projector = find_projector(spec.path)
        else:
            projector = check_projector(mmproj)
        key = canonical(name) if name else name_for_file(split_base(spec.path))
        size = sum(p.stat().st_size for p in split_parts(spec.path))
        model = ResolvedModel(
            key, spec.path, file_digest(spec.path), size, spec.architecture,
            spec.file_type, spec.parameters, spec.context_length, spec.path.stat().st_mtime,
            projector,
        )
        self._aliases[key] = model
        plain = plain_name(key)
        if plain is not None:
            self._plain.setdefault(plain, key)
        return model

    def alias(self, name: str) -> ResolvedModel | None:
        """The file served under `name` when it is an alias (what `resolve` would
        return first), else None: a dict lookup, reading neither the registry nor the
        disk, so an event loop may call it. InvalidNameError for a malformed name."""
        return self._aliases.get(canonical(name))

    def resolve(self, name: str) -> ResolvedModel:
        """The model called `name`; InvalidNameError or ModelNotFoundError otherwise."""
        key = canonical(name)
        if key in self._aliases:
            return self._aliases[key]
        try:
            entry = self.store.find(key)
        except StorageError:
            # the registry database is unusable (corrupt, locked too long): a model
            # already resolved keeps serving from its file; anything else gets the error
            known = self._resolved.get(key)
            if known is not None and known.path.is_file():
                return known
            raise
        if entry is not None and entry.path.is_file():
            self._resolved[key] = _from_entry(entry)
            return self._resolved[key]
        if key in self._plain:
            return self._aliases[self._plain[key]]
        raise ModelNotFoundError(self._not_found(key))

    def _not_found(self, key: str) -> str:
        """Name the registered names closest to `key` (a typo), and the models that do
        work when the server serves files (few, known)."""
        try:
            registered = [e.name for e in self.store.list()]
        except StorageError:
            registered = []
        hint = did_you_mean(key, [*self._aliases, *self._plain, *registered])
        if not self._aliases:
            return f"model '{key}' not found" + (hint or ", try pulling it first")
        names = [*self._aliases, *self._plain]
        shown = ", ".join(sorted(names)[:MAX_NAMES_SHOWN])
        more = f" and {len(names) - MAX_NAMES_SHOWN} more" if len(names) > MAX_NAMES_SHOWN else ""
        return f"model '{key}' not found{hint}; this server serves: {shown}{more}"

    def names(self) -> list[ResolvedModel]:
        """Every model a client may name: aliases first, then the registry."""
        seen = dict(self._aliases)
        for e in self.store.list():  # a listing: no folder scan per in-place entry
            seen.setdefault(e.name, _from_entry(e, look_beside=False))
        return list(seen.values())

    def is_alias(self, name: str) -> bool:
        key = canonical(name)
        return key in self._aliases or key in self._plain

    def first(self) -> str | None:
        """The name to use when a request names no model (the first alias), if any."""
        return next(iter(self._aliases), None)
