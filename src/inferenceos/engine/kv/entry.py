"""One KV-cache entry on disk: the state of a token prefix, written atomically and
checked before it is ever restored.

Layout (little-endian):

    8 bytes   magic  b"IOSKV\\x01\\n\\x00"
    4 bytes   header length H
    H bytes   header JSON: {"key", "n_tokens", "state_bytes", "crc32", "cost_s",
              "created"}
    4·n bytes the prefix's token ids (int32)
    m bytes   the `llama_state_seq_get_data` bytes of those tokens

`crc32` covers the tokens and the state. A file is an entry only when its size is
exactly what its header says, its key is the one asked for, and the checksum matches:
a torn, truncated, corrupt or foreign file raises `EntryError` and is never handed to
llama.cpp. Writers write a temporary `.tmp-<pid>-<random>.kv` in the same folder,
fsync it and rename it into place, so a reader sees the whole entry or none; a writer
killed mid-entry leaves only a temporary file, which `is_temporary` names.
"""

from __future__ import annotations

import json
import os
import secrets
import struct
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MAGIC = b"IOSKV\x01\n\x00"
SUFFIX = ".kv"
_HEAD = struct.Struct("<8sI")
_MAX_HEADER = 1 << 16  # a header is ~200 bytes: anything larger is not ours


class EntryError(Exception):
    """A file that is not a valid entry for the key asked (says why)."""


@dataclass(frozen=True)
class EntryMeta:
    """What an entry's header and token list say (the state bytes are not read)."""

    path: Path
    key: str
    tokens: np.ndarray  # int32, the prefix the state holds
    state_offset: int
    state_bytes: int
    crc32: int
    cost_s: float  # what recomputing the prefix costs (tokens x measured prefill rate)
    created: float

    @property
    def n_tokens(self) -> int:
        return int(self.tokens.size)

    @property
    def file_bytes(self) -> int:
        return self.state_offset + self.state_bytes


def is_temporary(name: str) -> bool:
    """A writer's unfinished file (never read as an entry)."""
    return name.startswith(".tmp-") and name.endswith(SUFFIX)


def _crc(tokens: bytes, state: bytes | memoryview) -> int:
    return zlib.crc32(state, zlib.crc32(tokens)) & 0xFFFFFFFF


def write_entry(path: Path, key: str, tokens: list[int] | np.ndarray, state: bytes,
                cost_s: float) -> int:
    """Write the entry atomically at `path` (fsynced temp file + rename); returns the
    file's size. OSError (disk full, no permission) leaves no file behind."""
    tok = np.asarray(tokens, dtype="<i4").tobytes()
    header = json.dumps({"key": key, "n_tokens": len(tok) // 4, "state_bytes": len(state),
                         "crc32": _crc(tok, state), "cost_s": round(float(cost_s), 6),
                         "created": time.time()}).encode()
    tmp = path.with_name(f".tmp-{os.getpid()}-{secrets.token_hex(4)}{SUFFIX}")
    try:
        with open(tmp, "wb") as fh:
            fh.write(_HEAD.pack(MAGIC, len(header)))
            fh.write(header)
            fh.write(tok)
            fh.write(state)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return _HEAD.size + len(header) + len(tok) + len(state)


def read_meta(path: Path, key: str | None = None) -> EntryMeta:
    """The header and tokens of the entry at `path` (its size checked against the
    header; its key against `key` when given). EntryError when it is not one."""
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            head = fh.read(_HEAD.size)
            if len(head) < _HEAD.size:
                raise EntryError("truncated header")
            magic, hlen = _HEAD.unpack(head)
            if magic != MAGIC or hlen > _MAX_HEADER:
                raise EntryError("not an InferenceOS KV entry")
            try:
                h = json.loads(fh.read(hlen))
                n, m = int(h["n_tokens"]), int(h["state_bytes"])
                entry_key, crc = str(h["key"]), int(h["crc32"])
                cost, created = float(h.get("cost_s", 0.0)), float(h.get("created", 0.0))
            except (ValueError, KeyError, TypeError) as exc:
                raise EntryError(f"unreadable header ({exc})") from None
            offset = _HEAD.size + hlen + 4 * n
            if n <= 0 or m <= 0 or offset + m != size:
                raise EntryError(f"size {size} bytes is not the {offset + max(m, 0)} its "
                                 "header promises (torn or truncated)")
            if key is not None and entry_key != key:
                raise EntryError("written for another model or other KV settings")
            tokens = np.frombuffer(fh.read(4 * n), dtype="<i4").astype(np.int32)
    except OSError as exc:
        raise EntryError(f"cannot read it ({exc.strerror or exc})") from None
    return EntryMeta(path, entry_key, tokens, offset, m, crc, cost, created)


def read_state(meta: EntryMeta) -> bytes:
    """The entry's state bytes, checked against its checksum (EntryError otherwise; the
    file may have been replaced or cut since `meta` was read)."""
    try:
        with open(meta.path, "rb") as fh:
            if os.fstat(fh.fileno()).st_size != meta.file_bytes:
                raise EntryError("its size changed since it was indexed")
            fh.seek(meta.state_offset)
            state = fh.read(meta.state_bytes)
    except OSError as exc:
        raise EntryError(f"cannot read it ({exc.strerror or exc})") from None
    tok = np.asarray(meta.tokens, dtype="<i4").tobytes()
    if len(state) != meta.state_bytes or _crc(tok, state) != meta.crc32:
        raise EntryError("checksum mismatch (corrupt)")
    return state
