"""Pulls from the Hugging Face Hub: `hf.co/ORG/REPO[:QUANT]` and `hf.co/ORG/REPO/FILE.gguf`.

Ollama's syntax: the quant tag picks the file (`:Q4_K_M` → `...-Q4_K_M.gguf`); without
one, the best quant for this machine is taken (`choose`). Split GGUFs
(`-00001-of-0000N.gguf`) are pulled whole and registered as one model.

Contract (each point has a test against the fake Hub in tests/fake_hub.py):
- Every part of the name (org, repo, quant, each folder of the file path) is validated
  before anything is built from it, and so is every file name and digest the Hub
  answers: `..`, absolute paths, backslashes, NULs and control characters are refused.
- `huggingface_hub` does the talking to the Hub (`HF_ENDPOINT`, `HF_TOKEN` or the saved
  login, `HF_HUB_OFFLINE`): the file list with each file's LFS sha256 and size
  (`model_info(files_metadata=True)`), and each file's HEAD (`get_hf_file_metadata`:
  commit, ETag, size, where the bytes are). The bytes themselves are fetched by
  `hub_download.py`, with Range requests, so a cut connection resumes where it
  stopped (up to `retries` times in one pull, and from the kept `.download-<sha256>`
  file on the next pull), progress is reported per chunk, and the sha256 is computed
  while the bytes arrive. The token is only sent to the Hub's own host, never to the
  CDN a file redirects to.
- Free disk space is checked before the first byte.
- A file appears as a model only after its sha256 matched the Hub's LFS digest and
  llama.cpp's own dry load accepted it (`loadcheck.py`), then by a rename inside the
  store (`ModelStore.add_blob` / `add_parts`). A wrong digest deletes the download and
  registers nothing.
- One pull of a model at a time (across processes): a pull claims the model's first
  `.download-` file (`hub_download.claim`) until its files are in the store; a second
  pull of it meanwhile is refused ("another pull of this file is running", a 4xx), and
  one that gets the claim just after looks again and finds the model registered.
- A repo with a multimodal projector (`mmproj*.gguf`) gives it with the model: the one
  `hub_names.choose_projector` picks (f16 first), fetched after the model file with the
  same digest checks, and kept only when its header says it is a projector
  (`general.architecture == "clip"`; anything else is skipped with a note). It goes into
  the store as a blob of its own, recorded on the entry; a model already up to date gets
  a projector it lacks.
- Offline (`HF_HUB_OFFLINE=1`): the model is taken from the Hugging Face cache when it is
  there (hard-linked or copied into the store), else the pull fails and says why.

The names, the quant labels and the default quant rule are in `hub_names.py`; the
download of one file (HTTP, redirects, resume, sha256) in `hub_download.py`.
"""

from __future__ import annotations

import os
import re
import shutil
import threading
import time
import urllib.parse
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO, Any

from inferenceos.errors import InferenceOSError, ModelNotFoundError, UsageError
from inferenceos.paths import ensure_dir
from inferenceos.registry.hub_download import HubError, claim, download, endpoint
from inferenceos.registry.hub_names import (
    Candidate,
    HubFile,
    HubRef,
    candidates,
    choose,
    choose_projector,
    is_hub_name,
    parse_hub_ref,
    validate_repo_path,
)
from inferenceos.registry.names import InvalidNameError, canonical
from inferenceos.registry.store import ModelEntry, ModelStore, split_file_name, split_info
from inferenceos.units import format_bytes

_SHA256 = re.compile(r"[0-9a-f]{64}")
DISK_MARGIN = 64 * 1024 * 1024
_MAX_SIZE = 1 << 50  # 1 PiB: anything larger is a lie from the server


@dataclass(frozen=True)
class PullEvent:
    """One step of a pull, shaped like Ollama's `/api/pull` progress lines."""

    status: str
    digest: str | None = None  # sha256 hex of the file being fetched
    total: int | None = None
    completed: int | None = None
    entry: ModelEntry | None = field(default=None, compare=False)  # on "success"

    def to_ollama(self) -> dict[str, Any]:
        line: dict[str, Any] = {"status": self.status}
        if self.digest:
            line["digest"] = f"sha256:{self.digest}"
        if self.total is not None:
            line["total"] = self.total
        if self.completed is not None:
            line["completed"] = self.completed
        return line


# -- talking to the Hub ------------------------------------------------------------------


def offline() -> bool:
    """huggingface_hub's offline switch, read now (`HF_HUB_OFFLINE=1`)."""
    from huggingface_hub import constants

    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE")
    if value is None:
        return bool(constants.HF_HUB_OFFLINE)
    return value.strip().upper() in {"1", "ON", "YES", "TRUE"}


def _hub_error(exc: Exception, ref: HubRef) -> InferenceOSError:
    from huggingface_hub import errors

    shown = f"hf.co/{ref.repo}"
    if isinstance(exc, errors.GatedRepoError):
        return HubError(f"{shown} is gated: accept its terms on the Hub and set HF_TOKEN "
                        "(or run `hf auth login`)")
    if isinstance(exc, errors.RepositoryNotFoundError):
        return ModelNotFoundError(f"{shown}: no such repository on {endpoint()} (or it is "
                                  "private: set HF_TOKEN)")
    if isinstance(exc, errors.RevisionNotFoundError):
        return ModelNotFoundError(f"{shown}: no such revision")
    if isinstance(exc, errors.OfflineModeIsEnabled):
        return HubError(f"{shown}: offline mode (HF_HUB_OFFLINE) is on")
    status = getattr(getattr(exc, "response", None), "status_code", None)
    if status is not None:
        return HubError(f"{shown}: the Hub answered HTTP {status}")
    msg = " ".join(str(exc).split())[:200]
    return HubError(f"cannot reach the Hub at {endpoint()}: {type(exc).__name__}: {msg}")


def repo_files(ref: HubRef) -> tuple[str, list[HubFile]]:
    """The repo's commit and its files with sizes and LFS digests (validated)."""
    from huggingface_hub import HfApi

    try:
        info = HfApi(endpoint=endpoint()).model_info(ref.repo, files_metadata=True)
    except Exception as exc:  # httpx errors are not OSError; map them all to one line
        raise _hub_error(exc, ref) from None
    commit = str(info.sha or "main")
    if not re.fullmatch(r"[0-9a-f]{40}|main", commit):
        raise HubError(f"hf.co/{ref.repo}: the Hub answered a bad commit id")
    files = []
    for s in info.siblings or []:
        if not str(s.rfilename).lower().endswith(".gguf"):
            continue
        lfs = s.lfs
        sha = str(lfs.sha256 if lfs is not None else "")
        size = int(lfs.size if lfs is not None else (s.size or 0))
        if not _SHA256.fullmatch(sha) or not 0 < size < _MAX_SIZE:
            continue  # not an LFS file: no digest to verify against, so never pulled
        try:
            files.append(HubFile(validate_repo_path(str(s.rfilename)), size, sha))
        except InvalidNameError:
            continue  # a name we would not build a path from; not a model we pull
    return commit, files


def _file_location(ref: HubRef, commit: str, f: HubFile) -> str:
    """HEAD the file (huggingface_hub): check the Hub's ETag against the listed digest,
    return the URL its bytes come from."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    url = hf_hub_url(ref.repo, f.path, revision=commit, endpoint=endpoint())
    if not url.startswith(endpoint()):  # hf_hub_url only swaps the import-time endpoint
        url = f"{endpoint()}/{ref.repo}/resolve/{commit}/{urllib.parse.quote(f.path)}"
    try:
        meta = get_hf_file_metadata(url, endpoint=endpoint())
    except Exception as exc:
        raise _hub_error(exc, ref) from None
    etag = (meta.etag or "").strip('"')
    if _SHA256.fullmatch(etag) and etag != f.sha256:
        raise HubError(f"{f.path}: the Hub lists sha256 {f.sha256[:12]} but serves "
                       f"{etag[:12]}; nothing was registered")
    if meta.size is not None and meta.size != f.size:
        raise HubError(f"{f.path}: the Hub lists {f.size} bytes but serves {meta.size}")
    return str(meta.location or url)


# -- downloading (the transport: hub_download.py) ----------------------------------------


def _fetch(url: str, f: HubFile, partial: Path, retries: int,
           cancel: threading.Event | None, claimed: IO[bytes] | None = None
           ) -> Iterator[PullEvent]:
    """`hub_download.download`'s progress as the pull's "pulling <digest>" events."""
    for done in download(url, f, partial, retries, cancel, claimed=claimed):
        yield PullEvent(f"pulling {f.sha256[:12]}", f.sha256, f.size, done)


def check_disk(store: ModelStore, needed: int) -> None:
    """UsageError when the store's disk cannot take `needed` more bytes."""
    ensure_dir(store.blobs)
    free = shutil.disk_usage(store.blobs).free
    if needed + DISK_MARGIN > free:
        raise UsageError(f"not enough disk space: the model needs {format_bytes(needed)} "
                         f"more, the model store's disk has {format_bytes(free)} free")


# -- the pull ----------------------------------------------------------------------------

Check = Callable[[Path], None]


def _default_check(path: Path) -> None:
    from inferenceos.registry.loadcheck import check_loadable

    check_loadable(path)


def pull_events(store: ModelStore, text: str, *, name: str | None = None,
                memory_bytes: int | None = None, retries: int = 3,
                cancel: threading.Event | None = None,
                check: Check = _default_check) -> Iterator[PullEvent]:
    """Pull `text` (`hf.co/...`) into `store`, yielding progress; the last event is
    `success` with the registered entry. See the module docstring for the contract."""
    ref = parse_hub_ref(text)
    key = canonical(name) if name else None
    yield PullEvent("pulling manifest")
    if offline():
        yield from _from_hf_cache(store, ref, key, memory_bytes)
        return
    commit, files = repo_files(ref)
    if ref.file:
        matching = [c for c in candidates(files) if c.files[0].path == ref.file]
        if not matching:
            info = split_info(PurePosixPath(ref.file).name)
            why = "it is not the first part of a split model" if info and info[1] > 1 \
                else "no such GGUF file (with an LFS digest) in the repository"
            raise ModelNotFoundError(f"hf.co/{ref.repo}/{ref.file}: {why}")
        cand, why = matching[0], f"{matching[0].label}, as named"
    else:
        cand, why = choose(candidates(files), ref.quant, memory_bytes, f"hf.co/{ref.repo}")
    key = key or ref.registry_name(cand.label if ref.file else None)
    yield PullEvent(f"chose {cand.files[0].path}: {why}")
    proj = choose_projector(files, cand)
    if proj is not None:
        yield PullEvent(f"projector: {proj.path}")
    # outside the claim only "already up to date": fetching a missing projector
    # moves a file into the store, which must happen inside it
    entry = yield from _refresh(store, ref, commit, cand, proj, key, retries, cancel,
                                fetch=False)
    if entry is None:
        # partial downloads are named by their (validated) digest, so a later pull
        # resumes them; the claim on the first makes this the one pull of this model
        # until its files are in the store (a second at the same time is refused)
        partials = [store.blobs / f".download-{f.sha256}" for f in cand.files]
        ensure_dir(store.blobs)
        with claim(partials[0]) as held:
            # again inside the claim: the pull that held it may have just registered it
            entry = yield from _refresh(store, ref, commit, cand, proj, key, retries,
                                        cancel)
            if entry is None:
                entry = yield from _pull_new(store, ref, commit, cand, proj, partials,
                                             held, key, retries, cancel, check)
    yield PullEvent("success", entry=entry)


def _refresh(store: ModelStore, ref: HubRef, commit: str, cand: Candidate,
             proj: HubFile | None, key: str, retries: int,
             cancel: threading.Event | None, fetch: bool = True
             ) -> Generator[PullEvent, None, ModelEntry | None]:
    """`key`'s entry when it already holds `cand`'s model: as is ("already up to
    date"), or with the projector it lacks fetched (with `fetch`; None without); None
    when the model must be pulled."""
    existing = store.find(key)
    if not (existing and existing.digest == cand.files[0].sha256
            and existing.path.is_file() and not existing.in_place):
        return None
    if proj is None or (existing.projector_digest == proj.sha256
                        and existing.projector is not None
                        and existing.projector.is_file()):
        yield PullEvent("already up to date")
        return existing
    if not fetch:
        return None
    check_disk(store, _still_needed([proj], store))
    got = yield from _pull_projector(store, ref, commit, proj, retries, cancel,
                                     existing.path)
    if got is not None:
        yield PullEvent("writing manifest")
        existing = store.set_projector(key, store.add_projector_blob(*got))
    return existing


def _pull_new(store: ModelStore, ref: HubRef, commit: str, cand: Candidate,
              proj: HubFile | None, partials: list[Path], held: IO[bytes], key: str,
              retries: int, cancel: threading.Event | None, check: Check
              ) -> Generator[PullEvent, None, ModelEntry]:
    """Download, check and register `cand` (and `proj`) under `key`; `held` is the
    caller's claim on `partials[0]`."""
    wanted = [*cand.files, *([proj] if proj is not None else [])]
    if not (len(cand.files) == 1 and store.blob_path(cand.files[0].sha256).is_file()):
        check_disk(store, _still_needed(wanted, store))
    elif proj is not None:
        check_disk(store, _still_needed([proj], store))
    source = f"{endpoint()}/{ref.repo}@{commit[:12]}"
    if len(cand.files) == 1:
        return (yield from _pull_single(store, ref, commit, cand.files[0], partials[0],
                                        held, key, source, retries, cancel, check, proj))
    return (yield from _pull_split(store, ref, commit, cand, partials, held, key, source,
                                   retries, cancel, check, proj))


def _still_needed(files: list[HubFile], store: ModelStore) -> int:
    """Bytes still to download for `files` (their blobs and partial downloads counted)."""
    needed = 0
    for f in files:
        if store.blob_path(f.sha256).is_file():
            continue
        partial = store.blobs / f".download-{f.sha256}"
        needed += max(0, f.size - (partial.stat().st_size if partial.is_file() else 0))
    return needed


def _pull_projector(store: ModelStore, ref: HubRef, commit: str, f: HubFile | None,
                    retries: int, cancel: threading.Event | None, model_file: Path
                    ) -> Generator[PullEvent, None, tuple[Path, str] | None]:
    """Fetch the projector `f` (digest-checked) and check its header, and that its
    output width is the model's (`model_file`'s) input width, as mtmd will: (file,
    sha256) ready for `ModelStore.add_projector_blob`, or None when there is none or it
    does not fit (the download is deleted, with a note)."""
    from inferenceos.model.projector_files import fits_model, read_projector

    if f is None:
        return None
    blob = store.blob_path(f.sha256)
    if f.sha256 in model_file.name:  # the model's own bytes (its blob or download)
        yield PullEvent(f"skipping {f.path}: it is the model file itself, not a projector")
        return None
    partial = blob if blob.is_file() and blob.stat().st_size == f.size \
        else store.blobs / f".download-{f.sha256}"  # a blob: another model's, already here
    if partial != blob:
        url = _file_location(ref, commit, f)
        yield from _fetch(url, f, partial, retries, cancel)
        yield PullEvent("verifying sha256 digest", f.sha256)
    try:
        why = fits_model(read_projector(partial), model_file)
    except InferenceOSError as exc:
        why = str(exc).replace(str(partial), f.path)
    if why:
        if partial != blob:
            partial.unlink(missing_ok=True)
        yield PullEvent(f"skipping {f.path}: {why[:200]}")
        return None
    return partial, f.sha256


def _pull_single(store: ModelStore, ref: HubRef, commit: str, f: HubFile, partial: Path,
                 held: IO[bytes], key: str, source: str, retries: int,
                 cancel: threading.Event | None, check: Check, proj: HubFile | None = None
                 ) -> Generator[PullEvent, None, ModelEntry]:
    blob = store.blob_path(f.sha256)
    if blob.is_file() and blob.stat().st_size == f.size:  # same content under another name
        got = yield from _pull_projector(store, ref, commit, proj, retries, cancel, blob)
        yield PullEvent("writing manifest")
        return store.add_blob(blob, f.sha256, key, source, projector=got)
    url = _file_location(ref, commit, f)
    yield from _fetch(url, f, partial, retries, cancel, held)
    yield PullEvent("verifying sha256 digest", f.sha256)
    yield PullEvent("checking that llama.cpp can load it")
    try:
        check(partial)
    except InferenceOSError:
        partial.unlink(missing_ok=True)
        raise
    # the projector after the model: a model refused by llama.cpp costs no projector
    # download, and a cut here keeps the model's verified download for the next pull
    got = yield from _pull_projector(store, ref, commit, proj, retries, cancel, partial)
    yield PullEvent("writing manifest")
    return store.add_blob(partial, f.sha256, key, source, projector=got)


def _pull_split(store: ModelStore, ref: HubRef, commit: str, cand: Candidate,
                partials: list[Path], held: IO[bytes], key: str, source: str, retries: int,
                cancel: threading.Event | None, check: Check, proj: HubFile | None = None
                ) -> Generator[PullEvent, None, ModelEntry]:
    n = len(cand.files)
    for f, partial in zip(cand.files, partials, strict=True):
        url = _file_location(ref, commit, f)
        yield from _fetch(url, f, partial, retries, cancel,
                          held if partial == partials[0] else None)
        yield PullEvent("verifying sha256 digest", f.sha256)
    folder = store.blobs / f".partial-parts-{os.getpid()}-{time.monotonic_ns()}"
    folder.mkdir()
    try:
        for i, partial in enumerate(partials, start=1):
            target = folder / split_file_name(i, n)
            try:
                os.link(partial, target)
            except OSError:
                shutil.copyfile(partial, target)
        yield PullEvent("checking that llama.cpp can load it")
        try:
            check(folder / split_file_name(1, n))
        except InferenceOSError:
            for p in partials:
                p.unlink(missing_ok=True)
            raise
        got = yield from _pull_projector(store, ref, commit, proj, retries, cancel,
                                         folder / split_file_name(1, n))
        yield PullEvent("writing manifest")
        entry = store.add_parts(folder, cand.files[0].sha256, key, source, projector=got)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    for p in partials:
        p.unlink(missing_ok=True)
    return entry


def _from_hf_cache(store: ModelStore, ref: HubRef, key: str | None,
                   memory_bytes: int | None) -> Iterator[PullEvent]:
    """Offline: the model from the local Hugging Face cache, or a clear refusal."""
    from inferenceos.registry.discover import hf_cache_repo_files

    found = hf_cache_repo_files(ref.repo)
    files = [HubFile(rel, p.stat().st_size, sha) for rel, (p, sha) in found.items()]
    cands = candidates(files)
    if ref.file:
        cands = [c for c in cands if c.files[0].path == ref.file]
    if not cands:
        raise HubError(f"offline mode (HF_HUB_OFFLINE) is on and hf.co/{ref.repo} "
                       f"{'has no ' + ref.file if ref.file else 'has no GGUF model'} in the "
                       "Hugging Face cache; unset HF_HUB_OFFLINE to download it")
    if ref.file:
        cand, why = cands[0], "as named"
    else:
        cand, why = choose(cands, ref.quant, memory_bytes, f"hf.co/{ref.repo}")
    yield PullEvent(f"offline: taking {cand.files[0].path} from the Hugging Face cache "
                    f"({why})")
    first = found[cand.files[0].path][0]
    entry = store.import_file(first, key or ref.registry_name(cand.label if ref.file else None),
                              link=True, source_label=f"hf-cache:{ref.repo}",
                              check=_default_check)
    yield PullEvent("success", entry=entry)


def pull(store: ModelStore, text: str, on_event: Callable[[PullEvent], None] | None = None,
         **options: Any) -> ModelEntry:
    """Pull a Hub model (or, for any other name, `store.pull`); returns its entry."""
    if not is_hub_name(text):
        entry = store.pull(text, progress=(lambda m: on_event(PullEvent(m))) if on_event
                           else lambda _: None)
        if options.get("name"):
            entry = store.copy(entry.name, options["name"])
        return entry
    result: ModelEntry | None = None
    for event in pull_events(store, text, **options):
        if on_event is not None:
            on_event(event)
        result = event.entry or result
    assert result is not None  # pull_events ends with "success" or raises
    return result
