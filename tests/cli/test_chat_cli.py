"""`inferenceos chat` in a real terminal: tmux runs it, the test types and reads the screen.

The model writes letters only (tiny_models' `letters_only`), so its greedy reply can be
computed with the Python API and looked for on the screen.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli_helpers import cli_env
from tiny_models import write_tiny_model
from tmux_screen import Screen

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")

GREEDY = ["--temperature", "0", "--max-tokens", "12", "--ctx", "256", "--threads", "1"]


@pytest.fixture(scope="module")
def letters(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("chat") / "letters.gguf",
                            letters_only=True)


@pytest.fixture(scope="module")
def slow_letters(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A few hundred tokens a second and a 4096-token context: a reply that lasts long
    enough to be interrupted on a fast machine."""
    return write_tiny_model(tmp_path_factory.mktemp("chat") / "slow-letters.gguf",
                            kind="wide", letters_only=True)


@pytest.fixture(scope="module")
def letters_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("chat") / "letters-base.gguf",
                            letters_only=True, chat_template=None)


@pytest.fixture
def screens(tmp_path: Path) -> Iterator[list[Screen]]:
    opened: list[Screen] = []
    yield opened
    for s in opened:
        s.close()


def _chat(screens: list[Screen], tmp_path: Path, *args: str) -> Screen:
    env = cli_env()
    screen = Screen([sys.executable, "-m", "inferenceos", *args], env, tmp_path)
    screens.append(screen)
    screen.wait(r"/help for commands")
    return screen


def _expected(model: Path, messages: list[dict[str, str]]) -> str:
    import inferenceos

    with inferenceos.load(model, n_ctx=256, threads=1) as m:
        return m.chat(messages, temperature=0, max_tokens=12).text.strip()


def test_reply_stats_save_clear_bye(letters: Path, tmp_path: Path,
                                    screens: list[Screen]) -> None:
    s = _chat(screens, tmp_path, "chat", str(letters), "--theme", "none", "--local", *GREEDY)
    s.line("hello there")
    want = _expected(letters, [{"role": "user", "content": "hello there"}])
    screen = s.wait(r">>> ", count=2)
    assert want in screen  # the streamed reply, as the API computes it
    s.line("/stats")
    screen = s.wait(r"context used")
    assert re.search(r"TTFT\s+[\d.]+ ms", screen)  # tenths below 10 ms
    assert re.search(r"reply\s+12 tokens at [\d.]+ t/s", screen)
    assert re.search(r"context used\s+\d+ of 256 tokens", screen)
    s.line("/save conv.json")
    s.wait(r"saved 2 messages")
    saved = json.loads((tmp_path / "conv.json").read_text())
    assert saved["messages"][0] == {"role": "user", "content": "hello there"}
    assert saved["messages"][1]["content"] == want
    assert saved["options"] == {"temperature": 0.0, "max_tokens": 12}
    # the second turn carries the history: its reply is the API's for both turns
    s.line("more")
    s.wait(r">>> ", count=5)  # hello, /stats, /save, more, and the next prompt
    screen = s.text()
    want2 = _expected(letters, [{"role": "user", "content": "hello there"},
                                {"role": "assistant", "content": want},
                                {"role": "user", "content": "more"}])
    assert want2 in screen
    s.line("/clear")
    s.wait("conversation cleared")
    s.line("/save after.json")
    s.wait("saved 0 messages")
    s.line("/load conv.json")
    s.wait("loaded 2 messages")
    s.line("/bye")
    assert "EXITED=0" in s.wait(r"EXITED=\d+")


def test_multiline_set_and_errors(letters: Path, tmp_path: Path,
                                  screens: list[Screen]) -> None:
    s = _chat(screens, tmp_path, "chat", str(letters), "--theme", "none", "--local", *GREEDY)
    s.line('"""')
    s.line("first line")
    s.line('second line"""')
    s.wait(r">>> ", count=2)
    s.line("/save ml.json")
    s.wait("saved 2 messages")
    saved = json.loads((tmp_path / "ml.json").read_text())
    assert saved["messages"][0]["content"] == "first line\nsecond line"
    s.line("/set temperature -1")
    s.wait(r"error: temperature must be >= 0")
    s.line("/set top_k 5")
    s.wait(r"top_k = 5")
    s.line("/set bogus 1")
    s.wait(r"error: unknown option 'bogus'")
    s.line("/nope")
    s.wait(r"error: unknown command /nope")
    s.line("/load missing.json")
    s.wait(r"error: cannot read")
    s.send("C-d")
    assert "EXITED=0" in s.wait(r"EXITED=\d+")
    history = Path(cli_env()["INFERENCEOS_HOME"]) / "data" / "chat_history"
    assert "/set top_k 5" in history.read_text()  # the input history is kept for next time


def test_switch_keeps_the_conversation(letters: Path, letters_base: Path, tmp_path: Path,
                                       screens: list[Screen]) -> None:
    s = _chat(screens, tmp_path, "chat", str(letters), "--theme", "none", "--local", *GREEDY)
    s.line("hello")
    s.wait(r">>> ", count=2)
    s.line(f"/switch {letters_base}")
    s.wait("has no chat template")
    s.line("/save sw.json")
    s.wait("saved 2 messages")
    assert json.loads((tmp_path / "sw.json").read_text())["model"] == "letters-base"
    s.line("/switch /no/such.gguf")
    s.wait("error: no such model file")
    s.line("/bye")
    assert "EXITED=0" in s.wait(r"EXITED=\d+")


def test_ctrl_c_stops_the_reply_not_the_session(slow_letters: Path, tmp_path: Path,
                                                screens: list[Screen]) -> None:
    s = _chat(screens, tmp_path, "chat", str(slow_letters), "--theme", "none", "--local",
              "--max-tokens", "100000", "--threads", "1",
              "--temperature", "0")
    s.line("go on forever")
    s.wait(r"forever\n.{10}")  # letters stream in; the model only stops at the context
    s.send("C-c")
    s.wait(r"\[reply stopped\]")
    s.wait(r">>> ", count=2)
    s.send("C-c")  # at the prompt: a hint, still no exit
    s.wait(r"use Ctrl-D or /bye")
    s.line("/set max_tokens 3")
    s.line("again")
    s.wait(r">>> ", count=5)
    s.line("/stats")
    assert re.search(r"reply\s+3 tokens", s.wait("context used"))
    s.line("/bye")
    assert "EXITED=0" in s.wait(r"EXITED=\d+")


def test_base_model_says_so_and_uses_a_transcript(letters_base: Path, tmp_path: Path,
                                                  screens: list[Screen]) -> None:
    s = _chat(screens, tmp_path, "chat", str(letters_base), "--theme", "none", "--local",
              *GREEDY)
    screen = s.text()
    assert screen.count("has no chat template") == 1
    s.line("hi")
    s.wait(r">>> ", count=2)
    want = _expected(letters_base, [{"role": "user", "content": "hi"}])
    assert want in s.text()
    s.line("/bye")


def test_run_without_prompt_at_a_terminal_chats(letters: Path, tmp_path: Path,
                                                screens: list[Screen]) -> None:
    s = _chat(screens, tmp_path, "run", str(letters), "--threads", "1", "--ctx", "256")
    s.line("/bye")
    assert "EXITED=0" in s.wait(r"EXITED=\d+")


def test_colours_follow_the_theme(letters: Path, tmp_path: Path,
                                  screens: list[Screen]) -> None:
    """dark paints the prompt (ANSI escapes); NO_COLOR turns auto off."""
    s = _chat(screens, tmp_path, "chat", str(letters), "--theme", "dark", "--local", *GREEDY)
    raw = subprocess.run([*s.tmux, "capture-pane", "-p", "-e", "-t", s.name],
                         capture_output=True, text=True).stdout
    assert "\x1b[" in raw
    s.line("/bye")
    from inferenceos.cli.chat_cmd import THEMES, pick_theme

    assert pick_theme("auto", tty=False) == THEMES["none"]
    assert pick_theme("light", tty=False) == THEMES["light"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NO_COLOR", "1")
        assert pick_theme("auto", tty=True) == THEMES["none"]
        mp.delenv("NO_COLOR")
        mp.setenv("COLORFGBG", "0;15")
        assert pick_theme("auto", tty=True) == THEMES["light"]


def test_chat_talks_to_a_running_server(letters: Path, tmp_path: Path,
                                        screens: list[Screen]) -> None:
    """With a server at --url, chat streams through it (the model is a name there)."""
    from server_harness import serving

    with serving({"letters": letters}, tmp_path / "srv") as h:
        s = _chat(screens, tmp_path, "chat", "letters", "--url", h.url, "--theme", "none",
                  "--temperature", "0", "--max-tokens", "12")
        assert h.url in s.text()
        s.line("hello there")
        s.wait(r">>> ", count=2)
        s.line("/stats")
        screen = s.wait("context used")
        assert re.search(r"reply\s+12 tokens", screen)
        s.line("/bye")
        s.wait(r"EXITED=\d+")


def test_server_backend_finds_the_default_model(letters: Path, tmp_path: Path) -> None:
    """No MODEL: the server's default, named by an Ollama load request."""
    from inferenceos.cli.chat_session import ChatSession, ServerBackend
    from server_harness import serving

    with serving({"letters": letters}, tmp_path) as h:
        backend = ServerBackend(h.url, "")
        assert backend.name in ("letters", "letters:latest") and backend.has_template
        chat = ChatSession(backend, options={"max_tokens": 5, "temperature": 0})
        reply = "".join(chat.ask("hello"))
        assert reply.strip() == chat.history[1]["content"] and reply.strip()
        assert backend.stats.metrics.completion_tokens == 5 and backend.stats.n_ctx == 256


def test_server_chat_drops_old_turns_when_the_context_is_full(letters: Path,
                                                              tmp_path: Path) -> None:
    """The server refuses a prompt longer than its context (256 here): the oldest
    exchanges are dropped and the question is asked again, not failed."""
    from inferenceos.cli.chat_session import ChatSession, ServerBackend
    from server_harness import serving

    with serving({"letters": letters}, tmp_path) as h:
        chat = ChatSession(ServerBackend(h.url, "letters"),
                           options={"max_tokens": 60, "temperature": 0})
        for i in range(6):
            assert "".join(chat.ask(f"question {i}")).strip()
        assert chat.dropped >= 2 and chat.history[-2]["content"] == "question 5"


def test_image_command_sends_the_image_with_the_next_message(
    tiny_vlm_pair: tuple[Path, Path], tmp_path: Path, screens: list[Screen],
) -> None:
    import numpy as np
    from PIL import Image

    model, _ = tiny_vlm_pair  # its projector lies beside it
    rgb = np.random.default_rng(3).integers(0, 256, (40, 50, 3), dtype=np.uint8)
    Image.fromarray(rgb).save(tmp_path / "cat.png")
    (tmp_path / "cut.png").write_bytes((tmp_path / "cat.png").read_bytes()[:200])
    s = _chat(screens, tmp_path, "chat", str(model), "--theme", "none", "--local", *GREEDY)
    s.line("/image cut.png")
    s.wait(r"error: .*truncated")
    s.line("/image cat.png")
    s.wait(r"image cat.png \(50x40\) goes with your next message")
    s.line("what is it")
    s.wait(r">>> ", count=4)
    s.line("/stats")
    screen = s.wait(r"context used")
    prompt = int(re.findall(r"prompt\s+(\d+) tokens", screen)[-1])
    s.line("/save conv.json")
    s.wait(r"saved 2 messages")
    saved = json.loads((tmp_path / "conv.json").read_text())
    assert saved["messages"][0]["content"] == "what is it"
    assert len(saved["messages"][0]["images"]) == 1  # kept with its message
    with_image = prompt
    s.line("/clear")
    s.line("what is it")
    s.wait(r">>> ", count=8)
    s.line("/stats")
    screen = s.wait(r"context used", count=2)
    text_only = int(re.findall(r"prompt\s+(\d+) tokens", screen)[-1])
    assert with_image - text_only >= 16  # the image's 16 cells (and its marker's newline)


def _image(path: Path) -> Path:
    import numpy as np
    from PIL import Image

    rgb = np.random.default_rng(3).integers(0, 256, (40, 50, 3), dtype=np.uint8)
    Image.fromarray(rgb).save(path)
    return path


def test_image_on_a_text_only_model_is_refused_at_once(letters: Path, tmp_path: Path,
                                                       screens: list[Screen]) -> None:
    """/image on a model without a projector: one error line, nothing attached, and
    the next message is answered (it used to fail every message until /clear)."""
    _image(tmp_path / "cat.png")
    s = _chat(screens, tmp_path, "chat", str(letters), "--theme", "none", "--local", *GREEDY)
    s.line("/image cat.png")
    screen = s.wait(r"error: .*cannot see images")
    assert "goes with your next message" not in screen
    assert len(re.findall(r"error:", screen)) == 1
    s.line("hello there")
    screen = s.wait(r">>> ", count=3)
    assert _expected(letters, [{"role": "user", "content": "hello there"}]) in screen
    assert len(re.findall(r"error:", screen)) == 1  # only the refusal
    s.line("/bye")
    assert "EXITED=0" in s.wait(r"EXITED=\d+")


def test_mmproj_gives_chat_the_projector(tiny_vlm_pair: tuple[Path, Path], tmp_path: Path,
                                         screens: list[Screen]) -> None:
    """`chat --mmproj FILE` loads the projector with a model that has none beside it,
    as `run --mmproj` does; `--mmproj none` makes the pair text-only."""
    model, mmproj = tiny_vlm_pair
    alone = tmp_path / "alone.gguf"
    alone.symlink_to(model)
    _image(tmp_path / "cat.png")
    s = _chat(screens, tmp_path, "chat", str(alone), "--mmproj", str(mmproj), "--theme",
              "none", "--local", *GREEDY)
    s.line("/image cat.png")
    s.wait(r"image cat.png \(50x40\) goes with your next message")
    s.line("what is it")
    s.wait(r">>> ", count=3)
    s.line("/stats")
    prompt = int(re.findall(r"prompt\s+(\d+) tokens", s.wait(r"context used"))[-1])
    assert prompt >= 16  # the image's cells
    assert "error" not in s.text()
    s.line("/bye")
    s.wait(r"EXITED=0")
    s = _chat(screens, tmp_path, "chat", str(model), "--mmproj", "none", "--theme", "none",
              "--local", *GREEDY)
    s.line("/image cat.png")
    s.wait(r"error: .*cannot see images")
    s.line("/bye")
    s.wait(r"EXITED=0")


def test_stats_after_ctrl_c_show_the_part_that_ran(slow_letters: Path, tmp_path: Path,
                                                   screens: list[Screen]) -> None:
    """A reply stopped by Ctrl-C: /stats gives its TTFT and decode speed over the tokens
    it wrote, not zeros."""
    s = _chat(screens, tmp_path, "chat", str(slow_letters), "--theme", "none", "--local",
              "--max-tokens", "100000", "--threads", "1", "--temperature", "0")
    s.line("go on forever")
    s.wait(r"forever\n.{20}")
    s.send("C-c")
    s.wait(r"\[reply stopped\]")
    s.line("/stats")
    screen = s.wait(r"context used")
    ttft = re.search(r"TTFT\s+([\d.]+) ms", screen)
    assert ttft and float(ttft.group(1)) > 0, screen
    reply = re.search(r"reply\s+(\d+) tokens at ([\d.]+) t/s \(stop: interrupted\)", screen)
    assert reply and int(reply.group(1)) >= 20 and float(reply.group(2)) > 0, screen
    prompt = re.search(r"prompt\s+(\d+) tokens at ([\d.]+) t/s", screen)
    assert prompt and int(prompt.group(1)) > 0 and float(prompt.group(2)) > 0, screen
    s.line("/bye")
    assert "EXITED=0" in s.wait(r"EXITED=\d+")
