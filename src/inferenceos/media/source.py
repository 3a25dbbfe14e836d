"""Where a request's media bytes come from: base64 text, a `data:` URL, or (only when the
operator allows it) an http(s) URL. Never a file: `file://` URLs and anything that looks
like a local path are refused, whatever the settings.

Base64 is decoded strictly (standard alphabet, padding checked; ASCII whitespace such as
MIME line breaks is dropped first), after its length has been checked against the byte
limit, so an oversized payload is refused without being decoded.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable
from dataclasses import dataclass

from inferenceos.errors import MediaError
from inferenceos.media.limits import DEFAULT_LIMITS, MediaLimits, size_text

_WHITESPACE = re.compile(rb"[ \t\r\n\f\v]+")
# the media types a data: URL or a fetched response may declare (the bytes decide
# the format; these only keep obviously foreign content out)
_MEDIA_TYPES = ("image/", "audio/", "video/", "application/octet-stream")
_MAX_URL_CHARS = 4096


@dataclass(frozen=True)
class Fetched:
    """Bytes from a source, with the media type it declared ('' when none)."""

    data: bytes
    declared: str = ""


# url, limits → Fetched; the server passes media.fetch.fetch_url bound to its policy
Fetcher = Callable[[str, MediaLimits], Fetched]


def decode_base64(text: str, limits: MediaLimits = DEFAULT_LIMITS) -> bytes:
    """Strictly decoded base64 (MediaError for anything else or too much of it)."""
    raw = text.encode("ascii", "replace") if isinstance(text, str) else bytes(text)
    compact = _WHITESPACE.sub(b"", raw)
    if (len(compact) * 3) // 4 > limits.max_bytes + 2:
        raise MediaError(f"the base64 data holds about {size_text(len(compact) * 3 // 4)}; "
                         f"the limit is {size_text(limits.max_bytes)}")
    if not compact:
        raise MediaError("the base64 data is empty")
    try:
        return base64.b64decode(compact, validate=True)
    except (binascii.Error, ValueError):
        raise MediaError("the media is not valid base64 (standard alphabet, padded)"
                         ) from None


def parse_data_url(url: str, limits: MediaLimits = DEFAULT_LIMITS) -> Fetched:
    """`data:[<type>][;param]...;base64,<data>` → its bytes and declared type."""
    head, comma, payload = url.partition(",")
    if not comma:
        raise MediaError("a data: URL needs a comma before its data")
    if len(head) > 256:
        raise MediaError("the data: URL's header is too long")
    params = [p.strip() for p in head[5:].split(";")]
    mime = params[0].lower() if params and "=" not in params[0] else ""
    if "base64" not in (p.lower() for p in params[1:]):
        raise MediaError("a data: URL must carry base64 data (';base64,')")
    if mime and not mime.startswith(_MEDIA_TYPES):
        raise MediaError(f"a data: URL of type {mime[:60]!r} is not an image or audio")
    return Fetched(decode_base64(payload, limits), mime)


def media_bytes(ref: str, limits: MediaLimits = DEFAULT_LIMITS,
                fetch: Fetcher | None = None, *, bare_base64: bool = True) -> Fetched:
    """The bytes a reference names: a data: URL, an http(s) URL when `fetch` is given
    (the operator allowed fetching), or bare base64 when `bare_base64`. Anything else
    (file://, local paths, other schemes, URLs while fetching is off) is refused."""
    if not isinstance(ref, str):
        raise MediaError("media must be given as a string (a data: URL or base64)")
    s = ref.strip()
    scheme = _scheme(s)
    if scheme == "data":
        return parse_data_url(s, limits)
    if scheme in ("http", "https"):
        if len(s) > _MAX_URL_CHARS:
            raise MediaError(f"the media URL is longer than {_MAX_URL_CHARS} characters")
        if fetch is None:
            raise MediaError("this server does not fetch media from URLs (the operator "
                             "can allow it with `serve --allow-media-urls`); send a "
                             "data: URL or base64")
        return fetch(s, limits)
    if scheme == "file" or _looks_like_path(s):
        raise MediaError("media cannot be read from files on the server; send a data: URL "
                         "or base64")
    if scheme:
        raise MediaError(f"media URLs of scheme {scheme[:20]!r} are not supported; send a "
                         "data: URL or base64")
    if not bare_base64:
        raise MediaError("the media must be a data: URL" + (
            " or an http(s) URL" if fetch else ""))
    return Fetched(decode_base64(s, limits))


def _scheme(s: str) -> str:
    m = re.match(r"([A-Za-z][A-Za-z0-9+.\-]{0,31}):", s)
    if m is None:
        return ""
    scheme = m[1].lower()
    # 'C:\\...' and 'c:/...' are Windows paths, not one-letter schemes
    return "" if len(scheme) == 1 else scheme


def _looks_like_path(s: str) -> bool:
    return (s.startswith(("/", "./", "../", "~", "\\\\")) or re.match(r"[A-Za-z]:[\\/]", s)
            is not None) and len(s) < 4096 and not _is_base64ish(s)


def _is_base64ish(s: str) -> bool:
    # a long base64 text may start with "/" (JPEG's is "/9j/"): not a path
    return len(s) >= 64 and re.fullmatch(r"[A-Za-z0-9+/=\s]+", s[:4096]) is not None
