"""Downloading one Hub file: resumable, verified, the token kept on the Hub's host.

The transport under `hub.py`'s pulls (which file, split GGUFs and projectors are
decided there; huggingface_hub lists the files and HEADs them there). Contract of
`download(url, f, partial)`:
- The bytes are fetched with Range requests: a cut connection resumes where it
  stopped (up to `retries` times in a row without progress), and a later call resumes
  from what `partial` (the store's `.download-<sha256>` file) already holds. A server
  that ignores Range, or answers 416, starts the file over; one that resumes at the
  wrong offset is an error.
- The sha256 is computed while the bytes arrive (and over what `partial` held); on
  return `partial` holds exactly `f.size` bytes with `f.sha256`, fsynced. A mismatch
  deletes it and raises `HubError`.
- huggingface_hub's headers (user agent, token) go to the Hub's own host only
  (`endpoint()`): never to the CDN a file redirects to (`_SameHostAuth`).
- A write error (a full disk) is not retried: `_WriteError`, a StorageError, keeps the
  partial file for the next pull. A second pull of the same file at the same time is
  refused (`claim`: an exclusive lock on `partial`, which the caller may hold until the
  file is in the store). `cancel` stops it between chunks.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import os
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from inferenceos.errors import InferenceOSError, StorageError, UsageError
from inferenceos.registry.hub_names import HubFile
from inferenceos.units import format_bytes

__all__ = ["DEFAULT_ENDPOINT", "HubError", "claim", "download", "endpoint"]

DEFAULT_ENDPOINT = "https://huggingface.co"
_CHUNK = 1024 * 1024


class HubError(InferenceOSError):
    """The Hub could not be reached, or refused, or answered something unusable."""


def endpoint() -> str:
    """The Hub's base URL: `HF_ENDPOINT` (read now, not at import) or huggingface.co."""
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def _headers_for(url: str) -> dict[str, str]:
    """huggingface_hub's headers (user agent, token) for the Hub's own host only."""
    from huggingface_hub.utils import build_hf_headers

    headers = dict(build_hf_headers())
    if urllib.parse.urlsplit(url)[:2] != urllib.parse.urlsplit(endpoint())[:2]:
        headers.pop("authorization", None)
        headers.pop("Authorization", None)
    headers["Accept-Encoding"] = "identity"
    return headers


class _SameHostAuth(urllib.request.HTTPRedirectHandler):
    """Follow redirects, dropping the token when one leaves the Hub's host."""

    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any,
                         newurl: str) -> Any:
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and urllib.parse.urlsplit(newurl)[:2] != \
                urllib.parse.urlsplit(req.full_url)[:2]:
            new.remove_header("Authorization")
        return new


_opener = urllib.request.build_opener(_SameHostAuth)


class _Cancelled(InferenceOSError):
    pass


@contextlib.contextmanager
def claim(partial: Path) -> Iterator[IO[bytes]]:
    """`partial` opened for appending and exclusively locked until the block ends: the
    one pull of that file. Whoever moves or removes `partial` (into the store) must do
    it inside the claim, so a claim holder reads a file no one else changes.

    UsageError ("another pull of this file is running") when another claim holds it.
    A file moved away between our open and our lock (the holder finished) is opened
    again, so a pull that waited on a finished one sees its result. An empty `partial`
    is removed when the claim ends: a pull that found nothing to do leaves no file.
    """
    for _ in range(3):
        fh = partial.open("ab")
        try:
            if not _lock(fh, partial):
                continue  # the holder moved it between our open and our lock
            try:
                yield fh
            finally:
                if _still_at(fh, partial) and os.fstat(fh.fileno()).st_size == 0:
                    partial.unlink(missing_ok=True)
            return
        finally:
            fh.close()
    raise _busy(partial)


def _busy(partial: Path) -> UsageError:
    """The answer to a pull of a file another pull holds (a 4xx: try again later)."""
    return UsageError(f"{partial.name[10:22]}: another pull of this file is running")


def _lock(fh: IO[bytes], path: Path) -> bool:
    """Lock `fh` (non-blocking): True when held and `path` still names it, False when
    the file was moved away first; UsageError when another holder has it."""
    try:
        import fcntl

        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except ImportError:  # not POSIX: no lock
        return True
    except OSError:
        raise _busy(path) from None
    return _still_at(fh, path)


def _still_at(fh: IO[bytes], path: Path) -> bool:
    """Whether `path` still names the file `fh` has open."""
    try:
        return os.fstat(fh.fileno()).st_ino == path.stat().st_ino
    except OSError:
        return False


def _hash_existing(path: Path) -> tuple[Any, int]:
    h = hashlib.sha256()
    done = 0
    with path.open("rb") as fh:
        while chunk := fh.read(4 * _CHUNK):
            h.update(chunk)
            done += len(chunk)
    return h, done


def download(url: str, f: HubFile, partial: Path, retries: int = 3,
             cancel: threading.Event | None = None, timeout: float = 30.0,
             claimed: IO[bytes] | None = None) -> Iterator[int]:
    """Fetch `f` into `partial`, resuming from what it holds; yield progress: the bytes
    of `f` on disk so far (first what `partial` already held, then at most every 0.2 s,
    and once complete).

    On return `partial` holds exactly `f.size` bytes whose sha256 is `f.sha256`; a
    mismatch deletes it and raises HubError. A connection cut is retried from where it
    stopped, up to `retries` times in a row without progress; after that the partial
    file stays for the next pull. A write error (a full disk) is not retried.
    `claimed`: `partial`'s handle from the caller's `claim` (held past the return, so
    the verified file can be moved into the store before another pull sees it);
    without it, the download claims `partial` itself.
    """
    with contextlib.nullcontext(claimed) if claimed is not None else claim(partial) as out:
        part = _Partial(out, *_hash_existing(partial))
        if part.done > f.size:
            part.restart()
        yield part.done
        part.reported = time.monotonic()
        failures, failed_at = 0, part.done
        while part.done < f.size:
            headers = _headers_for(url)
            if part.done:
                headers["Range"] = f"bytes={part.done}-"
            try:
                yield from _get(urllib.request.Request(url, headers=headers), f, part,
                                cancel, timeout)
            except urllib.error.HTTPError as exc:
                if exc.code == 416 and part.done:  # nothing left to send from that offset
                    part.restart()
                    continue
                raise HubError(f"{f.path}: the Hub answered HTTP {exc.code}") from None
            except (OSError, ValueError, http.client.HTTPException) as exc:  # cuts, timeouts
                out.flush()
                if part.done > failed_at:  # it moved since the last cut: fresh retries
                    failures, failed_at = 0, part.done
                failures += 1
                if failures > retries:
                    raise HubError(
                        f"download of {f.path} interrupted at {format_bytes(part.done)} of "
                        f"{format_bytes(f.size)} ({_reason(exc)}); run the same pull again "
                        "to resume") from None
                time.sleep(min(8.0, 0.25 * 2 ** failures))
        os.fsync(out.fileno())
        _verify(f, part, partial)


@dataclass
class _Partial:
    """The download file being filled: its handle, the sha256 of what it holds and how
    many bytes, and when progress was last reported (across reconnections)."""

    out: IO[bytes]
    h: Any
    done: int
    reported: float = field(default_factory=time.monotonic)

    def add(self, chunk: bytes) -> None:
        _write(self.out, chunk)
        self.h.update(chunk)
        self.done += len(chunk)

    def restart(self) -> None:
        """Empty the file: its bytes are no prefix of what the server sends now."""
        self.out.truncate(0)
        self.h, self.done = hashlib.sha256(), 0


def _get(req: urllib.request.Request, f: HubFile, part: _Partial,
         cancel: threading.Event | None, timeout: float) -> Iterator[int]:
    """One GET of `f` from `part.done` on (a Range request when not 0), into `part`;
    yields progress. ConnectionError when the server closes before the end."""
    done = part.done
    with _opener.open(req, timeout=timeout) as resp:
        if done and resp.status != 206:  # the server ignored Range: start over
            part.restart()
        elif done and not str(resp.headers.get("Content-Range", "")).startswith(
                f"bytes {done}-"):
            raise HubError(f"{f.path}: the server resumed at the wrong offset")
        # read1: what has arrived (up to 1 MiB), so cancel and progress stay live
        while chunk := resp.read1(min(_CHUNK, f.size - part.done) or 1):
            if cancel is not None and cancel.is_set():
                raise _Cancelled("pull cancelled; run it again to resume")
            part.add(chunk)
            if part.done > f.size:
                break
            if time.monotonic() - part.reported >= 0.2 or part.done == f.size:
                part.reported = time.monotonic()
                yield part.done
        part.out.flush()
        if part.done < f.size:
            raise ConnectionError("the connection closed early")


def _verify(f: HubFile, part: _Partial, partial: Path) -> None:
    """HubError (and the download deleted) unless it is exactly `f`'s bytes."""
    if part.done != f.size or part.h.hexdigest() != f.sha256:
        partial.unlink(missing_ok=True)
        got = part.h.hexdigest() if part.done == f.size else f"{part.done} bytes"
        raise HubError(f"{f.path}: sha256 mismatch (the Hub says {f.sha256[:12]}, the "
                       f"download is {got[:12]}); the download was deleted and nothing "
                       "was registered")


class _WriteError(StorageError):
    """The store cannot take the bytes (a full disk): the server's 503, not the client's
    fault; the partial file is kept, so the pull resumes once there is room."""


def _write(out: IO[bytes], chunk: bytes) -> None:
    try:
        out.write(chunk)
    except OSError as exc:  # not a network error: retrying would not help
        raise _WriteError(f"cannot write the download to the model store: {exc.strerror}"
                          ) from None


def _reason(exc: BaseException) -> str:
    reason = getattr(exc, "reason", None) or exc
    return " ".join(str(reason).split())[:120] or type(exc).__name__
