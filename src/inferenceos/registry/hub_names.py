"""Hugging Face names and files: parsing `hf.co/...`, quant labels, choosing a file.

Pure functions, no network (the pull itself is `hub.py`). Every part of a name, and
every file name the Hub answers, is validated here before anything is built from it:
`..`, absolute paths, backslashes, NULs and control characters are refused.

The default quant rule (`choose`): the planner's memory figure needs each file's GGUF
header (layer count, KV geometry), which the Hub's file list does not give, so the rule
uses file sizes only: the largest quantized file that fits in 80 % of this machine's
usable memory (RAM plus dedicated GPU memory, as `plan.devices.local_machine` reports
it), leaving a fifth for the KV cache and compute buffers; 16/32-bit float files only
when no quantized one fits; the smallest file when none fits. The pull says which rule
it used.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePosixPath

from inferenceos.errors import ModelNotFoundError, UsageError
from inferenceos.registry.names import InvalidNameError, canonical
from inferenceos.registry.store import split_info
from inferenceos.units import format_bytes

HOST = "hf.co"
_PREFIXES = ("hf.co/", "huggingface.co/", "https://hf.co/", "https://huggingface.co/")
FIT_FRACTION = 0.8  # of usable memory a model file may take (the rest: KV, compute)

_REPO_PART = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?")
_FILE_PART = re.compile(r"[A-Za-z0-9_(\[](?:[A-Za-z0-9._+=,@()\[\] -]{0,198}[A-Za-z0-9_)\]])?")
_QUANT = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9_.-]{0,46}[A-Za-z0-9])?")
_SHA256 = re.compile(r"[0-9a-f]{64}")
# A quantization label inside a file name, bounded by a separator or an end:
# Q4_K_M, IQ2_XXS, Q8_0, UD-Q4_K_XL, TQ1_0, MXFP4_MOE, BF16, F16, F32
_LABEL = re.compile(
    r"(?<![A-Za-z0-9])((?:UD-)?(?:I?Q[1-8](?:_[A-Z0-9]+)*|TQ[12]_[0-9]|MXFP4(?:_MOE)?"
    r"|BF16|FP16|F16|FP32|F32))(?![A-Za-z0-9])",
    re.IGNORECASE,
)
_FLOAT_LABELS = {"BF16", "FP16", "F16", "FP32", "F32"}

@dataclass(frozen=True)
class HubRef:
    """A parsed, validated `hf.co/...` name."""

    repo: str  # ORG/REPO as given (the Hub's ids are case-insensitive; URLs keep case)
    quant: str | None = None
    file: str | None = None  # a path inside the repo, when named

    def registry_name(self, label: str | None = None) -> str:
        """The registry name: `hf.co/org/repo:TAG` (TAG: the quant asked for, the chosen
        file's label when a file was named, else `latest`, as Ollama names it)."""
        tag = self.quant or label or "latest"
        return canonical(f"{HOST}/{self.repo.lower()}:{tag}")


@dataclass(frozen=True)
class HubFile:
    """One file of a repo as the Hub lists it (validated)."""

    path: str
    size: int
    sha256: str


@dataclass(frozen=True)
class Candidate:
    """A model in a repo: one GGUF file, or every part of a split one, in order."""

    label: str  # the quant label (Q4_K_M), or the file's stem when it has none
    files: tuple[HubFile, ...]

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def is_float(self) -> bool:
        return self.label.upper() in _FLOAT_LABELS


# -- names -------------------------------------------------------------------------------


def is_hub_name(text: str) -> bool:
    """Whether `text` names a Hub model (`hf.co/...`, `huggingface.co/...`)."""
    return isinstance(text, str) and text.lower().startswith(_PREFIXES)


def _refuse(text: str, why: str) -> InvalidNameError:
    return InvalidNameError(f"invalid Hugging Face name {text[:120]!r}: {why}")


def parse_hub_ref(text: str) -> HubRef:
    """Validate `hf.co/ORG/REPO[:QUANT]` or `hf.co/ORG/REPO/PATH/FILE.gguf`.

    Raises InvalidNameError for anything else, before any path or URL is built.
    """
    if not is_hub_name(text) or len(text) > 600:
        raise _refuse(str(text), "expected hf.co/ORG/REPO[:QUANT] or hf.co/ORG/REPO/FILE.gguf")
    if any(ord(c) < 32 or c in "\\\x7f" for c in text):
        raise _refuse(text, "control characters and backslashes are not allowed")
    rest = text[next(len(p) for p in _PREFIXES if text.lower().startswith(p)):]
    parts = rest.split("/")
    if len(parts) < 2:
        raise _refuse(text, "expected hf.co/ORG/REPO")
    org, repo_tag, *file_parts = parts
    repo, quant = repo_tag, None
    if not file_parts and ":" in repo_tag:
        repo, quant = repo_tag.split(":", 1)
        if not _QUANT.fullmatch(quant) or ".." in quant:
            raise _refuse(text, f"bad quantization tag {quant[:50]!r}")
    for part in (org, repo):
        if not _REPO_PART.fullmatch(part) or ".." in part:
            raise _refuse(text, f"bad organisation or repository {part[:100]!r}")
    file = None
    if file_parts:
        file = validate_repo_path("/".join(file_parts), text)
        if not file.lower().endswith(".gguf"):
            raise _refuse(text, "the file must be a .gguf file")
    return HubRef(f"{org}/{repo}", quant, file)


def validate_repo_path(path: str, shown: str | None = None) -> str:
    """A relative path inside a repo (from the user or the Hub), validated part by part."""
    parts = path.split("/")
    if (len(parts) > 8 or any(p in ("", ".", "..") for p in parts)
            or not all(_FILE_PART.fullmatch(p) for p in parts) or ".." in path):
        raise _refuse(shown or path, f"bad file path {path[:150]!r}")
    return path


def quant_label(path: str) -> str | None:
    """The quantization label of a repo file (`Q4_K_M`), from its name or its folder."""
    p = PurePosixPath(path)
    info = split_info(p.name)
    stem = info[0] if info else p.stem
    for text in (stem, *reversed(p.parts[:-1])):
        found = _LABEL.findall(text)
        if found:
            return str(found[-1]).upper()
    return None


# -- choosing a file ---------------------------------------------------------------------


def candidates(files: list[HubFile]) -> list[Candidate]:
    """The loadable models among a repo's files: single GGUFs and complete split sets.

    Vision projectors (`mmproj`) and importance matrices are not models and are left out.
    """
    singles: list[Candidate] = []
    groups: dict[tuple[str, str, int], dict[int, HubFile]] = {}
    for f in files:
        p = PurePosixPath(f.path)
        low = p.name.lower()
        if not low.endswith(".gguf") or "mmproj" in low or "imatrix" in low:
            continue
        info = split_info(p.name)
        if info and info[2] > 1:
            groups.setdefault((str(p.parent), info[0], info[2]), {})[info[1]] = f
            continue
        singles.append(Candidate(quant_label(f.path) or p.stem, (f,)))
    for (_, base, count), parts in groups.items():
        if sorted(parts) == list(range(1, count + 1)):
            first = parts[1]
            singles.append(Candidate(quant_label(first.path) or base,
                                     tuple(parts[i] for i in range(1, count + 1))))
    return sorted(singles, key=lambda c: (c.size, c.label))


def choose_projector(files: list[HubFile], model: Candidate) -> HubFile | None:
    """The repo's projector (`mmproj` GGUF) for `model`, or None: among the files in the
    model file's folder whose name holds `mmproj` (else in the repo's root, where repos
    that keep split quants in folders put it), the best by
    `model.projector_files.rank_projectors` (one that names another model is never
    taken; f16 before bf16, f32 and quantized ones). By name only: the pull checks the
    header once the bytes are here."""
    from inferenceos.model.projector_files import rank_projectors

    model_name = PurePosixPath(model.files[0].path).name
    for folder in dict.fromkeys((PurePosixPath(model.files[0].path).parent, PurePosixPath("."))):
        projs = {f.path: f for f in files
                 if "mmproj" in PurePosixPath(f.path).name.lower()
                 and f.path.lower().endswith(".gguf")
                 and PurePosixPath(f.path).parent == folder
                 and split_info(PurePosixPath(f.path).name) is None}
        ranked = rank_projectors(model_name, list(projs))
        if ranked:
            return projs[ranked[0]]
    return None


def choose(cands: list[Candidate], quant: str | None, memory_bytes: int | None,
           shown: str) -> tuple[Candidate, str]:
    """The candidate to pull and a sentence saying why it was chosen."""
    if not cands:
        raise ModelNotFoundError(f"{shown}: the repository has no GGUF model file")
    labels = ", ".join(sorted({c.label for c in cands}))
    if quant:
        exact = [c for c in cands if c.label.upper() == quant.upper()]
        if not exact:  # a label inside a longer one, e.g. "Q4_K_XL" in "UD-Q4_K_XL"
            exact = [c for c in cands if c.label.upper().endswith("-" + quant.upper())]
        if len(exact) == 1:
            return exact[0], f"{exact[0].label}, as asked"
        if not exact:
            raise ModelNotFoundError(f"{shown}: no {quant} file in the repository; "
                                     f"it has {labels}")
        names = ", ".join(c.files[0].path for c in exact[:4])
        raise UsageError(f"{shown}: several files match {quant} ({names}); name one, "
                         f"e.g. {shown}/{exact[0].files[0].path}")
    if len(cands) == 1:
        return cands[0], f"{cands[0].label}, the repository's only model"
    if memory_bytes is None:
        from inferenceos.plan.devices import local_machine

        memory_bytes = local_machine().total_memory
    budget = int(memory_bytes * FIT_FRACTION)
    fits = [c for c in cands if c.size <= budget]
    pick = (max((c for c in fits if not c.is_float), key=lambda c: c.size, default=None)
            or max(fits, key=lambda c: c.size, default=None))
    if pick is None:
        pick = min(cands, key=lambda c: c.size)
        return pick, (f"{pick.label}, the smallest: no file fits in "
                      f"{FIT_FRACTION:.0%} of this machine's usable memory "
                      f"({format_bytes(memory_bytes)}); pass :QUANT to choose ({labels})")
    kind = "float file" if pick.is_float else "quantization"
    return pick, (f"{pick.label}, the largest {kind} whose file ({format_bytes(pick.size)}) "
                  f"fits in {FIT_FRACTION:.0%} of this machine's usable memory "
                  f"({format_bytes(memory_bytes)}); pass :QUANT to choose ({labels})")
