"""Media bytes made in tests: a sine-wave WAV, and a PNG header that declares any size.

Shared by tests/model/test_media_input.py and tests/server/test_server_media.py (the
server's tests ran only beside the model's, whose module they imported these from).
"""

from __future__ import annotations

import io
import math
import struct
import wave
import zlib


def wav_bytes(seconds: float, rate: int = 16000, channels: int = 1) -> bytes:
    """A 16-bit PCM WAV of a sine wave, `seconds` long."""
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(2)
        w.setframerate(rate)
        n = int(seconds * rate)
        w.writeframes(b"".join(struct.pack("<h", int(8000 * math.sin(i / 8))) * channels
                               for i in range(n)))
    return buf.getvalue()


def png_declaring(w: int, h: int) -> bytes:
    """A valid-looking PNG header that declares w x h pixels, with one tiny IDAT."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return (struct.pack(">I", len(body)) + kind + body
                + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF))
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr)
            + chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + chunk(b"IEND", b""))
