"""Media from the user's own files (`run --image`, chat's `/image`): read with the same
limits and decoders as the API's untrusted bytes, since a file can be anything."""

from __future__ import annotations

from pathlib import Path

from inferenceos.errors import MediaError
from inferenceos.media.audio import check_audio
from inferenceos.media.image import decode_image
from inferenceos.media.item import MEDIA_MARKER, MediaItem, MediaKind
from inferenceos.media.limits import DEFAULT_LIMITS, MediaLimits


def read_media_file(path: str | Path, kind: MediaKind,
                    limits: MediaLimits = DEFAULT_LIMITS) -> MediaItem:
    """The checked item for an image or audio file; MediaError names what is wrong."""
    return decode_media(read_media_bytes(path, kind, limits), kind, limits)


def decode_media(data: bytes, kind: MediaKind,
                 limits: MediaLimits = DEFAULT_LIMITS) -> MediaItem:
    """The checked item for a file's bytes (`read_media_bytes`)."""
    return decode_image(data, limits) if kind == "image" else check_audio(data, None, limits)


def read_media_bytes(path: str | Path, kind: MediaKind,
                     limits: MediaLimits = DEFAULT_LIMITS) -> bytes:
    """A media file's bytes, its size checked before reading; MediaError otherwise."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise MediaError(f"no such {kind} file: {p}")
    size = p.stat().st_size
    if size > limits.max_bytes:
        raise MediaError(f"{p.name} is {size / 2**20:.1f} MiB; the limit is "
                         f"{limits.max_bytes / 2**20:.0f} MiB")
    try:
        return p.read_bytes()
    except OSError as exc:
        raise MediaError(f"cannot read {p}: {exc.strerror or exc}") from None


def with_markers(text: str, n_items: int) -> str:
    """`text` with one media marker per item: as written when it already holds exactly
    that many, else the markers first, each on its own line (as Ollama places images)."""
    if n_items == 0 or text.count(MEDIA_MARKER) == n_items:
        return text
    if MEDIA_MARKER in text:
        raise MediaError(f"the prompt has {text.count(MEDIA_MARKER)} media markers for "
                         f"{n_items} media files")
    return f"{MEDIA_MARKER}\n" * n_items + text
