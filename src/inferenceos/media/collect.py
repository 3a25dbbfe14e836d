"""The media of one request, gathered in prompt order: what the API routes call.

Each call checks and decodes one part (see `image`, `audio`, `source`) and returns the
marker text that stands for it in the message, so a route writes the marker where the
part was and the items stay in the same order as their markers. The per-request item
limit is checked before anything is decoded.
"""

from __future__ import annotations

from inferenceos.errors import MediaError
from inferenceos.media.audio import check_audio
from inferenceos.media.image import decode_image, decode_video
from inferenceos.media.item import MEDIA_MARKER, MediaItem
from inferenceos.media.limits import DEFAULT_LIMITS, MediaLimits
from inferenceos.media.sniff import audio_format
from inferenceos.media.source import Fetcher, decode_base64, media_bytes


class MediaSet:
    """The checked, decoded media of one request, in order."""

    def __init__(self, limits: MediaLimits = DEFAULT_LIMITS,
                 fetch: Fetcher | None = None) -> None:
        self.limits = limits
        self.fetch = fetch  # None: URLs are refused (the default)
        self.items: list[MediaItem] = []

    def _room(self, n: int = 1) -> None:
        if len(self.items) + n > self.limits.max_items:
            raise MediaError(f"at most {self.limits.max_items} images, video frames and "
                             "audio clips per request")

    def image(self, ref: str, *, bare_base64: bool = True) -> str:
        """An image from a data: URL, an allowed http(s) URL, or (with `bare_base64`)
        plain base64; its marker."""
        self._room()
        got = media_bytes(ref, self.limits, self.fetch, bare_base64=bare_base64)
        if got.declared.startswith("audio/"):
            raise MediaError(f"an image part carries {got.declared[:40]!r} data")
        self.items.append(decode_image(got.data, self.limits))
        return MEDIA_MARKER

    def video(self, ref: str) -> str:
        """A video (an animated GIF or WebP) as sampled frames; one marker per frame."""
        self._room()
        got = media_bytes(ref, self.limits, self.fetch, bare_base64=False)
        frames = decode_video(got.data, self.limits)
        self._room(len(frames))
        self.items.extend(frames)
        return MEDIA_MARKER * len(frames)

    def audio(self, data: str, fmt: str | None = None) -> str:
        """An audio clip from base64 (or a data: URL) with its declared format."""
        self._room()
        raw = (media_bytes(data, self.limits, None, bare_base64=False).data
               if data.lstrip()[:5].lower() == "data:" else decode_base64(data, self.limits))
        self.items.append(check_audio(raw, fmt, self.limits))
        return MEDIA_MARKER


    def sniffed(self, data: str) -> str:
        """An image or an audio clip, whichever the bytes are (llama-server's
        `multimodal_data`: base64 of either, undeclared); its marker."""
        self._room()
        raw = media_bytes(data, self.limits, None).data  # base64 or a data: URL
        self.items.append(check_audio(raw, None, self.limits) if audio_format(raw[:32])
                          else decode_image(raw, self.limits))
        return MEDIA_MARKER


def check_text(text: str) -> str:
    """Client text of a request that carries media, refused when it holds the marker
    itself (it would pair a wrong item with a wrong place)."""
    if MEDIA_MARKER in text:
        raise MediaError(f"message text must not contain {MEDIA_MARKER!r} (it marks where "
                         "images and audio go)")
    return text
