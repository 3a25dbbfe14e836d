"""Untrusted media input (media/): images, videos as sampled frames, audio, base64 and
data: URL sources. Real files made with Pillow and the wave module; no mocks."""

from __future__ import annotations

import base64
import io
import struct

import pytest
from PIL import Image

from inferenceos.errors import MediaError
from inferenceos.media.audio import check_audio
from inferenceos.media.collect import MediaSet, check_text
from inferenceos.media.image import decode_image, decode_video
from inferenceos.media.item import MEDIA_MARKER
from inferenceos.media.limits import MediaLimits
from inferenceos.media.source import decode_base64, media_bytes
from media_samples import png_declaring, wav_bytes


def encode(im: Image.Image, fmt: str, **kw: object) -> bytes:
    buf = io.BytesIO()
    im.save(buf, fmt, **kw)
    return buf.getvalue()


def gradient(w: int = 40, h: int = 30, mode: str = "RGB") -> Image.Image:
    im = Image.new("RGB", (w, h))
    im.putdata([(x * 255 // max(1, w - 1), y * 255 // max(1, h - 1), 128)
                for y in range(h) for x in range(w)])
    return im.convert(mode)


def pixel(item: object, x: int, y: int) -> tuple[int, int, int]:
    i = (y * item.nx + x) * 3  # type: ignore[attr-defined]
    d = item.data  # type: ignore[attr-defined]
    return d[i], d[i + 1], d[i + 2]


def data_url(raw: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(raw).decode()


# -- images ----------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "GIF", "WEBP", "BMP"])
def test_each_accepted_format_decodes_to_rgb_of_its_size(fmt: str) -> None:
    item = decode_image(encode(gradient(), fmt))
    assert (item.kind, item.nx, item.ny) == ("image", 40, 30)
    assert len(item.data) == 40 * 30 * 3
    r, g, _ = pixel(item, 39, 29)
    assert r > 200 and g > 200  # the gradient's far corner, not a blank picture


def test_png_pixels_are_exact_and_digest_is_of_the_file() -> None:
    raw = encode(gradient(), "PNG")
    item = decode_image(raw)
    assert pixel(item, 0, 0) == (0, 0, 128) and pixel(item, 39, 0) == (255, 0, 128)
    import hashlib
    assert item.digest == hashlib.sha256(raw).hexdigest()
    assert decode_image(raw).digest == item.digest  # same file, same digest (prefix reuse)


def test_transparency_is_composited_on_white() -> None:
    im = Image.new("RGBA", (4, 4), (255, 0, 0, 0))  # fully transparent red
    im.putpixel((1, 1), (0, 0, 255, 255))  # one opaque blue pixel
    item = decode_image(encode(im, "PNG"))
    assert pixel(item, 0, 0) == (255, 255, 255)
    assert pixel(item, 1, 1) == (0, 0, 255)
    pal = Image.new("P", (4, 4), 0)
    pal.putpalette([0, 0, 0, 10, 20, 30] + [0] * 762)
    pal.putpixel((2, 2), 1)
    item = decode_image(encode(pal, "GIF", transparency=0))
    assert pixel(item, 0, 0) == (255, 255, 255) and pixel(item, 2, 2) == (10, 20, 30)


def test_exif_orientation_is_applied() -> None:
    im = Image.new("RGB", (40, 20), (255, 0, 0))
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90° clockwise to display
    item = decode_image(encode(im, "JPEG", exif=exif))
    assert (item.nx, item.ny) == (20, 40)


def test_cmyk_and_grey_and_16_bit_grey_convert() -> None:
    item = decode_image(encode(Image.new("CMYK", (8, 8), (0, 255, 255, 0)), "JPEG"))
    r, g, b = pixel(item, 4, 4)
    assert r > 200 and g < 60 and b < 60  # red, not inverted
    assert pixel(decode_image(encode(Image.new("L", (8, 8), 77), "PNG")), 3, 3) == (77,) * 3
    sixteen = Image.new("I;16", (8, 8), 40000)
    assert pixel(decode_image(encode(sixteen, "PNG")), 3, 3) == (155,) * 3  # 40000 / 257


def test_large_image_is_downscaled_to_max_side() -> None:
    item = decode_image(encode(gradient(300, 100), "PNG"), MediaLimits(max_side=150))
    assert (item.nx, item.ny) == (150, 50)


def test_animated_gif_as_image_is_its_first_frame() -> None:
    frames = [Image.new("RGB", (16, 16), (i * 20, 0, 0)) for i in range(10)]
    raw = encode(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=50)
    assert pixel(decode_image(raw), 8, 8)[0] < 10


def test_animation_as_video_samples_frames_evenly() -> None:
    frames = [Image.new("RGB", (16, 16), (i * 12, 0, 255 - i * 12)) for i in range(20)]
    raw = encode(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=40)
    items = decode_video(raw, MediaLimits(max_frames=5))
    assert len(items) == 5
    reds = [pixel(it, 8, 8)[0] for it in items]
    assert reds == sorted(reds) and reds[0] < 6 and reds[-1] > 220  # first ... last
    assert len({it.digest for it in items}) == 5
    webp = encode(frames[0], "WEBP", save_all=True, append_images=frames[1:4], duration=40,
                  lossless=True)
    assert len(decode_video(webp)) == 4  # fewer frames than the limit: all of them


def test_video_must_be_an_animation_format() -> None:
    with pytest.raises(MediaError, match="animated GIF or WebP, not PNG"):
        decode_video(encode(gradient(), "PNG"))
    with pytest.raises(MediaError, match="MP4/MOV video"):
        decode_video(b"\x00\x00\x00\x18ftypmp42" + b"\x00" * 64)


def test_animation_frame_budget_is_checked_before_seeking() -> None:
    frames = [Image.new("RGB", (100, 100), (i, 0, 0)) for i in range(30)]
    raw = encode(frames[0], "GIF", save_all=True, append_images=frames[1:])
    with pytest.raises(MediaError, match="30 frames of 100x100"):
        decode_video(raw, MediaLimits(max_animation_pixels=200_000))


def test_animation_frame_count_is_capped_without_walking_the_whole_file() -> None:
    frames = [Image.new("L", (1, 1), 255 * (i % 2)) for i in range(3000)]
    raw = encode(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=10,
                 optimize=False)
    with pytest.raises(MediaError, match="more than 2000 frames"):
        decode_video(raw)
    items = decode_video(raw, MediaLimits(max_frames=4, max_animation_frames=3000))
    # frames 0, 1000, 1999, 2999 (odd frames are white)
    assert [pixel(it, 0, 0)[0] for it in items] == [0, 0, 255, 255]


def test_truncated_png_is_refused() -> None:
    raw = encode(gradient(64, 64), "PNG", compress_level=0)
    with pytest.raises(MediaError, match=r"PNG image is (truncated|corrupt)"):
        decode_image(raw[: len(raw) // 2])


def test_png_cut_inside_its_header_names_no_python_object() -> None:
    with pytest.raises(MediaError) as err:
        decode_image(encode(gradient(), "PNG")[:30])
    assert str(err.value) == "the PNG image is truncated or corrupt (its header cannot be read)"


def test_corrupt_jpeg_is_refused() -> None:
    raw = bytearray(encode(gradient(), "JPEG"))
    raw[200:260] = b"\xff" * 60  # a run of markers in the entropy-coded data
    with pytest.raises(MediaError):
        decode_image(bytes(raw[:300]))


def test_decompression_bomb_is_refused_from_its_header() -> None:
    bomb = png_declaring(100_000, 100_000)  # 10 G pixels in 100 bytes
    assert len(bomb) < 200
    with pytest.raises(MediaError, match="pixels"):
        decode_image(bomb)
    # below Pillow's own guard but above ours: still refused before decoding
    with pytest.raises(MediaError, match=r"8000x8000 pixels \(64 M\); the limit is 50 M"):
        decode_image(png_declaring(8000, 8000))


def test_non_images_are_refused_by_name() -> None:
    svg = b'<svg xmlns="http://www.w3.org/2000/svg"><script>alert(1)</script></svg>'
    for raw, what in ((svg, "SVG"), (b"hello, world", "text"), (b"%PDF-1.7 ...", "PDF"),
                      (b"II*\x00" + b"\x00" * 40, "TIFF"), (b"", "empty")):
        with pytest.raises(MediaError, match="is empty" if what == "empty" else what):
            decode_image(raw)


def test_oversized_file_is_refused_before_decoding() -> None:
    raw = encode(gradient(), "PNG")
    with pytest.raises(MediaError, match=r"the image is .* the limit is 100 bytes"):
        decode_image(raw, MediaLimits(max_bytes=100))


# -- audio -----------------------------------------------------------------------------

def test_wav_passes_and_keeps_its_bytes() -> None:
    raw = wav_bytes(0.5)
    item = check_audio(raw, "wav")
    assert item.kind == "audio" and item.data == raw


def test_wav_duration_limit_from_its_header() -> None:
    with pytest.raises(MediaError, match=r"lasts 2.0 s; the limit is 1 s"):
        check_audio(wav_bytes(2.0), "wav", MediaLimits(max_audio_s=1))


def test_bad_wav_headers_are_refused() -> None:
    raw = bytearray(wav_bytes(0.1))
    bad_rate = bytes(raw[:24]) + struct.pack("<I", 3) + bytes(raw[28:])
    with pytest.raises(MediaError, match="rate of 3 Hz"):
        check_audio(bad_rate)
    many = bytes(raw[:22]) + struct.pack("<H", 200) + bytes(raw[24:])
    with pytest.raises(MediaError, match="200 channels"):
        check_audio(many)
    with pytest.raises(MediaError, match=r"no audio data|no fmt"):
        check_audio(bytes(raw[:40]))
    with pytest.raises(MediaError, match="declared 'mp3' but the bytes are wav"):
        check_audio(bytes(raw), "mp3")


def test_other_audio_formats_are_refused() -> None:
    with pytest.raises(MediaError, match="not a supported audio file \\(Ogg\\)"):
        check_audio(b"OggS" + b"\x00" * 100)
    with pytest.raises(MediaError, match="an image"):
        check_audio(encode(gradient(), "PNG"))


def test_mp3_and_flac_durations_from_their_headers() -> None:
    # MPEG-1 layer III, 128 kbit/s, 44.1 kHz, stereo: 0xFFFB9000
    frame = b"\xff\xfb\x90\x00" + b"\x00" * 413
    assert check_audio(frame * 10, "mp3").kind == "audio"
    with pytest.raises(MediaError, match="lasts"):
        check_audio(frame * 5000, "mp3", MediaLimits(max_audio_s=1))  # ~13 s at 128k
    streaminfo = (b"\x10\x00\x10\x00" + b"\x00" * 6
                  + ((16000 << 44) | (0 << 41) | (15 << 36) | 16000 * 90).to_bytes(8, "big")
                  + b"\x00" * 16)
    flac = b"fLaC" + b"\x80\x00\x00\x22" + streaminfo + b"\x00" * 32
    with pytest.raises(MediaError, match=r"lasts 90.0 s"):
        check_audio(flac, "flac")


# -- sources ---------------------------------------------------------------------------

def test_base64_is_strict() -> None:
    assert decode_base64(base64.b64encode(b"abc\x00").decode()) == b"abc\x00"
    assert decode_base64("YWJj\nZGVm\n") == b"abcdef"  # MIME line breaks are fine
    for garbage in ("not base64!", "YWJ", "YW=j", "%%%%", "YWJj\x00", "ÿÿÿÿ", ""):
        with pytest.raises(MediaError, match="base64"):
            decode_base64(garbage)


def test_base64_over_the_limit_is_refused_before_decoding() -> None:
    with pytest.raises(MediaError, match="limit is 1 KiB"):
        decode_base64("A" * 8000, MediaLimits(max_bytes=1024))


def test_data_urls() -> None:
    raw = encode(gradient(), "PNG")
    got = media_bytes(data_url(raw))
    assert got.data == raw and got.declared == "image/png"
    assert media_bytes("data:;base64," + base64.b64encode(raw).decode()).data == raw


@pytest.mark.parametrize("url, match", [
    ("data:text/html;base64,PHNjcmlwdD4=", "not an image or audio"),
    ("data:image/png,%89PNG", "must carry base64"),
    ("data:image/png;base64", "needs a comma"),
    ("data:image/png;base64,@@@@", "not valid base64"),
    ("data:" + "x" * 300 + ";base64,AAAA", "header is too long"),
    ("file:///etc/passwd", "cannot be read from files"),
    ("FILE:///etc/shadow", "cannot be read from files"),
    ("/etc/passwd", "cannot be read from files"),
    ("../../secret.png", "cannot be read from files"),
    ("C:\\Windows\\win.ini", "cannot be read from files"),
    ("ftp://example.com/a.png", "scheme 'ftp'"),
    ("javascript:alert(1)", "scheme 'javascript'"),
    ("http://example.com/a.png", "does not fetch media from URLs"),
    ("https://169.254.169.254/latest/meta-data", "does not fetch media from URLs"),
])
def test_hostile_sources_are_refused(url: str, match: str) -> None:
    with pytest.raises(MediaError, match=match):
        media_bytes(url)


def test_bare_base64_only_where_the_api_takes_it() -> None:
    raw = encode(gradient(), "PNG")
    b64 = base64.b64encode(raw).decode()
    assert media_bytes(b64).data == raw  # Ollama's images
    with pytest.raises(MediaError, match="must be a data: URL"):
        media_bytes(b64, bare_base64=False)  # OpenAI's image_url.url


def test_jpeg_base64_starting_with_a_slash_is_not_a_path() -> None:
    b64 = base64.b64encode(encode(gradient(), "JPEG")).decode()
    assert b64.startswith("/9j/")
    assert media_bytes(b64).data[:3] == b"\xff\xd8\xff"


# -- a request's media -----------------------------------------------------------------

def test_media_set_keeps_order_and_counts_items() -> None:
    media = MediaSet(MediaLimits(max_items=3))
    png = encode(gradient(), "PNG")
    assert media.image(data_url(png)) == MEDIA_MARKER
    assert media.audio(base64.b64encode(wav_bytes(0.2)).decode(), "wav") == MEDIA_MARKER
    assert media.image(base64.b64encode(png).decode()) == MEDIA_MARKER
    assert [i.kind for i in media.items] == ["image", "audio", "image"]
    with pytest.raises(MediaError, match="at most 3"):
        media.image(data_url(png))


def test_video_part_gives_one_marker_per_frame() -> None:
    frames = [Image.new("RGB", (8, 8), (i * 30, 0, 0)) for i in range(6)]
    raw = encode(frames[0], "GIF", save_all=True, append_images=frames[1:])
    media = MediaSet(MediaLimits(max_frames=3))
    assert media.video(data_url(raw, "image/gif")) == MEDIA_MARKER * 3
    assert len(media.items) == 3


def test_image_part_with_audio_data_is_refused() -> None:
    with pytest.raises(MediaError, match="image part carries 'audio/wav'"):
        MediaSet().image(data_url(wav_bytes(0.1), "audio/wav"))


def test_client_text_may_not_forge_a_marker() -> None:
    assert check_text("a picture:") == "a picture:"
    with pytest.raises(MediaError, match="must not contain"):
        check_text(f"look {MEDIA_MARKER} here")
