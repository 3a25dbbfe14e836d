"""Images through the engine: the tiny VLM pair (tests/tiny_vlm.py) served by the same
continuous-batching scheduler as text, in process (LocalEngine) and in the worker.

What must hold: an image's encoder tokens enter the context (the prompt counts them),
a reply is generated, two different images give different first-token logits, the same
image again is reused from the prefix cache (no second encode), media steps interleave
with another sequence's decode, and the bad cases are clear errors.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from inferenceos.engine.engine import Engine
from inferenceos.engine.local import LocalEngine
from inferenceos.engine.sampling import SamplingParams
from inferenceos.errors import UsageError
from inferenceos.media.item import MEDIA_MARKER, MediaItem
from inferenceos.plan.llama_params import LlamaParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, logprobs=3)
IMAGE_TOKENS = 16  # the tiny projector: (32 / 8) ** 2


def image(seed: int, nx: int = 40, ny: int = 30) -> MediaItem:
    rgb = np.random.default_rng(seed).integers(0, 256, (ny, nx, 3), dtype=np.uint8)
    return MediaItem("image", rgb.tobytes(), nx, ny)


PROMPT = f"look {MEDIA_MARKER} and say"


@pytest.fixture(scope="module")
def local(tiny_vlm_pair: tuple[Path, Path]) -> Iterator[LocalEngine]:
    model, mmproj = tiny_vlm_pair
    eng = LocalEngine(model, LlamaParams(n_ctx=256, n_batch=64, n_threads=1), n_parallel=2,
                      mmproj=mmproj, mmproj_gpu=False)
    yield eng
    eng.close()


def run(eng: LocalEngine | Engine, prompt: str, items: list[MediaItem]) -> tuple[list[Any], Any]:
    gen = eng.generate(prompt, GREEDY, media=items)
    events = list(gen)
    return events, gen.metrics


def test_the_image_enters_the_context_and_a_reply_comes(local: LocalEngine) -> None:
    text_only = len(local.tokenize("look  and say"))
    events, m = run(local, PROMPT, [image(1)])
    assert len(events) == GREEDY.max_tokens
    # the marker's text is replaced by the image's cells (mtmd may split the text
    # around it slightly differently: allow a token either way)
    assert abs(m.prompt_tokens - (text_only + IMAGE_TOKENS)) <= 1
    assert local.media_tokens(image(1)) == IMAGE_TOKENS
    assert local.media_support["vision"] is True


def test_two_images_give_different_logits(local: LocalEngine) -> None:
    a, _ = run(local, PROMPT, [image(2)])
    b, _ = run(local, PROMPT, [image(3)])
    la = [lp.logprob for lp in a[0].top_logprobs]
    lb = [lp.logprob for lp in b[0].top_logprobs]
    assert not np.allclose(la, lb, atol=1e-4)


def test_the_same_image_is_reused_from_the_prefix_cache(local: LocalEngine) -> None:
    media = local._media
    assert media is not None
    _first, _m1 = run(local, PROMPT + " one", [image(4)])
    encoded = media.encode_s
    _again, m2 = run(local, PROMPT + " two", [image(4)])
    assert media.encode_s == encoded  # no second encode: the image's cells were reused
    assert m2.cached_tokens >= IMAGE_TOKENS
    _other, m3 = run(local, PROMPT + " two", [image(5)])
    assert media.encode_s > encoded  # another image is encoded
    assert m3.cached_tokens < IMAGE_TOKENS


def test_bad_media_requests_are_clear_errors(local: LocalEngine, tiny_llama: Path) -> None:
    with pytest.raises(UsageError, match="markers"):
        local.generate("no marker here", GREEDY, media=[image(1)])
    with pytest.raises(UsageError, match="audio"):
        local.generate(PROMPT, GREEDY, media=[MediaItem("audio", b"RIFF....WAVE")])
    with (LocalEngine(tiny_llama, LlamaParams(n_ctx=128, n_threads=1)) as plain,
          pytest.raises(UsageError, match="projector")):
        plain.generate(PROMPT, GREEDY, media=[image(1)])


def test_worker_engine_interleaves_an_image_with_a_running_stream(
    tiny_vlm_pair: tuple[Path, Path],
) -> None:
    model, mmproj = tiny_vlm_pair
    with Engine(model, LlamaParams(n_ctx=256, n_batch=64, n_threads=1), n_parallel=2,
                mmproj=mmproj, mmproj_gpu=False) as eng:
        lone, _ = run(eng, PROMPT, [image(7)])
        long = eng.generate("count: one two three", SamplingParams(temperature=0.0,
                                                                   max_tokens=60))
        it = iter(long)
        next(it)  # the text stream is decoding
        both, _m = run(eng, PROMPT, [image(7)])
        rest = list(it)
        assert len(rest) == 59
        assert [e.token for e in both] == [e.token for e in lone]
        assert eng.media_tokens(image(8)) == IMAGE_TOKENS


def _wav(freq: float, seconds: float = 1.0, rate: int = 16000) -> bytes:
    import io
    import wave

    t = np.arange(int(seconds * rate)) / rate
    pcm = (np.sin(2 * np.pi * freq * t) * 12000).astype("<i2").tobytes()
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm)
    return buf.getvalue()


def test_audio_is_heard_through_an_audio_projector(tiny_dir: Path) -> None:
    from inferenceos.media.audio import check_audio
    from tiny_vlm import tiny_audio

    model, mmproj = tiny_audio(tiny_dir)
    with LocalEngine(model, LlamaParams(n_ctx=512, n_batch=256, n_threads=1),
                     mmproj=mmproj, mmproj_gpu=False) as eng:
        assert eng.media_support == {"vision": False, "audio": True,
                                     "load_s": eng.media_support["load_s"]}
        low, high = check_audio(_wav(220), "wav"), check_audio(_wav(1760), "wav")
        n = eng.media_tokens(low)
        assert n > 0
        a, m = run(eng, f"hear {MEDIA_MARKER} now", [low])
        b, _ = run(eng, f"hear {MEDIA_MARKER} now", [high])
        assert m.prompt_tokens >= n
        la = [lp.logprob for lp in a[0].top_logprobs]
        lb = [lp.logprob for lp in b[0].top_logprobs]
        assert not np.allclose(la, lb, atol=1e-4)
        with pytest.raises(UsageError, match="images"):
            eng.generate(PROMPT, GREEDY, media=[image(1)])


def test_an_unknown_encoder_device_is_a_clear_load_error(tiny_vlm_pair: tuple[Path, Path]) -> None:
    from inferenceos.errors import ModelLoadError

    model, mmproj = tiny_vlm_pair
    with pytest.raises(ModelLoadError, match="no device named 'CUDA7'"):
        LocalEngine(model, LlamaParams(n_ctx=128, n_threads=1), mmproj=mmproj,
                    mmproj_gpu=True, mmproj_device="CUDA7")
    with LocalEngine(model, LlamaParams(n_ctx=128, n_threads=1), mmproj=mmproj,
                     mmproj_gpu=True, mmproj_device="CPU") as eng:  # the plan's CPU
        assert eng.media_tokens(image(1)) == IMAGE_TOKENS
