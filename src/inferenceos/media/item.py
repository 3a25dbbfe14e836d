"""What one image or audio clip looks like once it has been checked and decoded.

The contract between the API layer (which turns untrusted bytes into `MediaItem`s) and
the engine (which hands them to llama.cpp's mtmd): a prompt given as text carries one
`MEDIA_MARKER` per item, in order; the engine replaces each marker with the item's
encoder tokens.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Literal

MEDIA_MARKER = "<__media__>"  # mtmd's default marker (mtmd_default_marker())

MediaKind = Literal["image", "audio"]


@dataclass(frozen=True)
class MediaItem:
    """One decoded media input.

    image: `data` is nx * ny * 3 bytes of RGB888, rows top to bottom (already decoded
    and size-checked: the engine never parses image files);
    audio: `data` is the audio file as received (WAV, MP3 or FLAC, already checked for
    type and size; mtmd decodes and resamples it).
    `digest` identifies the content (sha256 of the original bytes): the prefix cache
    reuses a media chunk only when its digest matches.
    """

    kind: MediaKind
    data: bytes = field(repr=False)
    nx: int = 0
    ny: int = 0
    digest: str = ""

    def __post_init__(self) -> None:
        if self.kind == "image" and len(self.data) != self.nx * self.ny * 3:
            raise ValueError(f"an RGB image of {self.nx}x{self.ny} needs "
                             f"{self.nx * self.ny * 3} bytes, got {len(self.data)}")
        if not self.digest:
            object.__setattr__(self, "digest", hashlib.sha256(self.data).hexdigest())


def count_markers(text: str) -> int:
    """How many media markers `text` holds."""
    return text.count(MEDIA_MARKER)
