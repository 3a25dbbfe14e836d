"""Images and audio through the APIs, end to end: the real `openai` and `ollama` clients
against a real server whose model is the tiny VLM pair (tests/tiny_vlm.py: a 2-layer
llama and a LLaVA-style projector, 32 px images → 16 tokens) in a real worker; the
catalog finds the projector beside the model file and the manager loads it with it."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import ollama
import openai
import pytest
from PIL import Image

from inferenceos.engine.sampling import SamplingParams
from inferenceos.media.image import decode_image
from inferenceos.media.item import MEDIA_MARKER
from inferenceos.server.generation import _context_to_grow
from server_harness import Harness, serving
from tiny_vlm import BLUE, IMAGE_TOKENS, RED, png


def data_url(raw: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(raw).decode()


@pytest.fixture(scope="module")
def server(tiny_vlm_pair: tuple[Path, Path], tiny_llama: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    model, _ = tiny_vlm_pair
    root = tmp_path_factory.mktemp("media-server")
    with serving({"vlm": model, "text": tiny_llama}, root) as h:
        yield h


@pytest.fixture
def oai(server: Harness) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.v1, api_key="none", max_retries=0)


@pytest.fixture
def oll(server: Harness) -> ollama.Client:
    return ollama.Client(host=server.url)


def _chat(oai: openai.OpenAI, content: Any, model: str = "vlm", **kw: Any) -> Any:
    return oai.chat.completions.create(
        model=model, messages=[{"role": "user", "content": content}], max_tokens=4,
        temperature=0, **kw)


def _image_part(raw: bytes) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": data_url(raw)}}


def test_openai_client_sends_an_image_and_gets_a_reply(oai: openai.OpenAI) -> None:
    text = _chat(oai, "look at  this")
    with_image = _chat(oai, [{"type": "text", "text": "look at "}, _image_part(RED),
                             {"type": "text", "text": " this"}])
    assert with_image.choices[0].message.content
    assert with_image.usage.completion_tokens == 4
    # usage counts the image's cells (the marker's own text splits a little differently)
    extra = with_image.usage.prompt_tokens - text.usage.prompt_tokens
    assert abs(extra - IMAGE_TOKENS) <= 2


def test_openai_streamed_image_reply_with_usage(oai: openai.OpenAI) -> None:
    stream = _chat(oai, [_image_part(BLUE), {"type": "text", "text": "what?"}], stream=True,
                   stream_options={"include_usage": True})
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].usage.prompt_tokens > IMAGE_TOKENS


def test_two_images_give_different_replies_and_the_same_image_the_same(
        oai: openai.OpenAI) -> None:
    def logprobs(raw: bytes) -> list[float]:
        r = _chat(oai, [_image_part(raw), {"type": "text", "text": "say"}], logprobs=True)
        return [t.logprob for t in r.choices[0].logprobs.content]
    red, blue, red_again = logprobs(RED), logprobs(BLUE), logprobs(RED)
    assert red == pytest.approx(red_again, abs=1e-4)
    assert red != pytest.approx(blue, abs=1e-4)


def test_truncated_image_is_a_400_with_the_reason(oai: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        _chat(oai, [_image_part(RED[: len(RED) // 2])])
    assert "PNG image is" in str(err.value) and "truncated" in str(err.value)


@pytest.mark.parametrize("url, words", [
    ("data:text/html;base64,PGh0bWw+", "not an image or audio"),
    ("data:image/png;base64,@@@notbase64", "not valid base64"),
    ("file:///etc/passwd", "cannot be read from files"),
    ("http://127.0.0.1:1/x.png", "does not fetch media from URLs"),
    ("data:image/svg+xml;base64," + base64.b64encode(b"<svg></svg>").decode(), "SVG"),
])
def test_hostile_image_urls_are_400s(oai: openai.OpenAI, url: str, words: str) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        _chat(oai, [{"type": "image_url", "image_url": {"url": url}}])
    assert words in str(err.value)


def test_decompression_bomb_is_a_400(oai: openai.OpenAI) -> None:
    from media_samples import png_declaring

    with pytest.raises(openai.BadRequestError, match="pixels"):
        _chat(oai, [_image_part(png_declaring(100_000, 100_000))])


def test_a_model_without_projector_says_so(oai: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        _chat(oai, [_image_part(RED)], model="text")
    assert "cannot see images" in str(err.value) and "--mmproj" in str(err.value)


def test_forged_marker_text_is_a_400(oai: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="must not contain"):
        _chat(oai, [{"type": "text", "text": MEDIA_MARKER}, _image_part(RED)])


def test_audio_to_a_vision_only_projector_is_a_400(oai: openai.OpenAI) -> None:
    from media_samples import wav_bytes

    part = {"type": "input_audio",
            "input_audio": {"data": base64.b64encode(wav_bytes(0.2)).decode(),
                            "format": "wav"}}
    with pytest.raises(openai.BadRequestError, match="cannot hear audio"):
        _chat(oai, [part])


def test_video_part_is_sampled_frames(oai: openai.OpenAI) -> None:
    frames = [Image.new("RGB", (16, 16), (i * 40, 0, 0)) for i in range(6)]
    buf = io.BytesIO()
    frames[0].save(buf, "GIF", save_all=True, append_images=frames[1:])
    text = _chat(oai, "clip:")
    r = _chat(oai, [{"type": "text", "text": "clip:"},
                    {"type": "video_url", "video_url": {"url": data_url(buf.getvalue(),
                                                                        "image/gif")}}])
    assert r.usage.prompt_tokens - text.usage.prompt_tokens >= 6 * IMAGE_TOKENS - 2


def test_responses_api_input_image_and_its_continuation(oai: openai.OpenAI) -> None:
    first = oai.responses.create(model="vlm", max_output_tokens=3, temperature=0, input=[
        {"role": "user", "content": [{"type": "input_text", "text": "see"},
                                     {"type": "input_image", "image_url": data_url(RED)}]}])
    assert first.output_text and first.usage.input_tokens > IMAGE_TOKENS
    second = oai.responses.create(model="vlm", max_output_tokens=3, temperature=0,
                                  previous_response_id=first.id, input="and now?")
    # the stored conversation still holds its image
    assert second.usage.input_tokens > first.usage.input_tokens + 3


def test_ollama_client_generate_with_images(oll: ollama.Client) -> None:
    r = oll.generate(model="vlm", prompt="describe", images=[RED],
                     options={"num_predict": 3, "temperature": 0})
    plain = oll.generate(model="vlm", prompt="describe",
                         options={"num_predict": 3, "temperature": 0})
    assert r.response and r.eval_count == 3
    assert abs((r.prompt_eval_count - plain.prompt_eval_count) - IMAGE_TOKENS) <= 2
    assert not r.context  # a prompt with images has no token-id form


def test_ollama_client_chat_with_images_streamed(oll: ollama.Client) -> None:
    parts = list(oll.chat(model="vlm", stream=True, options={"num_predict": 3},
                          messages=[{"role": "user", "content": "what is it?",
                                     "images": [BLUE, RED]}]))
    assert parts[-1].done and parts[-1].prompt_eval_count > 2 * IMAGE_TOKENS


def test_ollama_bad_image_is_a_400(server: Harness) -> None:
    r = httpx.post(server.url + "/api/generate", json={
        "model": "vlm", "prompt": "x", "images": ["bm90IGFuIGltYWdl"], "stream": False})
    assert r.status_code == 400
    assert r.json() == {"error": "not a supported image (text); send PNG, JPEG, GIF, WebP "
                                 "or BMP"}
    r = httpx.post(server.url + "/api/chat", json={
        "model": "vlm", "stream": False,
        "messages": [{"role": "user", "content": "x", "images": ["%%%"]}]})
    assert r.status_code == 400 and "base64" in r.json()["error"]


def test_ollama_images_with_context_tokens_are_refused(server: Harness) -> None:
    r = httpx.post(server.url + "/api/generate", json={
        "model": "vlm", "prompt": "x", "images": [base64.b64encode(RED).decode()],
        "context": [1, 2, 3], "stream": False})
    assert r.status_code == 400 and "context" in r.json()["error"]


def test_context_growth_counts_media_tokens(tiny_vlm_pair: tuple[Path, Path]) -> None:
    """16 images (256 cells) do not fit a 256-cell context though their text is short:
    the server's growth rule must see their cells, not the markers' few bytes."""
    model, mmproj = tiny_vlm_pair
    from inferenceos.engine.local import LocalEngine
    from inferenceos.plan.llama_params import LlamaParams

    eng = LocalEngine(model, LlamaParams(n_ctx=256, n_batch=64, n_threads=1),
                      mmproj=mmproj, mmproj_gpu=False)
    try:
        lease = SimpleNamespace(engine=eng, loaded=SimpleNamespace(
            model=SimpleNamespace(context_length=512)))
        items = tuple(decode_image(png((i * 15, 0, 0))) for i in range(16))
        sampling = SamplingParams(max_tokens=8)
        assert _context_to_grow(lease, MEDIA_MARKER * 16 + "hi", sampling,  # type: ignore[arg-type]
                                items) == 512
        assert _context_to_grow(lease, MEDIA_MARKER * 2 + "hi", sampling,  # type: ignore[arg-type]
                                items[:2]) == 0
    finally:
        eng.close()


def test_fetching_allowed_still_refuses_loopback_urls(server: Harness, oai: openai.OpenAI
                                                      ) -> None:
    """`serve --allow-media-urls`: an image URL naming this very server (loopback) is
    refused by the SSRF guard before any connection is made."""
    import dataclasses

    before = server.state.settings
    server.state.settings = dataclasses.replace(before, media_fetch=True)
    try:
        for url in (f"{server.url}/v1/models", f"http://localhost:{server.port}/x.png",
                    "http://169.254.169.254/latest/meta-data/"):
            with pytest.raises(openai.BadRequestError, match="non-public address"):
                _chat(oai, [{"type": "image_url", "image_url": {"url": url}}])
    finally:
        server.state.settings = before


def test_llamacpp_completion_with_multimodal_data(server: Harness) -> None:
    """llama-server's form: markers in prompt_string, base64 files in multimodal_data."""
    b64 = base64.b64encode(RED).decode()
    url = server.url + "/completion"
    text = httpx.post(url, json={"prompt": "look  now", "n_predict": 3}).json()
    r = httpx.post(url, json={"n_predict": 3, "prompt": {
        "prompt_string": f"look {MEDIA_MARKER} now", "multimodal_data": [b64]}})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["prompt"] == f"look {MEDIA_MARKER} now" and body["tokens_predicted"] == 3
    assert abs(body["tokens_evaluated"] - text["tokens_evaluated"] - IMAGE_TOKENS) <= 2
    bad = httpx.post(url, json={"prompt": {"prompt_string": "no marker",
                                           "multimodal_data": [b64]}})
    assert bad.status_code == 400 and "0 media markers" in bad.json()["error"]["message"]
    bad = httpx.post(url, json={"prompt": {"prompt_string": MEDIA_MARKER,
                                           "multimodal_data": [b64[:40]]}})
    assert bad.status_code == 400
    assert bad.json()["error"]["message"] == ("the PNG image is truncated or corrupt (its "
                                              "header cannot be read)")


def test_decoding_waits_for_a_slot_then_429(oai: openai.OpenAI,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Decoded pictures are large: only DECODE_SLOTS requests decode at once; one that
    waits past DECODE_WAIT_S is told to retry (429), not queued without bound."""
    from inferenceos.server import media_parts

    monkeypatch.setattr(media_parts, "DECODE_WAIT_S", 0.3)
    held = 0
    try:
        while media_parts._slots.acquire(blocking=False):
            held += 1
        assert held == media_parts.DECODE_SLOTS
        with pytest.raises(openai.RateLimitError, match="decoding images or audio"):
            _chat(oai, [_image_part(RED)])
    finally:
        for _ in range(held):
            media_parts._slots.release()
    assert _chat(oai, [_image_part(RED)]).choices[0].message.content is not None
