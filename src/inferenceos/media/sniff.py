"""What a file is, from its first bytes (never from a name, a URL or a declared type).

Only the formats below are accepted; everything else is refused by name where we can
tell (SVG, TIFF, HEIC, video containers...) so that the user learns what to convert.
"""

from __future__ import annotations

from typing import Literal

from inferenceos.errors import MediaError

ImageFormat = Literal["PNG", "JPEG", "GIF", "WEBP", "BMP"]  # Pillow's format names
AudioFormat = Literal["wav", "mp3", "flac"]

# formats recognised only to name them in the refusal
_KNOWN_OTHERS: tuple[tuple[bytes, int, str], ...] = (
    (b"II*\x00", 0, "TIFF"), (b"MM\x00*", 0, "TIFF"), (b"ftypheic", 4, "HEIC"),
    (b"ftypheix", 4, "HEIC"), (b"ftypmif1", 4, "HEIF"), (b"ftypavif", 4, "AVIF"),
    (b"ftyp", 4, "MP4/MOV video"), (b"\x1a\x45\xdf\xa3", 0, "Matroska/WebM video"),
    (b"OggS", 0, "Ogg"), (b"%PDF", 0, "PDF"), (b"\x00\x00\x01\x00", 0, "ICO"),
    (b"8BPS", 0, "Photoshop"), (b"\xff\x0a", 0, "JPEG XL"),
    (b"\x00\x00\x00\x0cJXL ", 0, "JPEG XL"), (b"RIFF", 0, "RIFF (not WAVE or WebP)"),
    (b"PK\x03\x04", 0, "ZIP"), (b"\x1f\x8b", 0, "gzip"),
)


def image_format(head: bytes) -> ImageFormat | None:
    """The image format `head` (the file's first bytes) starts with, or None."""
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "PNG"
    if head.startswith(b"\xff\xd8\xff"):
        return "JPEG"
    if head.startswith((b"GIF87a", b"GIF89a")):
        return "GIF"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "WEBP"
    if head.startswith(b"BM") and len(head) >= 26:
        return "BMP"
    return None


def audio_format(head: bytes) -> AudioFormat | None:
    """The audio format `head` starts with, or None. MP3: an ID3 tag or a frame sync
    of MPEG audio layer III."""
    if head[:4] == b"RIFF" and head[8:12] == b"WAVE":
        return "wav"
    if head.startswith(b"fLaC"):
        return "flac"
    if head.startswith(b"ID3"):
        return "mp3"
    if len(head) >= 2 and head[0] == 0xFF and (head[1] & 0xE0) == 0xE0 \
            and (head[1] >> 1) & 0x3 == 0x1:  # sync, layer III
        return "mp3"
    return None


def describe(head: bytes) -> str:
    """A name for what `head` is, for a refusal ('SVG', 'text', 'TIFF', 'unknown')."""
    for magic, offset, name in _KNOWN_OTHERS:
        if head[offset:offset + len(magic)] == magic:
            return name
    text = head[:256].lstrip()
    if text[:5].lower() in (b"<?xml", b"<svg ", b"<svg>") or b"<svg" in text[:256].lower():
        return "SVG"
    if text[:1] == b"<":
        return "HTML/XML"
    if head and all(32 <= b < 127 or b in (9, 10, 13) for b in head[:64]):
        return "text"
    return "an unknown format"


def sniff_image(data: bytes) -> ImageFormat:
    """The image format of `data`; MediaError naming what it is otherwise."""
    fmt = image_format(data[:32])
    if fmt is None:
        raise MediaError(f"not a supported image ({_what(data)}); send PNG, JPEG, GIF, "
                         "WebP or BMP")
    return fmt


def sniff_audio(data: bytes) -> AudioFormat:
    """The audio format of `data`; MediaError naming what it is otherwise."""
    fmt = audio_format(data[:32])
    if fmt is None:
        raise MediaError(f"not a supported audio file ({_what(data)}); send WAV, MP3 or FLAC")
    return fmt


def _what(data: bytes) -> str:
    if not data:
        return "empty"
    if image_format(data[:32]):
        return "an image"
    if audio_format(data[:32]):
        return "audio"
    return describe(data[:512])
