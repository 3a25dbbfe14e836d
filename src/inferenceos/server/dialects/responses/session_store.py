"""Server-side sessions on disk: a conversation and the KV state that holds it.

Each session is a folder `<data dir>/sessions/<id>/` with `session.json` (model,
system message, messages, the token ids its KV state holds, the model's digest) and
`state.bin` (the `llama_state_seq_get_data` bytes of those tokens). Ids are
`sess_` + 24 hex digits and are checked before any path is built from one. Both files
are written atomically (state first, then the JSON that names it), so a crash leaves
the previous turn's pair or the new one, never a JSON that promises a missing state.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from inferenceos.atomic import write_json_atomic
from inferenceos.errors import InferenceOSError

_ID = re.compile(r"sess_[0-9a-f]{24}")


class SessionNotFoundError(InferenceOSError):
    """No session with that id (HTTP 404)."""


@dataclass
class Session:
    """One conversation kept by the server."""

    id: str
    model: str
    created_at: int
    updated_at: int
    system: str = ""
    metadata: dict[str, str] = field(default_factory=dict)
    messages: list[dict[str, str]] = field(default_factory=list)
    state_tokens: list[int] = field(default_factory=list)  # what state.bin holds
    model_digest: str = ""  # the file the state came from

    def public(self, with_messages: bool = True) -> dict[str, Any]:
        """The JSON a client sees (token ids stay on the server)."""
        out: dict[str, Any] = {
            "id": self.id, "object": "session", "model": self.model,
            "created_at": self.created_at, "updated_at": self.updated_at,
            "system": self.system, "metadata": self.metadata,
            "message_count": len(self.messages), "saved_tokens": len(self.state_tokens),
        }
        if with_messages:
            out["messages"] = self.messages
        return out


class SessionStore:
    """Sessions under `root`, one folder each (see the module docstring)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def lock(self, sid: str) -> threading.Lock:
        """The lock that serialises turns of one session."""
        with self._guard:
            return self._locks.setdefault(sid, threading.Lock())

    def forget(self, sid: str) -> None:
        """Drop a deleted session's lock."""
        with self._guard:
            self._locks.pop(sid, None)

    def _dir(self, sid: str) -> Path:
        if not isinstance(sid, str) or not _ID.fullmatch(sid):
            raise SessionNotFoundError(f"no session {str(sid)[:60]!r}")
        return self.root / sid

    def create(self, model: str, system: str = "",
               metadata: dict[str, str] | None = None) -> Session:
        now = int(time.time())
        s = Session(f"sess_{uuid.uuid4().hex[:24]}", model, now, now, system, metadata or {})
        self.save(s)
        return s

    def get(self, sid: str) -> Session:
        folder = self._dir(sid)
        try:
            data = json.loads((folder / "session.json").read_text(encoding="utf-8"))
            return Session(**data)
        except (OSError, ValueError, TypeError):
            raise SessionNotFoundError(f"no session {sid!r}") from None

    def list(self) -> list[Session]:
        if not self.root.is_dir():
            return []
        found = []
        for folder in self.root.iterdir():
            if _ID.fullmatch(folder.name):
                try:
                    found.append(self.get(folder.name))
                except SessionNotFoundError:
                    continue
        return sorted(found, key=lambda s: s.created_at)

    def save(self, s: Session, state: bytes | None = None) -> None:
        """Write the session; with `state`, its KV bytes first (see module docstring)."""
        folder = self._dir(s.id)
        folder.mkdir(parents=True, exist_ok=True)
        if state is not None:
            fd, tmp = tempfile.mkstemp(prefix=".state.", dir=folder)
            try:
                with os.fdopen(fd, "wb") as fh:
                    fh.write(state)
                os.replace(tmp, folder / "state.bin")
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        s.updated_at = int(time.time())
        write_json_atomic(folder / "session.json", asdict(s))

    def state(self, s: Session) -> bytes | None:
        """The saved KV bytes, or None when there are none."""
        if not s.state_tokens:
            return None
        try:
            return (self._dir(s.id) / "state.bin").read_bytes()
        except OSError:
            return None

    def drop_state(self, s: Session) -> None:
        """Remove the session's own KV bytes (the tiered cache holds its state)."""
        (self._dir(s.id) / "state.bin").unlink(missing_ok=True)

    def delete(self, sid: str) -> None:
        folder = self._dir(sid)
        if not (folder / "session.json").is_file():
            raise SessionNotFoundError(f"no session {sid!r}")
        shutil.rmtree(folder, ignore_errors=True)
