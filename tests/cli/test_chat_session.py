"""`chat`'s pieces without a terminal: what a reply stopped early leaves in `/stats`,
what `/image` and `--mmproj` do on a model that cannot see (cli/chat_session.py)."""

from __future__ import annotations

import re
from collections.abc import Generator
from pathlib import Path

import pytest

import inferenceos
from inferenceos import interrupt
from inferenceos.cli.chat_session import ChatSession, LocalBackend, ReplyStats
from inferenceos.engine.generation import GenerationMetrics
from inferenceos.errors import UsageError
from tiny_models import write_tiny_model

ZERO_MS = re.compile(r"(?<![\d.])0(\.0)? ms")
ZERO_TPS = re.compile(r"(?<![\d.])0\.0 t/s")


@pytest.fixture(scope="module")
def letters(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Greedy decoding writes letters and never ends on its own."""
    return write_tiny_model(tmp_path_factory.mktemp("session") / "letters.gguf",
                            letters_only=True)


def _png(path: Path) -> Path:
    import numpy as np
    from PIL import Image

    rgb = np.random.default_rng(5).integers(0, 256, (20, 30, 3), dtype=np.uint8)
    Image.fromarray(rgb).save(path)
    return path


def test_a_stream_closed_early_keeps_what_was_measured(letters: Path) -> None:
    """Closing a stream after a few pieces (a reply stopped early) leaves the figures
    of the part that ran: TTFT of its first token, decode speed, the prompt's size."""
    with inferenceos.load(letters, n_ctx=256, threads=1) as m:
        stream = m.chat([{"role": "user", "content": "hello"}], stream=True,
                        temperature=0, max_tokens=200)
        for i, _ in enumerate(stream):
            if i == 5:
                break
        stream.close()
        got = stream.metrics
        assert got.stop_reason == "interrupted"
        assert got.ttft_s > 0 and got.decode_tps > 0
        assert got.prompt_tokens > 0 and 6 <= got.completion_tokens <= 8


def test_a_decode_stopped_by_ctrl_c_keeps_what_was_measured(letters: Path) -> None:
    """A Ctrl-C that lands inside llama.cpp's decode (the flag it polls) ends the
    step with a KeyboardInterrupt: the figures of the tokens before it are kept."""
    with inferenceos.load(letters, n_ctx=256, threads=1) as m:
        stream = m.chat([{"role": "user", "content": "hello"}], stream=True,
                        temperature=0, max_tokens=200)
        seen = 0
        with pytest.raises(KeyboardInterrupt):
            for _ in stream:
                seen += 1
                if seen == 6:
                    interrupt.request()  # as the SIGINT watcher does, mid-generation
        interrupt.reset()
        got = stream.metrics
        assert got.stop_reason == "interrupted"
        assert got.ttft_s > 0 and got.decode_tps > 0 and got.prompt_tokens > 0
        assert got.completion_tokens == seen


def test_stats_of_a_reply_stopped_early_show_no_zeros() -> None:
    stopped = ReplyStats(GenerationMetrics(
        prompt_tokens=40, completion_tokens=7, ttft_s=0.0123, prompt_tps=3000.0,
        decode_tps=250.0, stop_reason="interrupted"), n_ctx=256)
    text = "\n".join(stopped.lines())
    assert "TTFT          12 ms" in text
    assert "reply         7 tokens at 250.0 t/s (stop: interrupted)" in text
    before = ReplyStats(GenerationMetrics(prompt_tokens=40, stop_reason="interrupted"),
                        n_ctx=256)
    text = "\n".join(before.lines())
    assert not ZERO_MS.search(text) and not ZERO_TPS.search(text), text
    assert "stopped before its first token" in text
    one = ReplyStats(GenerationMetrics(
        prompt_tokens=40, completion_tokens=1, ttft_s=0.02, prompt_tps=2000.0,
        stop_reason="interrupted"), n_ctx=256)
    assert not ZERO_TPS.search("\n".join(one.lines()))


def test_image_on_a_model_without_projector_is_refused_and_attaches_nothing(
    letters: Path, tmp_path: Path,
) -> None:
    backend = LocalBackend(str(letters), n_ctx=256, threads=1)
    try:
        chat = ChatSession(backend, options={"max_tokens": 3, "temperature": 0})
        with pytest.raises(UsageError, match=r"cannot see images.*--mmproj"):
            chat.attach_image(_png(tmp_path / "cat.png"))
        assert chat.images == []
        assert "".join(chat.ask("hello")).strip()  # the next message is answered
    finally:
        backend.close()


def test_local_backend_loads_the_projector_named(tiny_vlm_pair: tuple[Path, Path],
                                                 tmp_path: Path) -> None:
    """`chat --mmproj FILE` reaches inferenceos.load: a model alone in its folder sees
    with the projector named, and `none` makes the pair text-only."""
    model, mmproj = tiny_vlm_pair
    alone = tmp_path / "alone.gguf"
    alone.symlink_to(model)
    image = _png(tmp_path / "cat.png")
    for mm, sees in ((str(mmproj), True), (None, False)):
        backend = LocalBackend(str(alone), n_ctx=256, threads=1, mmproj=mm)
        try:
            chat = ChatSession(backend)
            if sees:
                assert "goes with your next message" in chat.attach_image(image)
            else:
                with pytest.raises(UsageError, match="cannot see images"):
                    chat.attach_image(image)
        finally:
            backend.close()
    backend = LocalBackend(str(model), n_ctx=256, threads=1, mmproj="none")
    try:
        with pytest.raises(UsageError, match="cannot see images"):
            ChatSession(backend).attach_image(image)
    finally:
        backend.close()


def test_a_server_backend_refuses_mmproj(letters: Path, tmp_path: Path) -> None:
    """The server loads the projector registered with a model; a request cannot name
    another: `--mmproj` with a running server says so and how to load it here."""
    from inferenceos.cli.chat_cmd import open_backend
    from server_harness import serving

    with serving({"letters": letters}, tmp_path) as h:
        with pytest.raises(UsageError, match=r"--mmproj.*--local"):
            open_backend("letters", h.url, "", False, {"mmproj": str(tmp_path / "p.gguf")})
        backend = open_backend("letters", h.url, "", False, {"mmproj": None})
        with pytest.raises(UsageError, match="cannot see images"):
            ChatSession(backend).attach_image(_png(tmp_path / "cat.png"))


def test_a_server_reply_stopped_early_keeps_what_chat_measured(letters: Path,
                                                               tmp_path: Path) -> None:
    """Through a server, the figures come with a reply's last line: stopped before it,
    /stats gives what chat measured itself (TTFT, lines streamed and their rate), and
    says that the prompt's size is not known, instead of the last reply's or zeros."""
    from inferenceos.cli.chat_session import ServerBackend
    from server_harness import serving

    with serving({"letters": letters}, tmp_path) as h:
        backend = ServerBackend(h.url, "letters")
        chat = ChatSession(backend, options={"max_tokens": 200, "temperature": 0})
        reply = chat.ask("hello")
        assert isinstance(reply, Generator)
        for i, _ in enumerate(reply):
            if i == 8:
                break
        reply.close()  # what Ctrl-C does to the reply's generator
        stats = backend.stats
        got = stats.metrics
        assert got.stop_reason == "interrupted" and got.completion_tokens >= 9
        assert got.ttft_s > 0 and got.decode_tps > 0
        text = "\n".join(stats.lines())
        assert not stats.prompt_known and "? tokens" in text and not ZERO_TPS.search(text), text
        assert chat.history[1]["content"]  # what was shown joins the history


def test_each_chat_reply_is_recorded_against_one_load(letters: Path) -> None:
    """chat's replies teach the planner as `run`'s do: the load recorded once (source
    "chat"), with its first reply, and every reply a generation of that load."""
    from inferenceos import telemetry

    before = len(telemetry.loads(letters))
    backend = LocalBackend(str(letters), n_ctx=256, threads=1)
    try:
        session = ChatSession(backend, "")
        session.set_option("max_tokens", "6")
        for text in ("hello", "again"):
            assert "".join(session.ask(text))
    finally:
        backend.close()
    assert telemetry.recorder().flush(30)
    loads = telemetry.loads(letters)[before:]
    assert [ld.source for ld in loads] == ["chat"]
    gens = [g for g in telemetry.generations(letters, source="chat")
            if g.load_uid == loads[0].uid]
    assert len(gens) == 2 and all(g.output_tokens == 6 for g in gens)
