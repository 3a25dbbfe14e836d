"""Untrusted image bytes → `MediaItem`s of RGB888 pixels, with Pillow.

Order of checks (each before the work it bounds): byte size; format sniffed from the
magic bytes (PNG, JPEG, GIF, WebP, BMP) and Pillow restricted to that one decoder (an
image never reaches Pillow's other plugins, some of which call external programs);
the width × height the header declares (Image.open reads only the header); for an
animation, frames × pixels; then the decode. Decoding is then bounded by what was
declared. Every failure is a one-line MediaError.

Conversion: EXIF orientation applied; palette, grey, CMYK, YCbCr converted to RGB;
16-bit grey scaled to 8 bits (not clipped); transparency composited on white (what a
viewer shows on a page). Larger than `max_side`: downscaled, aspect kept.

Video: an animated GIF or WebP sent as a video becomes up to `max_frames` frames sampled
evenly over the animation (first and last included), each an image item; sent as an
image, an animation is its first frame (as OpenAI reads animated GIFs).
"""

from __future__ import annotations

import hashlib
import io
import re

from PIL import Image, ImageFile, ImageOps

from inferenceos.errors import MediaError
from inferenceos.media.item import MediaItem
from inferenceos.media.limits import DEFAULT_LIMITS, MediaLimits, size_text
from inferenceos.media.sniff import ImageFormat, sniff_image

# Pillow's own guard (Image.MAX_IMAGE_PIXELS, ~89 M) warns past its limit at open and
# raises past twice that. Ours is checked from the header and is lower by default; a
# limit raised above Pillow's still meets Pillow's error, turned into the same refusal.


_REPR = re.compile(r"\s*<[^<>]* at 0x[0-9a-fA-F]+>")


def check_size(data: bytes, limits: MediaLimits, what: str = "image") -> None:
    if len(data) > limits.max_bytes:
        raise MediaError(f"the {what} is {size_text(len(data))}; the limit is "
                         f"{size_text(limits.max_bytes)}")
    if not data:
        raise MediaError(f"the {what} is empty")


def decode_image(data: bytes, limits: MediaLimits = DEFAULT_LIMITS) -> MediaItem:
    """One image item: the picture (the first frame of an animation) as RGB888."""
    check_size(data, limits)
    fmt = sniff_image(data)
    with _opened(data, fmt, limits) as im:
        _check_pixels(im, limits)
        # the pixels are copied out before the file closes (an RGB file converts to itself)
        return _item(_to_rgb(_loaded(im, fmt, limits), limits),
                     hashlib.sha256(data).hexdigest())


def decode_video(data: bytes, limits: MediaLimits = DEFAULT_LIMITS) -> list[MediaItem]:
    """A video given as an animated GIF or WebP: up to `max_frames` frames sampled
    evenly (a still image gives one). Real video containers are refused by the sniff."""
    check_size(data, limits, "video")
    fmt = sniff_image(data)
    if fmt not in ("GIF", "WEBP"):
        raise MediaError(f"a video must be an animated GIF or WebP, not {fmt}")
    digest = hashlib.sha256(data).hexdigest()
    with _opened(data, fmt, limits) as im:
        _check_pixels(im, limits)
        n = _frame_count(im, limits.max_animation_frames)
        w, h = im.size
        if n * w * h > limits.max_animation_pixels:
            raise MediaError(f"the animation declares {n} frames of {w}x{h} pixels; the "
                             f"limit is {limits.max_animation_pixels // 1_000_000} M "
                             "pixels in all")
        items = []
        for i in _sampled(n, limits.max_frames):
            try:
                im.seek(i)
            except EOFError:
                break  # fewer frames than the header counted: keep what exists
            except Exception as exc:  # any decoder failure is bad input
                raise _bad(fmt, exc) from None
            rgb = _to_rgb(_loaded(im, fmt, limits), limits)
            items.append(_item(rgb, f"{digest}#{i}"))
    if not items:
        raise MediaError(f"the {fmt} animation has no decodable frame")
    return items


def _sampled(n: int, k: int) -> list[int]:
    """k frame indices spread evenly over 0..n-1, first and last included."""
    if n <= k:
        return list(range(n))
    if k == 1:
        return [0]
    return sorted({round(j * (n - 1) / (k - 1)) for j in range(k)})


def _frame_count(im: Image.Image, cap: int) -> int:
    """The animation's frame count; MediaError past `cap`. A GIF is counted here
    without decoding pixels, stopping at the cap (Pillow's `n_frames` would walk the
    whole file however many frames it holds)."""
    try:
        if im.format == "GIF" and hasattr(im, "_seek"):
            try:
                while im.tell() < cap:
                    im._seek(im.tell() + 1, False)
            except EOFError:
                pass
            n = im.tell() + 1
            im.seek(0)
        else:
            n = max(1, int(getattr(im, "n_frames", 1)))
    except Exception as exc:  # a broken block while counting
        raise _bad(im.format or "image", exc) from None
    if n > cap:
        raise MediaError(f"the animation has more than {cap} frames")
    return n


class _opened:
    """Image.open restricted to the sniffed format, its errors made MediaErrors."""

    def __init__(self, data: bytes, fmt: ImageFormat, limits: MediaLimits) -> None:
        self.data, self.fmt, self.limits = data, fmt, limits
        self.im: Image.Image | None = None

    def __enter__(self) -> Image.Image:
        try:
            self.im = Image.open(io.BytesIO(self.data), formats=[self.fmt])
        except Image.DecompressionBombError:
            raise MediaError(f"the {self.fmt} image declares more than "
                             f"{self.limits.max_pixels // 1_000_000} M pixels") from None
        except Exception as exc:
            raise _bad(self.fmt, exc) from None
        return self.im

    def __exit__(self, *exc: object) -> None:
        if self.im is not None:
            self.im.close()


def _check_pixels(im: Image.Image, limits: MediaLimits) -> None:
    w, h = im.size
    if w < 1 or h < 1:
        raise MediaError(f"the image declares a size of {w}x{h} pixels")
    if w * h > limits.max_pixels:
        raise MediaError(f"the image declares {w}x{h} pixels ({w * h / 1e6:.0f} M); the "
                         f"limit is {limits.max_pixels / 1e6:g} M")


def _loaded(im: Image.Image, fmt: str, limits: MediaLimits) -> Image.Image:
    """The current frame decoded, orientation applied. A truncated file is refused
    (Pillow's LOAD_TRUNCATED_IMAGES stays off: no half-grey pictures)."""
    if fmt == "JPEG" and limits.max_side:
        # DCT scaling: decode a huge JPEG at a fraction of its size (>= max_side)
        im.draft("RGB", (limits.max_side, limits.max_side))
    try:
        if ImageFile.LOAD_TRUNCATED_IMAGES:  # pragma: no cover - someone set it globally
            raise MediaError("refusing to decode: PIL.ImageFile.LOAD_TRUNCATED_IMAGES is on")
        im.load()
        out = ImageOps.exif_transpose(im) if fmt in ("JPEG", "PNG", "WEBP") else im
        return out if out is not None else im
    except MediaError:
        raise
    except Image.DecompressionBombError:
        raise MediaError("the image declares too many pixels") from None
    except MemoryError:
        raise MediaError("the image is too large to decode") from None
    except Exception as exc:  # Pillow raises many types on bad input
        raise _bad(fmt, exc) from None


def _to_rgb(im: Image.Image, limits: MediaLimits) -> Image.Image:
    """RGB888: transparency over white, 16-bit grey scaled, everything else converted;
    then downscaled to `max_side` when larger."""
    mode = im.mode
    if mode.startswith("I"):
        # 16-bit grey (PNG): Pillow's convert would clip at 255 (a white picture)
        im = (im if mode == "I" else im.convert("I")).point(lambda v: v / 257).convert("L")
    elif mode == "F":
        im = im.convert("L")
    if im.mode == "P":
        im = im.convert("RGBA" if "transparency" in im.info else "RGB")
    if im.mode in ("LA", "La", "PA", "RGBa") or (im.mode != "RGBA" and "transparency" in
                                                  im.info and im.mode in ("L", "RGB")):
        im = im.convert("RGBA")
    if im.mode == "RGBA":
        white = Image.new("RGBA", im.size, (255, 255, 255, 255))
        im = Image.alpha_composite(white, im)
    if im.mode != "RGB":
        im = im.convert("RGB")
    if limits.max_side and max(im.size) > limits.max_side:
        im = im.copy()
        im.thumbnail((limits.max_side, limits.max_side), Image.Resampling.LANCZOS,
                     reducing_gap=2.0)
    return im


def _item(rgb: Image.Image, digest: str) -> MediaItem:
    nx, ny = rgb.size
    return MediaItem("image", rgb.tobytes(), nx, ny, digest)


def _bad(fmt: str, exc: BaseException) -> MediaError:
    """A decoder failure as one line: truncated, corrupt, or what Pillow said (without
    the object reprs Pillow puts in some messages)."""
    text = " ".join(_REPR.sub("", str(exc)).split())[:160]
    if "cannot identify image file" in text:
        return MediaError(f"the {fmt} image is truncated or corrupt (its header cannot be "
                          "read)")
    if isinstance(exc, (EOFError,)) or "truncated" in text.lower() or "end of" in text:
        return MediaError(f"the {fmt} image is truncated ({text or 'unexpected end'})")
    return MediaError(f"the {fmt} image is corrupt or unreadable ({text or type(exc).__name__})")

