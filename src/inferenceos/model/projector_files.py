"""Where a model's multimodal projector (`mmproj` GGUF) is: beside the model file, or named.

A projector is a GGUF file with `general.architecture == "clip"` (llama.cpp's `mtmd`
loads it next to the text model). Vision and audio models are published as a pair: the
text model in one or more quantizations and one or more `mmproj` files, usually in the
same folder or Hub repo. This module finds the right one by name and header, cheaply
(header and tensor table only, through the bounded reader `gguf_file.read_gguf`).

The rule (`find_projector`, and `rank_projectors` for the Hub's file lists):
- Candidates are the `.gguf` files in the model's folder (not below it) whose name
  contains `mmproj`, at most `MAX_CANDIDATES` of them, each checked to be a real projector
  (a GGUF header with `general.architecture == "clip"` that `model/projector.py` can
  read: an encoder, a projector type). Anything else is skipped. When the projector's
  output width is known (`ProjectorFacts.output_embedding`) it must equal the model's
  embedding width: mtmd refuses a pair that differs.
- A candidate must belong to the model: its name, compared without case and punctuation,
  contains the model's file stem (tier 0: `<stem>.mmproj.gguf`, `mmproj-<stem>.gguf`), or
  the stem without its quantization label (tier 1: `mmproj-gemma-3-4b-it-f16.gguf` for
  `gemma-3-4b-it-Q4_K_M.gguf`), or is generic, naming no model at all (tier 2:
  `mmproj.gguf`, `mmproj-F16.gguf`, `mmproj-model-f16.gguf`). A projector named for another
  model (`mmproj-qwen2-vl-f16.gguf` beside `phi-3-Q4_K_M.gguf`) is never taken: a
  mismatched pair fails to load (the projector's output width must equal the text model's
  embedding width), and guessing across models in a shared folder would be wrong often.
- Among the best tier: f16, then bf16, then f32, then q8_0, then other quantizations
  (the weight type holding most of the file's tensor bytes, read from the header, not
  the name). f16 first because it is what llama.cpp's own conversions publish by default:
  half the memory of f32 for the same outputs in practice, while quantized projectors
  lose accuracy on images for little saving (a projector is small next to its model).
  Ties: the smaller file, then the name.

`check_projector` is the same check for a file the user names (`--mmproj FILE`), with a
one-line error instead of a skip.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple

from gguf import GGMLQuantizationType

from inferenceos.errors import GGUFFormatError, ModelNotFoundError, UsageError
from inferenceos.model.gguf_file import ArrayInfo, GGUFFile, read_gguf
from inferenceos.model.projector import CLIP_ARCH, ProjectorFacts, projector_from_gguf

PROJECTOR_ARCH = CLIP_ARCH
MAX_CANDIDATES = 32  # mmproj files looked at in one folder: a bound on header reads
MAX_SCANNED = 20000  # folder entries listed: a bound on a huge folder (Ollama's blobs)
NONE = "none"  # `--mmproj none`: no projector, even when one is beside the model

# A quantization / float label inside a file stem (hub_names.py has the full pattern;
# model/ must not import registry/): Q4_K_M, IQ2_XXS, UD-Q4_K_XL, F16, BF16, F32 ...
_LABEL = re.compile(
    r"(?<![a-z0-9])(?:ud-)?(?:i?q[1-8](?:_[a-z0-9]+)*|tq[12]_[0-9]|mxfp4(?:_moe)?"
    r"|bf16|fp16|f16|fp32|f32)(?![a-z0-9])")
# words that name no model: what is left of a generic projector name without them
_GENERIC_WORDS = re.compile(r"mmproj|model|vision|projector|proj|clip|encoder|audio")
_TYPE_RANK = {GGMLQuantizationType.F16: 0, GGMLQuantizationType.BF16: 1,
              GGMLQuantizationType.F32: 2, GGMLQuantizationType.Q8_0: 3}
_OTHER_TYPE_RANK = 4


class Projector(NamedTuple):
    """A file checked to be a projector, with what ranking and `show` need."""

    path: Path
    weight_type: str  # the type holding most tensor bytes: "F16", "F32", "Q8_0" ...
    facts: ProjectorFacts

    @property
    def projector_type(self) -> str:
        """`mlp`, `gemma3`, `qwen2.5vl_merger`, `ultravox` ... (ProjectorFacts.kind)."""
        return self.facts.kind

    @property
    def vision(self) -> bool:
        return self.facts.has_vision

    @property
    def audio(self) -> bool:
        return self.facts.has_audio

    @property
    def size(self) -> int:
        return self.facts.size_bytes


def _compact(text: str) -> str:
    """Lowercase letters and digits only: names compared without punctuation."""
    return re.sub(r"[^a-z0-9]", "", text.lower())


def _stem(name: str) -> str:
    low = name.lower()
    return low[:-5] if low.endswith(".gguf") else low


def _base(stem: str) -> str:
    """A stem without its quantization label and split suffix: what a projector names."""
    stem = re.sub(r"-\d{5}-of-\d{5}$", "", stem.lower())
    return _LABEL.sub("", stem)


def belongs_tier(model_name: str, projector_name: str) -> int | None:
    """0, 1 or 2 (see the module docstring) when `projector_name` may go with the model
    file `model_name`; None when it names another model. Names only, no file access."""
    full = _compact(re.sub(r"-\d{5}-of-\d{5}$", "", _stem(model_name)))
    base = _compact(_base(_stem(model_name)))
    proj = _compact(_stem(projector_name))
    if len(full) >= 3 and full in proj:
        return 0
    if len(base) >= 3 and base in proj:
        return 1
    rest = _GENERIC_WORDS.sub("", _compact(_LABEL.sub("", _stem(projector_name))))
    return 2 if not rest else None


def _weight_type(gf: GGUFFile) -> GGMLQuantizationType | None:
    """The type of the matrices holding most bytes (norms and biases are f32 anyway)."""
    totals: dict[GGMLQuantizationType, int] = {}
    for t in gf.tensors:
        if len(t.shape) >= 2:
            totals[t.ggml_type] = totals.get(t.ggml_type, 0) + t.n_bytes
    return max(totals, key=lambda k: totals[k]) if totals else None


def read_projector(path: Path) -> Projector:
    """`path` as a Projector; raises ModelNotFoundError (missing, unreadable),
    GGUFFormatError (not GGUF) or UsageError (a GGUF file that is not a projector)."""
    return _read(path)[1]


def _read(path: Path) -> tuple[GGUFFile, Projector]:
    gf = read_gguf(path)  # bounded: header and tensor table only, never the weights
    arch = gf.metadata.get("general.architecture")
    if arch != PROJECTOR_ARCH:
        shown = arch if isinstance(arch, str) else "missing"
        raise UsageError(
            f"{path} is not a multimodal projector (general.architecture is {shown!r}, "
            f"expected {PROJECTOR_ARCH!r}); projectors are the mmproj*.gguf files "
            "published beside vision models")
    try:
        facts = projector_from_gguf(gf)
    except GGUFFormatError as exc:  # a clip file mtmd could not use either
        raise UsageError(f"{path} is not a usable projector: {exc}") from None
    wt = _weight_type(gf)
    return gf, Projector(Path(path), wt.name if wt is not None else "?", facts)


def _rank_key(p: Projector) -> tuple[int, int, str]:
    try:
        rank = _TYPE_RANK.get(GGMLQuantizationType[p.weight_type], _OTHER_TYPE_RANK)
    except KeyError:
        rank = _OTHER_TYPE_RANK
    return rank, p.size, p.path.name


def is_projector(path: Path) -> bool:
    """Whether `path` is a readable GGUF file with `general.architecture == "clip"`."""
    try:
        read_projector(path)
    except (ModelNotFoundError, GGUFFormatError, UsageError):
        return False
    return True


def check_projector(path: str | Path) -> Path:
    """A file the user named as a projector, checked; one-line errors otherwise
    (ModelNotFoundError when missing, UsageError when it is not a projector)."""
    p = Path(path).expanduser()
    if not p.is_file():
        reason = "not a regular file" if p.exists() else "no such file"
        raise ModelNotFoundError(f"projector {p}: {reason}")
    try:
        read_projector(p)
    except GGUFFormatError as exc:
        why = str(exc).removeprefix(f"{p}: ")
        raise UsageError(f"{p} is not a multimodal projector: {why}") from None
    return p


def projectors_beside(model_path: Path) -> list[Path]:
    """The `*mmproj*.gguf` files in the model's folder (names only, sorted; the first
    MAX_CANDIDATES by name, among at most MAX_SCANNED entries of the folder)."""
    model_path = Path(model_path)
    found: list[Path] = []
    try:
        with os.scandir(model_path.parent) as it:
            for i, entry in enumerate(it):
                if i >= MAX_SCANNED:
                    break
                low = entry.name.lower()
                if low.endswith(".gguf") and "mmproj" in low and entry.name != model_path.name:
                    found.append(model_path.parent / entry.name)
    except OSError:
        return []
    return sorted(found)[:MAX_CANDIDATES]


def best_projector(model_name: str, projectors: Iterable[Projector]) -> Projector | None:
    """The projector for the model file `model_name` among checked ones (module rule)."""
    tiered = [(tier, p) for p in projectors
              if (tier := belongs_tier(model_name, p.path.name)) is not None]
    if not tiered:
        return None
    best = min(t for t, _ in tiered)
    return min((p for t, p in tiered if t == best), key=_rank_key)


def fits_model(projector: Projector, model_path: Path, width: int | None = None) -> str:
    """"" when `projector` can go with the text model `model_path` (whose input width
    is `width` when the caller has read it), else why not (its output width is not the
    model's input width, which mtmd refuses at load)."""
    width = _embedding_width(model_path) if width is None else width
    out = projector.facts.output_embedding
    if width and out and width != out:
        return (f"its output width ({out}) is not the model's embedding width ({width}): "
                "a projector for another model")
    return ""


def find_projector(model_path: str | Path) -> Path | None:
    """The projector beside `model_path` (see the module docstring), or None.

    The folder is listed each time (names only); the headers are read again only when
    the model file or a candidate changed (name, size or mtime): the server resolves a
    model on every request, and the width check reads the model's header (44 ms for
    Gemma 3's 262k-token vocabulary)."""
    model_path = Path(model_path)
    candidates = projectors_beside(model_path)
    if not candidates:
        return None
    try:
        key = tuple((str(p), st.st_size, st.st_mtime_ns)
                    for p in (model_path, *candidates) for st in (p.stat(),))
    except OSError:  # one went away while we looked: no caching
        return _find(model_path, candidates)
    return _find_cached(key)


@functools.lru_cache(maxsize=256)
def _find_cached(key: tuple[tuple[str, int, int], ...]) -> Path | None:
    """`_find` remembered by the stat of the model and its candidates."""
    model, *candidates = (Path(k[0]) for k in key)
    return _find(model, candidates)


def _find(model_path: Path, candidates: list[Path]) -> Path | None:
    checked = []
    for candidate in candidates:
        try:
            if candidate.is_file():
                checked.append(read_projector(candidate))
        except (ModelNotFoundError, GGUFFormatError, UsageError):
            continue  # a file named mmproj that is not one: not a projector
    if checked:
        width = _embedding_width(model_path)
        checked = [p for p in checked if not fits_model(p, model_path, width)]
    best = best_projector(model_path.name, checked)
    return best.path if best is not None else None


def _embedding_width(model_path: Path) -> int:
    """The width of the embeddings the text model takes in, as mtmd compares it with
    the projector's output (`llama_model_n_embd_inp`: n_embd, times 1 + the deepstack
    layers of Qwen3-VL-style models); 0 when unreadable: the name rule alone decides."""
    try:
        gf = read_gguf(model_path)
    except (ModelNotFoundError, GGUFFormatError):
        return 0
    arch = gf.metadata.get("general.architecture")
    if not isinstance(arch, str):
        return 0

    def count(key: str) -> int:
        v = gf.metadata.get(f"{arch}.{key}")
        return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else 0

    return count("embedding_length") * (1 + count("n_deepstack_layers"))


def rank_projectors(model_name: str, names: Iterable[str]) -> list[str]:
    """Projector file names that may go with `model_name`, best first, by name alone
    (a Hub listing has no headers): tier, then the name's label (f16, bf16, f32,
    q8_0, no label, other quantizations), then the name. `registry/hub.py` checks
    the header after the download."""
    order = {"f16": 0, "fp16": 0, "bf16": 1, "f32": 2, "fp32": 2, "q8_0": 3}

    def label_rank(name: str) -> int:
        labels = _LABEL.findall(_stem(name).rsplit("/", 1)[-1])
        return order.get(labels[-1], _OTHER_TYPE_RANK + 1) if labels else _OTHER_TYPE_RANK

    tiered = [(tier, n) for n in names
              if (tier := belongs_tier(model_name, n.rsplit("/", 1)[-1])) is not None]
    return [n for _, n in sorted(tiered, key=lambda tn: (tn[0], label_rank(tn[1]), tn[1]))]


def projector_info(path: Path) -> dict[str, Any]:
    """The projector's metadata as Ollama's `/api/show` `projector_info` reports it:
    scalar keys and short numeric arrays (image mean / std), never the tokenizer-sized
    ones; raises as `read_projector` does."""
    gf = _read(path)[0]
    info: dict[str, Any] = {}
    for key, value in gf.metadata.items():
        if isinstance(value, ArrayInfo):
            if value.values is not None and len(value.values) <= 16:
                info[key] = list(value.values)
        elif key != "general.alignment":
            info[key] = value
    return info
