"""Media parts of API requests → message text with markers + `MediaItem`s.

Each API's image / audio parts become one `MEDIA_MARKER` at the part's place in its
message (Ollama's `images`: before the message text, one per image) and one item, in
the same order; the chat template then renders the text as usual and the engine puts
each item's encoder tokens where its marker is. The parts understood:

- OpenAI chat: `{"type": "image_url", "image_url": {"url": "data:..."}}` (http(s) URLs
  only when the operator allows fetching), `{"type": "input_audio", "input_audio":
  {"data": BASE64, "format": "wav" | "mp3" | "flac"}}`, and, as vLLM spells it,
  `{"type": "video_url", "video_url": {"url": ...}}` for an animated GIF / WebP sampled
  into frames;
- Responses API: `{"type": "input_image", "image_url": "data:..."}` and `input_audio`;
- Ollama: `images`, a list of base64 strings (data: URLs accepted too).

Decoding is CPU work on untrusted input: routes run it through `decode_in_thread`, in
a worker thread (never on the event loop) holding one of a few process-wide decode
slots, so that many requests with images at once cannot each hold a full-size decoded
picture (a 50 MP image is 150 MB of RGB before its downscale): a request that waits
longer than `DECODE_WAIT_S` for a slot is a 429. Every refusal is a MediaError (400).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Collection
from typing import Any, TypeVar

from inferenceos.errors import EngineBusyError, MediaError
from inferenceos.media.collect import MediaSet, check_text
from inferenceos.media.fetch import fetcher
from inferenceos.server.errors import APIError
from inferenceos.server.generation import call_in_thread
from inferenceos.server.settings import ServerSettings

T = TypeVar("T")

# content part types that carry media, per API
OPENAI_MEDIA_PARTS = frozenset({"image_url", "input_audio", "video_url"})
RESPONSES_MEDIA_PARTS = frozenset({"input_image", "input_audio"})
TEXT_PARTS = frozenset({"text", "input_text", "output_text"})


DECODE_SLOTS = max(1, min(4, (os.cpu_count() or 2) // 2))
DECODE_WAIT_S = 30.0
_slots = threading.BoundedSemaphore(DECODE_SLOTS)


def _in_slot(fn: Callable[[], T]) -> T:
    if not _slots.acquire(timeout=DECODE_WAIT_S):
        raise EngineBusyError("too many requests are decoding images or audio now; "
                              "retry later")
    try:
        return fn()
    finally:
        _slots.release()


async def decode_in_thread(fn: Callable[[], T]) -> T:
    """`fn` (which decodes a request's media) in a worker thread, within a decode slot."""
    return await call_in_thread(lambda: _in_slot(fn), name="media-decode")


def media_set(settings: ServerSettings) -> MediaSet:
    """An empty MediaSet under the server's limits and fetch rule."""
    return MediaSet(settings.media_limits, fetcher() if settings.media_fetch else None)


def _field(part: Any, name: str) -> Any:
    value = getattr(part, name, None)
    if value is None:
        extra = getattr(part, "model_extra", None) or {}
        value = extra.get(name)
    return value


def _url(value: Any, what: str) -> str:
    """`{"url": ...}` (OpenAI) or a bare string (Responses API, some clients)."""
    url = value.get("url") if isinstance(value, dict) else getattr(value, "url", value)
    if not isinstance(url, str) or not url.strip():
        raise MediaError(f"a {what} part needs a URL (a data: URL, or http(s) when the "
                         "server fetches)")
    return url


def _audio(part: Any, media: MediaSet) -> str:
    audio = _field(part, "input_audio")
    data = audio.get("data") if isinstance(audio, dict) else getattr(audio, "data", None)
    fmt = audio.get("format") if isinstance(audio, dict) else getattr(audio, "format", None)
    if not isinstance(data, str) or not data:
        raise MediaError('an input_audio part needs "input_audio": {"data": BASE64, '
                         '"format": "wav" | "mp3"}')
    if fmt is not None and not isinstance(fmt, str):
        raise MediaError("input_audio.format must be a string (wav, mp3, flac)")
    return media.audio(data, fmt)


def openai_part(part: Any, media: MediaSet) -> str:
    """The text one chat-completions content part contributes (a marker for media)."""
    kind = part.type
    if kind in TEXT_PARTS:
        return check_text(part.text or "")
    if kind == "image_url":
        return media.image(_url(_field(part, "image_url"), "image_url"), bare_base64=False)
    if kind == "video_url":
        return media.video(_url(_field(part, "video_url"), "video_url"))
    if kind == "input_audio":
        return _audio(part, media)
    raise MediaError(f"content parts of type {str(kind)[:40]!r} are not supported (text, "
                     "image_url, input_audio, video_url)")


def responses_part(part: Any, media: MediaSet) -> str:
    """The text one Responses API input part contributes (a marker for media)."""
    kind = part.type
    if kind in TEXT_PARTS:
        return check_text(part.text or "")
    if kind == "input_image":
        if _field(part, "file_id"):
            raise MediaError("input_image by file_id is not supported (no file store); "
                             "send image_url as a data: URL")
        return media.image(_url(_field(part, "image_url"), "input_image"), bare_base64=False)
    if kind == "input_audio":
        return _audio(part, media)
    raise MediaError(f"input parts of type {str(kind)[:40]!r} are not supported "
                     "(input_text, input_image, input_audio)")


def content_text(content: str | list[Any] | None, media: MediaSet | None,
                 media_part: Callable[[Any, MediaSet], str], text_types: Collection[str],
                 noun: str) -> str:
    """A message's text for the chat template: a string as it is, parts joined. With
    `media` (a request that carries some), every part goes through `media_part` (media
    become markers at their place, their items join `media`; text is checked); without,
    only parts whose type is in `text_types` are taken, any other is a 400 "<noun>
    parts of type ... are not supported"."""
    if content is None or isinstance(content, str):
        text = content or ""
        return check_text(text) if media is not None else text
    parts = []
    for p in content:
        if media is not None:
            parts.append(media_part(p, media))
            continue
        if p.type not in text_types:
            raise APIError(400, f"{noun} parts of type {p.type!r} are not supported",
                           "unsupported_content")
        parts.append(p.text or "")
    return "".join(parts)


def ollama_images(images: list[str] | None, media: MediaSet) -> str:
    """The markers for an Ollama message's `images` (base64), placed before its text."""
    markers = []
    for image in images or ():
        markers.append(media.image(image))
    return "".join(markers)
