"""Models other tools already keep on this disk, registered in place under familiar names.

Where it looks (`default_places`), and the names it gives:
- Ollama: `$OLLAMA_MODELS` or `~/.ollama/models`: `manifests/HOST/NAMESPACE/MODEL/TAG`
  (JSON whose `application/vnd.ollama.image.model` layer names a `blobs/sha256-<hex>`
  file). `registry.ollama.ai/library/llama3/8b` → `llama3:8b`; another namespace keeps
  it (`me/tiny:q8`); another host keeps both (`hf.co/org/repo:Q4_K_M`).
- LM Studio: `~/.lmstudio/models` and `~/.cache/lm-studio/models`, laid out
  `PUBLISHER/REPO/FILE.gguf` → `publisher/repo:QUANT` (the file's quant label, else its
  stem).
- The Hugging Face cache: `$HF_HUB_CACHE`, `$HF_HOME/hub` or `~/.cache/huggingface/hub`,
  `models--ORG--REPO/snapshots/COMMIT/FILE.gguf` → `hf.co/org/repo:QUANT`, the name a
  pull of the same file would give.
- Folders named on the command line: every `.gguf` below them (6 levels at most), named
  from the file name as `models pull FILE` would; a folder laid out like one of the
  above is read as such.

A vision model's projector is recorded with it, also in place: Ollama's projector layer
(`application/vnd.ollama.image.projector`), elsewhere the `mmproj` file beside the model
(`model/projector_files.find_projector`). A model registered before keeps its entry
and gains the projector on the next discover.

Files are registered with `ModelStore.register_in_place`: nothing is copied, `rm` only
forgets the name. Everything read here is untrusted: manifest paths, names and digests
are validated before a path is built from them; unreadable or malformed entries are
skipped with a reason, never fatal. Digests come from the blob names of Ollama and the
Hugging Face cache (content-addressed by sha256, not re-hashed); other files are hashed
(cached by path, size and mtime). Split GGUFs are registered by their first part. Each
file's header is read; llama.cpp's own load check (`loadcheck.py`, a child process per
file) runs only when asked (`check`, `models discover --check`).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from inferenceos.errors import InferenceOSError
from inferenceos.registry.names import InvalidNameError, canonical, parse_digest
from inferenceos.registry.store import ModelStore, name_for_file, split_base, split_info

MAX_DEPTH = 6
MAX_FILES = 20000  # entries looked at per folder: a bound on a walk of a huge tree
_MANIFEST_MAX = 1024 * 1024
_SHA256 = re.compile(r"[0-9a-f]{64}")
_OLLAMA_MODEL_LAYER = "application/vnd.ollama.image.model"
_OLLAMA_PROJECTOR_LAYER = "application/vnd.ollama.image.projector"


@dataclass(frozen=True)
class Found:
    """A model file another tool keeps, and the name it will be registered under."""

    name: str
    path: Path  # what llama.cpp opens (the first part of a split model)
    tool: str  # ollama | lm-studio | hf-cache | folder
    digest: str | None = None  # sha256 hex when known without reading the file
    projector: Path | None = None  # its multimodal projector, when it has one


@dataclass(frozen=True)
class Outcome:
    """What `discover` did with one Found: added, present, or skipped (and why)."""

    found: Found
    status: str  # added | present | skipped | would-add
    reason: str = ""


# -- where the tools keep their models ---------------------------------------------------


def ollama_root() -> Path:
    return Path(os.environ.get("OLLAMA_MODELS") or Path.home() / ".ollama" / "models")


def lmstudio_roots() -> list[Path]:
    return [Path.home() / ".lmstudio" / "models", Path.home() / ".cache" / "lm-studio" / "models"]


def hf_cache_root() -> Path:
    """The Hugging Face hub cache, from the environment as huggingface_hub reads it."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]) / "hub"
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "huggingface" / "hub"


def default_places() -> list[tuple[str, Path]]:
    return [("ollama", ollama_root()), *(("lm-studio", r) for r in lmstudio_roots()),
            ("hf-cache", hf_cache_root())]


# -- Ollama ------------------------------------------------------------------------------


def ollama_name(host: str, namespace: str, model: str, tag: str) -> str:
    """The name Ollama shows for a manifest path (validated)."""
    if host == "registry.ollama.ai":
        base = model if namespace == "library" else f"{namespace}/{model}"
    else:
        base = f"{host}/{namespace}/{model}"
    return canonical(f"{base}:{tag}")


def ollama_models(root: Path) -> Iterator[Found | Outcome]:
    """Each Ollama manifest's model blob (or why it was skipped)."""
    manifests = root / "manifests"
    if not manifests.is_dir():
        return
    for manifest in _walk(manifests, depth=4, want=lambda p: p.is_file()):
        parts = manifest.relative_to(manifests).parts
        if len(parts) != 4:
            continue
        shown = Found("/".join(parts), manifest, "ollama")
        try:
            name = ollama_name(*parts)
            layers = _ollama_layers(manifest)
            digest = layers.get(_OLLAMA_MODEL_LAYER)
        except (InferenceOSError, OSError, ValueError) as exc:
            yield Outcome(shown, "skipped", _short(exc))
            continue
        if digest is None:
            yield Outcome(shown, "skipped", "no model layer (not a GGUF model)")
            continue
        blob = root / "blobs" / f"sha256-{digest}"
        if not blob.is_file():
            yield Outcome(shown, "skipped", "its model blob is missing")
            continue
        proj = layers.get(_OLLAMA_PROJECTOR_LAYER)
        proj_blob = root / "blobs" / f"sha256-{proj}" if proj else None
        yield Found(name, blob, "ollama", digest, _checked_projector(proj_blob))


def _ollama_layers(manifest: Path) -> dict[str, str]:
    """{media type: sha256 hex} of a manifest's layers (the first of each type),
    digests validated."""
    if manifest.stat().st_size > _MANIFEST_MAX:
        raise ValueError("manifest too large")
    data = json.loads(manifest.read_bytes())
    layers = data.get("layers") if isinstance(data, dict) else None
    found: dict[str, str] = {}
    for layer in layers if isinstance(layers, list) else []:
        kind = layer.get("mediaType") if isinstance(layer, dict) else None
        if kind in (_OLLAMA_MODEL_LAYER, _OLLAMA_PROJECTOR_LAYER) and kind not in found:
            found[kind] = parse_digest(str(layer.get("digest")).replace("sha256-", "sha256:"))
    return found


def _checked_projector(path: Path | None) -> Path | None:
    """`path` when it is a real projector file (header checked), else None."""
    from inferenceos.model.projector_files import is_projector

    return path if path is not None and is_projector(path) else None


def _beside(path: Path) -> Path | None:
    from inferenceos.model.projector_files import find_projector

    return find_projector(path)


# -- LM Studio ---------------------------------------------------------------------------


def lmstudio_models(root: Path) -> Iterator[Found | Outcome]:
    """`PUBLISHER/REPO/FILE.gguf` under an LM Studio models folder."""
    from inferenceos.registry.hub_names import quant_label

    for path in _gguf_files(root):
        rel = path.relative_to(root).parts
        if len(rel) < 3:
            yield from _folder_found(path, "lm-studio")
            continue
        base = split_base(path)
        tag = quant_label(base.name) or base.stem
        try:
            name = canonical(f"{rel[0].lower()}/{rel[1].lower()}:{_tag(tag)}")
        except InvalidNameError as exc:
            yield Outcome(Found(str(Path(*rel)), path, "lm-studio"), "skipped", _short(exc))
            continue
        yield Found(name, path, "lm-studio", projector=_beside(path))


# -- the Hugging Face cache --------------------------------------------------------------


def _hf_repo_dirs(root: Path) -> Iterator[tuple[str, Path]]:
    if not root.is_dir():
        return
    for d in sorted(root.iterdir()):
        if d.is_dir() and d.name.startswith("models--"):
            org_repo = d.name[len("models--"):].split("--")
            if len(org_repo) == 2 and all(org_repo):
                yield "/".join(org_repo), d


def hf_cache_repo_files(repo: str, root: Path | None = None) -> dict[str, tuple[Path, str]]:
    """{path in repo: (snapshot file, sha256 hex)} for the GGUF files of `repo` in the
    Hugging Face cache (newest snapshot first wins). Only LFS files count: their blob is
    named by its sha256, which is where the digest comes from."""
    from inferenceos.registry.hub_names import validate_repo_path

    root = root or hf_cache_root()
    out: dict[str, tuple[Path, str]] = {}
    for name, d in _hf_repo_dirs(root):
        if name.lower() != repo.lower() or not (d / "snapshots").is_dir():
            continue
        snaps = sorted((s for s in (d / "snapshots").iterdir() if s.is_dir()),
                       key=lambda s: s.stat().st_mtime, reverse=True)
        for snap in snaps:
            for path in _gguf_files(snap):
                rel = "/".join(path.relative_to(snap).parts)
                sha = Path(os.path.realpath(path)).name
                if rel in out or not _SHA256.fullmatch(sha) or not path.is_file():
                    continue
                try:
                    out[validate_repo_path(rel)] = (path, sha)
                except InvalidNameError:
                    continue
    return out


def hf_cache_models(root: Path) -> Iterator[Found | Outcome]:
    """Every GGUF model in the Hugging Face cache, named as a pull would name it."""
    from inferenceos.registry.hub_names import HOST, HubFile, candidates

    for repo, _ in _hf_repo_dirs(root):
        files = hf_cache_repo_files(repo, root)
        hub_files = [HubFile(rel, p.stat().st_size, sha) for rel, (p, sha) in files.items()]
        for cand in candidates(hub_files):
            first = cand.files[0]
            path = files[first.path][0]
            try:
                name = canonical(f"{HOST}/{repo.lower()}:{_tag(cand.label)}")
            except InvalidNameError as exc:
                yield Outcome(Found(f"{repo}/{first.path}", path, "hf-cache"), "skipped",
                              _short(exc))
                continue
            yield Found(name, path, "hf-cache", first.sha256, _beside(path))


# -- plain folders -----------------------------------------------------------------------


def _folder_found(path: Path, tool: str) -> Iterator[Found | Outcome]:
    try:
        yield Found(name_for_file(split_base(path)), path, tool, projector=_beside(path))
    except InvalidNameError as exc:
        yield Outcome(Found(path.name, path, tool), "skipped", _short(exc))


def folder_models(root: Path) -> Iterator[Found | Outcome]:
    """A folder: read with the layout it has (Ollama's, the HF cache's), else every
    GGUF below it named from its file name."""
    if (root / "manifests").is_dir() and (root / "blobs").is_dir():
        yield from ollama_models(root)
    elif any(True for _ in _hf_repo_dirs(root)):
        yield from hf_cache_models(root)
    else:
        for path in _gguf_files(root):
            yield from _folder_found(path, "folder")


# -- walking -----------------------------------------------------------------------------


def _walk(root: Path, depth: int, want: Callable[[Path], bool]) -> Iterator[Path]:
    """Entries below `root` (at most `depth` levels, MAX_FILES looked at, symlinked
    folders not followed: a loop cannot trap the walk) for which `want` holds."""
    seen = 0
    stack = [(root, 0)]
    while stack:
        folder, level = stack.pop()
        try:
            entries = sorted(folder.iterdir(), reverse=True)
        except OSError:
            continue
        for entry in entries:
            seen += 1
            if seen > MAX_FILES:
                return
            if entry.is_dir() and not entry.is_symlink():
                if level + 1 < depth:
                    stack.append((entry, level + 1))
            elif want(entry):
                yield entry


def _gguf_files(root: Path) -> list[Path]:
    """GGUF model files below `root`: first parts of split models, no projectors."""
    def want(p: Path) -> bool:
        low = p.name.lower()
        if not low.endswith(".gguf") or "mmproj" in low or not p.is_file():
            return False
        info = split_info(p.name)
        return info is None or info[1] == 1
    return sorted(_walk(root, MAX_DEPTH, want))


def _tag(text: str) -> str:
    """A tag from a label or file stem: only the characters a tag allows."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("._-")[:120] or "latest"


def _short(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:160] or type(exc).__name__


# -- registering -------------------------------------------------------------------------


def scan(folders: list[Path] | None = None) -> Iterator[Found | Outcome]:
    """Everything found: in `folders` when given, else in the tools' default places."""
    if folders:
        for folder in folders:
            yield from folder_models(Path(folder).expanduser())
        return
    for tool, root in default_places():
        if tool == "ollama":
            yield from ollama_models(root)
        elif tool == "lm-studio":
            yield from lmstudio_models(root)
        else:
            yield from hf_cache_models(root)


def discover(store: ModelStore, folders: list[Path] | None = None, dry_run: bool = False,
             on_outcome: Callable[[Outcome], None] | None = None,
             check: Callable[[Path], None] | None = None) -> list[Outcome]:
    """Register in place what `scan` finds; one Outcome per model found.

    A name already registered for another file is left alone (skipped, with the reason);
    the same file under the same name is `present`. `check` (llama.cpp's load check,
    `--check`) runs on each new file first; a file it refuses is skipped with its reason.
    """
    from inferenceos.model.digest import file_digest

    outcomes: list[Outcome] = []
    for item in scan(folders):
        if isinstance(item, Outcome):
            outcome = item
        else:
            outcome = _register(store, item, dry_run, file_digest, check)
        outcomes.append(outcome)
        if on_outcome is not None:
            on_outcome(outcome)
    return outcomes


def _register(store: ModelStore, found: Found, dry_run: bool,
              digest_of: Callable[[Path], str],
              check: Callable[[Path], None] | None) -> Outcome:
    from inferenceos.model.spec import load_spec

    existing = store.find(found.name)
    if existing is not None:
        if existing.location == str(found.path.absolute()):
            if found.projector is not None and existing.projector is None and not dry_run:
                store.set_projector(found.name, location=found.projector)  # found since
            return Outcome(found, "present")
        return Outcome(found, "skipped", f"the name {found.name} is taken by another model")
    try:
        load_spec(found.path)  # the header must be a model InferenceOS can read
        if check is not None:
            check(found.path)
        if dry_run:
            return Outcome(found, "would-add")
        digest = found.digest or digest_of(found.path)
        store.register_in_place(found.path, found.name, digest, found.tool,
                                projector=found.projector)
    except (InferenceOSError, OSError) as exc:
        return Outcome(found, "skipped", _short(exc).replace(str(found.path), found.path.name))
    return Outcome(found, "added")
