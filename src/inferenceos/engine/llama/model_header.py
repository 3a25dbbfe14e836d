"""The GGUF header of a model the engine has loaded, parsed once per process.

A model worker needed the same header three and four times as it started (its spec, the
weight spans of the streamer and of the residency record, the expert ranges, the output
head's type), each a full parse of the metadata: ~0.1 s apiece on a 151k-token
vocabulary, which a cold load or a restarted worker waits for. `model_header(path)`
parses once per file identity (inode, size, modification time) and shares the result:
callers treat it as read-only. It is for files llama.cpp has mapped (a served model is
not rewritten under a running worker); model/gguf_file.read_gguf stays the uncached
reader for everything that validates files that may change.
"""

from __future__ import annotations

import functools
from pathlib import Path

from inferenceos.model.gguf_file import GGUFFile, read_gguf


def model_header(path: str | Path) -> GGUFFile:
    """`read_gguf(path)`, parsed once per process while the file is unchanged; the same
    errors as read_gguf for a missing or malformed file (errors are not cached)."""
    p = Path(path)
    try:
        st = p.stat()
    except OSError:
        return read_gguf(p)  # its one-line error for a missing or unreadable file
    return _parsed(p, st.st_ino, st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=4)
def _parsed(path: Path, inode: int, size: int, mtime_ns: int) -> GGUFFile:
    return read_gguf(path)
