"""Untrusted audio bytes → an audio `MediaItem` (the file itself: mtmd decodes it).

Checked here, before the engine sees a byte: size; type sniffed from the magic bytes
(WAV, MP3, FLAC; anything else refused); and the duration the header declares against
`max_audio_s`. WAV: the RIFF chunks are walked with every size bounded by the bytes
left, the `fmt ` chunk must be plain PCM or float (1-8 channels, 8-192 kHz, 8-32 bits,
consistent block alignment) and the duration is data bytes / byte rate. FLAC: the
STREAMINFO block (rate, channels, total samples). MP3: the first frame header's
bitrate and rate, and the frame count of a Xing/Info/VBRI header when there is one
(else a constant bitrate is assumed). A declared type (`format` of an OpenAI
`input_audio` part) that disagrees with the bytes is refused.
"""

from __future__ import annotations

import hashlib
import struct

from inferenceos.errors import MediaError
from inferenceos.media.image import check_size
from inferenceos.media.item import MediaItem
from inferenceos.media.limits import DEFAULT_LIMITS, MediaLimits
from inferenceos.media.sniff import AudioFormat, sniff_audio

_WAV_CODECS = {1: "PCM", 3: "float", 0xFFFE: "extensible"}
_MAX_CHUNKS = 64


def check_audio(data: bytes, declared: str | None = None,
                limits: MediaLimits = DEFAULT_LIMITS) -> MediaItem:
    """An audio item for `data` once it passes every check (see module docstring);
    `declared` is the client's format name ("wav", "mp3", "flac"), if it gave one."""
    check_size(data, limits, "audio file")
    fmt = sniff_audio(data)
    if declared is not None and declared.lower() not in (fmt, "mpeg" if fmt == "mp3" else fmt):
        raise MediaError(f"the audio is declared {declared[:20]!r} but the bytes are {fmt}")
    seconds = duration_s(data, fmt)
    if seconds > limits.max_audio_s:
        raise MediaError(f"the {fmt} audio lasts {seconds:.1f} s; the limit is "
                         f"{limits.max_audio_s:g} s")
    return MediaItem("audio", data, digest=hashlib.sha256(data).hexdigest())


def duration_s(data: bytes, fmt: AudioFormat) -> float:
    """Seconds of audio the header declares (MediaError when it is not sane)."""
    if fmt == "wav":
        return _wav_seconds(data)
    if fmt == "flac":
        return _flac_seconds(data)
    return _mp3_seconds(data)


def _wav_seconds(data: bytes) -> float:
    riff_size = struct.unpack_from("<I", data, 4)[0] if len(data) >= 12 else 0
    if len(data) < 12 or riff_size < 4:
        raise MediaError("the WAV file is truncated (no RIFF header)")
    pos, fmt_chunk, data_bytes = 12, None, None
    for _ in range(_MAX_CHUNKS):
        if pos + 8 > len(data):
            break
        cid, size = data[pos:pos + 4], struct.unpack_from("<I", data, pos + 4)[0]
        body = pos + 8
        left = len(data) - body
        if cid == b"fmt ":
            if size < 16 or size > left:
                raise MediaError("the WAV file's fmt chunk is truncated or malformed")
            fmt_chunk = struct.unpack_from("<HHIIHH", data, body)
        elif cid == b"data":
            # a streamed WAV declares 0 or 0xFFFFFFFF: what is there is what counts
            data_bytes = left if size == 0 or size > left else size
            break
        pos = body + size + (size & 1)  # chunks are padded to even sizes
    if fmt_chunk is None:
        raise MediaError("the WAV file has no fmt chunk before its data")
    if data_bytes is None or data_bytes == 0:
        raise MediaError("the WAV file has no audio data")
    codec, channels, rate, byte_rate, align, bits = fmt_chunk
    if codec not in _WAV_CODECS:
        raise MediaError(f"the WAV codec 0x{codec:04x} is not supported (PCM or float only)")
    if not 1 <= channels <= 8:
        raise MediaError(f"the WAV file declares {channels} channels (1 to 8 supported)")
    if not 8000 <= rate <= 192_000:
        raise MediaError(f"the WAV file declares a rate of {rate} Hz (8 to 192 kHz supported)")
    if bits not in (8, 16, 24, 32) or align != channels * bits // 8 \
            or byte_rate != rate * align:
        raise MediaError(f"the WAV header is inconsistent ({bits} bits, {channels} "
                         f"channels, block {align}, {byte_rate} bytes/s)")
    return data_bytes / byte_rate


def _flac_seconds(data: bytes) -> float:
    # fLaC, then metadata blocks; STREAMINFO is the first: 4-byte block header, then
    # min/max block (2+2), min/max frame (3+3), then 20 bits rate, 3 channels-1,
    # 5 bits-1, 36 bits total samples
    if len(data) < 8 + 34 or data[4] & 0x7F != 0:
        raise MediaError("the FLAC file is truncated or has no STREAMINFO block")
    bits = int.from_bytes(data[8 + 10:8 + 18], "big")
    rate = bits >> 44
    channels = ((bits >> 41) & 0x7) + 1
    total = bits & ((1 << 36) - 1)
    if not 1 <= rate <= 655_350 or channels > 8:
        raise MediaError(f"the FLAC header is not sane (rate {rate} Hz, {channels} channels)")
    if total == 0:  # "unknown": bound by size at the lowest plausible compression
        return len(data) / (rate * channels * 2)  # as if 16-bit samples, uncompressed
    return total / rate


_MP3_BITRATES = {  # kbit/s by index, MPEG-1 layer III / MPEG-2 and 2.5 layer III
    1: (0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 0),
    2: (0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160, 0),
}
_MP3_RATES = {3: (44100, 48000, 32000), 2: (22050, 24000, 16000), 0: (11025, 12000, 8000)}


def _mp3_seconds(data: bytes) -> float:
    pos = 0
    if data.startswith(b"ID3") and len(data) >= 10:  # skip the tag (syncsafe size)
        size = 0
        for b in data[6:10]:
            size = (size << 7) | (b & 0x7F)
        pos = 10 + size
    # the first frame sync within the next 64 KiB
    end = min(len(data) - 4, pos + 65536)
    while pos < end and not (data[pos] == 0xFF and data[pos + 1] & 0xE0 == 0xE0
                             and (data[pos + 1] >> 1) & 3 == 1):
        pos += 1
    if pos >= end:
        raise MediaError("the MP3 file has no MPEG audio layer III frame")
    h = int.from_bytes(data[pos:pos + 4], "big")
    version = (h >> 19) & 3  # 3: MPEG-1, 2: MPEG-2, 0: MPEG-2.5
    kbps = _MP3_BITRATES[1 if version == 3 else 2][(h >> 12) & 0xF]
    rate_i = (h >> 10) & 3
    if version == 1 or kbps == 0 or rate_i == 3:
        raise MediaError("the MP3 frame header is not valid")
    rate = _MP3_RATES[version][rate_i]
    samples = 1152 if version == 3 else 576
    # Xing / Info (VBR or CBR with a frame count) right after the side information,
    # or VBRI at a fixed offset
    mono = (h >> 6) & 3 == 3
    side = (17 if mono else 32) if version == 3 else (9 if mono else 17)
    for off, tag in ((4 + side, (b"Xing", b"Info")), (36, (b"VBRI",))):
        at = pos + off
        if data[at:at + 4] in tag:
            if tag[0] == b"VBRI" and len(data) >= at + 18:
                return struct.unpack_from(">I", data, at + 14)[0] * samples / rate
            if len(data) >= at + 12 and struct.unpack_from(">I", data, at + 4)[0] & 1:
                return struct.unpack_from(">I", data, at + 8)[0] * samples / rate
    return (len(data) - pos) * 8 / (kbps * 1000)
