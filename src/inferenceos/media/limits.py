"""Every limit on untrusted media, in one record with safe defaults.

Each limit is checked before the work it bounds: bytes before decoding base64 or reading
further from a socket, declared pixels (from the file's header) before decoding pixels,
declared frames × pixels before seeking through an animation, an audio file's duration
(from its header) before it reaches the engine.
"""

from __future__ import annotations

from dataclasses import dataclass

MiB = 1024 * 1024


@dataclass(frozen=True)
class MediaLimits:
    """Limits on one request's media. Defaults and why:

    - `max_bytes` 20 MiB per file (encoded; OpenAI's own image limit). An inline file
      also has to fit the server's body limit (`serve --max-body-mb`, 8 MiB by default,
      and base64 adds a third).
    - `max_pixels` 50 MP declared per image or frame (an 8K photo is 33 MP): what a
      decompression bomb declares is refused before any pixel is decoded.
    - `max_side` 2048: a decoded image longer than this is downscaled (aspect kept) before
      it goes to the engine. Projectors llama.cpp loads work at 224 to ~1500 px and
      resize anyway; the RGB copy crossing to the worker stays at most 12 MiB. 0: never.
    - `max_frames` 8: frames sampled evenly from an animated GIF / WebP sent as a video.
    - `max_animation_pixels` 500 M: frames × width × height an animation may declare
      (seeking through a GIF decodes every frame before the one asked for), and
      `max_animation_frames` 2000 frames (counting a GIF's frames walks the file: 20 k
      one-pixel frames took 0.7 s here).
    - `max_audio_s` 30 s per clip (the window of Whisper-style audio encoders).
    - `max_items` 16 images, frames and clips per request.
    - `fetch_timeout_s` 10 s for a whole URL fetch (DNS, connect, redirects, body);
      `max_redirects` 3, each hop checked again.
    """

    max_bytes: int = 20 * MiB
    max_pixels: int = 50_000_000
    max_side: int = 2048
    max_frames: int = 8
    max_animation_pixels: int = 500_000_000
    max_animation_frames: int = 2000
    max_audio_s: float = 30.0
    max_items: int = 16
    fetch_timeout_s: float = 10.0
    max_redirects: int = 3

    def __post_init__(self) -> None:
        for name in ("max_bytes", "max_pixels", "max_frames", "max_animation_pixels",
                     "max_animation_frames", "max_items"):
            if getattr(self, name) < 1:
                raise ValueError(f"MediaLimits.{name} must be at least 1")
        if self.max_side < 0 or self.max_redirects < 0:
            raise ValueError("MediaLimits.max_side and max_redirects must not be negative")
        if self.max_audio_s <= 0 or self.fetch_timeout_s <= 0:
            raise ValueError("MediaLimits.max_audio_s and fetch_timeout_s must be positive")


DEFAULT_LIMITS = MediaLimits()


def size_text(n: int) -> str:
    """Bytes for a message: '20 MiB', '3.2 MiB', '512 KiB', '17 bytes'."""
    if n >= MiB:
        return f"{n / MiB:.1f}".removesuffix(".0") + " MiB"
    if n >= 1024:
        return f"{n / 1024:.0f} KiB"
    return f"{n} bytes"
