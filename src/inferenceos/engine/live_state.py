"""What a live migration carries between two workers: `SeqState` (one running
sequence, detached from its context) and `LiveState` (everything one scheduler served).

Plain picklable records. `engine.migrate` makes them from a scheduler and resumes them
on another (the module doc there says what each field holds and how it comes back);
`engine.messages` carries them over the worker pipe (ExportLive's answer, ImportLive's
payload). They live here, below both, so the pipe protocol names them without
importing the mechanism (which imports the scheduler, which imports the messages).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from inferenceos.engine.generation import GenerationMetrics
from inferenceos.engine.request import Request


@dataclass
class SeqState:
    """One running sequence, detached from its context (see engine.migrate)."""

    req: Request
    cached: list[int]
    n_prefilled: int
    pending: int | None
    kv: bytes | None
    metrics: GenerationMetrics
    utf8: tuple[bytes, int]
    stop_held: str
    stop_stopped: bool
    t_start: float
    t_first: float
    steps: int
    accepted: list[int]  # tokens the sampler chain accepted, in order


@dataclass
class LiveState:
    """Everything one scheduler served: running sequences, queue, idle prefixes."""

    running: list[SeqState] = field(default_factory=list)
    queued: list[Request] = field(default_factory=list)
    prefixes: list[tuple[list[int], bytes]] = field(default_factory=list)

    @property
    def ids(self) -> list[int]:
        """Request ids whose streams continue on the importing side."""
        return [s.req.id for s in self.running] + [r.id for r in self.queued]

    @property
    def kv_bytes(self) -> int:
        """Bytes of KV state the migration copies (sequences' and idle prefixes')."""
        return sum(len(s.kv or b"") for s in self.running) + sum(
            len(b) for _, b in self.prefixes)
