"""`inferenceos chat [MODEL]`: an interactive conversation, streamed, in the terminal.

It talks to a running server when one answers (the configured server.host/port, or
`--url`) and the model is a name, else loads the model in this process. Commands start
with `/` (`/help` lists them); `\"\"\"` opens and closes a multi-line message. Ctrl-C
stops the reply, not the session; Ctrl-D or `/bye` ends it.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from inferenceos.cli.chat_session import (
    OPTION_TYPES,
    Backend,
    ChatSession,
    LocalBackend,
    ServerBackend,
    Thought,
)
from inferenceos.cli.console import err
from inferenceos.cli.gen_opts import (
    LoraOpt,
    ReasoningBudgetOpt,
    SystemOpt,
    VerboseLogOpt,
    lora_option,
)
from inferenceos.cli.plan_opts import (
    BackendOpt,
    DraftOpt,
    GpuLayersOpt,
    MmprojOpt,
    ThreadsOpt,
    draft_choice,
)
from inferenceos.errors import InferenceOSError, UsageError
from inferenceos.model.default_model import CHAT_EXTRA_HINT, default_chat_model

HELP = """\
/set KEY VALUE   set a sampling option: {options}
/set system TEXT set the system message      /set   show the options
/switch MODEL    continue with another model
/stats           speed and context of the last reply
/think on|off    let a thinking model reason, or not   /think show   its last reasoning
/clear           forget the conversation
/save FILE       save the conversation (JSON)   /load FILE   load one
/image FILE      show the model an image with your next message (needs a projector:
                 one beside the model, or chat --mmproj FILE)
/bye             leave (or Ctrl-D)
\"\"\"              begin and end a multi-line message
Ctrl-C stops a reply without leaving."""


# control characters a model could print (escape sequences rewrite the screen)
_CONTROL = dict.fromkeys(c for c in (*range(32), 127) if c not in (9, 10))


@dataclass(frozen=True)
class Theme:
    """ANSI styles (SGR parameters) for the prompt, the reply and notes."""

    prompt: str = ""
    reply: str = ""
    note: str = ""
    error: str = ""

    def paint(self, style: str, text: str) -> str:
        return f"\033[{style}m{text}\033[0m" if style else text


THEMES = {
    "dark": Theme(prompt="1;36", reply="97", note="2", error="1;31"),
    "light": Theme(prompt="1;34", reply="30", note="90", error="1;31"),
    "nord": Theme(prompt="1;38;2;136;192;208", reply="38;2;216;222;233",
                  note="38;2;97;110;136", error="38;2;191;97;106"),
    "none": Theme(),
}


def pick_theme(name: str, tty: bool) -> Theme:
    """The theme for `name` (auto: none when NO_COLOR is set or output is not a
    terminal; light when COLORFGBG says the background is light; else dark)."""
    if name not in (*THEMES, "auto"):
        raise UsageError(f"unknown theme {name!r}; use auto, {', '.join(THEMES)}")
    if name != "auto":
        return THEMES[name]
    if os.environ.get("NO_COLOR") or not tty or os.environ.get("TERM") == "dumb":
        return THEMES["none"]
    bg = os.environ.get("COLORFGBG", "").rpartition(";")[2]
    return THEMES["light"] if bg in ("7", "15") else THEMES["dark"]


class _Fold:
    """A reply's reasoning, dimmed and folded into one line that grows as it streams
    ("thinking: N words ... last words"), closed when the answer begins; `/think show`
    prints it whole. Off a terminal the line is written once, when it closes."""

    def __init__(self, theme: Theme, tty: bool) -> None:
        self.theme, self.tty = theme, tty
        self.text = ""
        self.closed = False

    def _line(self) -> str:
        words = self.text.split()
        tail = " ".join(words[-8:]).translate(_CONTROL)
        return self.theme.paint(self.theme.note, f"[thinking: {len(words)} words"
                                f" ... {tail[-60:]}] (/think show)")

    def feed(self, piece: str) -> str:
        self.text += piece
        return f"\r\033[2K{self._line()}" if self.tty else ""

    def close(self) -> str:
        if self.closed or not self.text:
            return ""
        self.closed = True
        reply = f"\033[{self.theme.reply}m" if self.theme.reply else ""
        return (f"\r\033[2K{self._line()}\n" if self.tty else f"{self._line()}\n") + reply


def read_message(read: Callable[[str], str], prompt: str, more: str) -> str:
    """One user message: a line, or the lines between a pair of \"\"\" markers."""
    line = read(prompt)
    if not line.lstrip().startswith('"""'):
        return line
    first = line.lstrip()[3:]
    if first.rstrip().endswith('"""') and first.strip():
        return first.rstrip()[:-3]
    lines = [first] if first else []
    while True:
        line = read(more)
        if line.rstrip().endswith('"""'):
            lines.append(line.rstrip()[:-3])
            return "\n".join(lines).strip("\n")
        lines.append(line)


def open_backend(model: str, url: str | None, api_key: str, local: bool,
                 load_options: dict[str, Any]) -> Backend:
    """A server backend when a server answers and `model` is not a file path, else
    the model in this process. An explicit `url` that does not answer is an error.
    `load_options` go to `inferenceos.load`; a server loads its models itself, so an
    `mmproj` there is refused (a request cannot name a projector)."""
    from inferenceos.cli.server_client import ServerClient

    is_file = bool(model) and (Path(model).expanduser().exists() or model.endswith(".gguf"))
    if not local and not is_file:
        server = ServerClient.configured(url, api_key=api_key or None)
        if server.answers():
            if load_options.get("mmproj") is not None:
                raise UsageError(
                    f"--mmproj is for a model loaded here, and {model or 'the model'} is "
                    f"served by {server.base}, which uses the projector it has for it; add "
                    "--local to load the model here with this projector")
            return ServerBackend(server.base, model, server.api_key)
        if url:
            raise InferenceOSError(f"no server answers at {url}")
    if not model:
        model = default_chat_model()
        if not model:
            err.print(f"note: {CHAT_EXTRA_HINT}")
    return LocalBackend(model, **load_options)


class ChatUI:
    """The read-eval-print loop over a ChatSession."""

    def __init__(self, session: ChatSession, theme: Theme,
                 open_model: Callable[[str], Backend]) -> None:
        self.session = session
        self.theme = theme
        self.open_model = open_model
        self.readline = _enable_readline()
        # at a terminal Ctrl-C stops a reply and the chat goes on; with messages from a
        # pipe or a file no one can type /bye, so Ctrl-C ends the process (exit 130)
        self.interactive = sys.stdin.isatty()

    def say(self, text: str, style: str = "note") -> None:
        sys.stdout.write(self.theme.paint(getattr(self.theme, style), text) + "\n")
        sys.stdout.flush()

    def _input(self, prompt: str) -> str:
        style = self.theme.prompt
        if style and self.readline:  # \001..\002: readline must not count escapes as width
            prompt = f"\001\033[{style}m\002{prompt}\001\033[0m\002"
        elif style:
            prompt = self.theme.paint(style, prompt)
        return input(prompt)

    def announce(self) -> None:
        b = self.session.backend
        self.say(f"chatting with {b.name} ({b.where}); /help for commands, /bye to leave")
        if not b.has_template:
            self.say(f"note: {b.name} has no chat template; using a plain "
                     "User:/Assistant: transcript")

    def loop(self) -> None:
        self.announce()
        try:
            self._loop()
        finally:
            if self.readline:
                _save_history()

    def _loop(self) -> None:
        while True:
            try:
                text = read_message(self._input, ">>> ", "... ")
            except KeyboardInterrupt:
                if not self.interactive:
                    raise
                sys.stdout.write("\n")
                self.say("use Ctrl-D or /bye to leave")
                continue
            except EOFError:
                sys.stdout.write("\n")
                return
            if not text.strip():
                continue
            if text.startswith("/"):
                try:
                    if not self.command(text):
                        return
                except InferenceOSError as exc:
                    self.say(f"error: {exc}", "error")
                continue
            self.reply(text)

    def reply(self, text: str) -> None:
        t = self.theme
        try:
            if t.reply:
                sys.stdout.write(f"\033[{t.reply}m")
            before = self.session.dropped
            fold = _Fold(t, sys.stdout.isatty())
            for piece in self.session.ask(text):
                if self.session.dropped > before:
                    before = self.session.dropped
                    self.say(f"(the conversation outgrew the context: the oldest "
                             f"{before} messages are left out)")
                if isinstance(piece, Thought):
                    sys.stdout.write(fold.feed(piece))
                else:
                    sys.stdout.write(fold.close() + piece.translate(_CONTROL))
                sys.stdout.flush()
            sys.stdout.write(fold.close() + ("\033[0m\n" if t.reply else "\n"))
        except KeyboardInterrupt:
            sys.stdout.write("\033[0m\n" if t.reply else "\n")
            if not self.interactive:
                raise
            self.say("[reply stopped]")
        except InferenceOSError as exc:
            sys.stdout.write("\033[0m\n" if t.reply else "\n")
            self.say(f"error: {exc}", "error")
            if self.session.images:  # kept, they would fail every message after this one
                n = len(self.session.images)
                self.session.images.clear()
                self.say(f"({n} attached image{'s' if n > 1 else ''} dropped with the "
                         "failed message: /image again to send it)")
        sys.stdout.flush()

    def command(self, line: str) -> bool:
        """Run a /command; False means leave."""
        try:
            words = shlex.split(line)
        except ValueError:
            words = line.split()
        cmd, args = words[0].lower(), words[1:]
        s = self.session
        if cmd in ("/bye", "/exit", "/quit"):
            return False
        if cmd in ("/help", "/?"):
            self.say(HELP.format(options=", ".join(OPTION_TYPES)))
        elif cmd == "/think":
            if args == ["show"]:
                self.say(s.thinking or "(the last reply had no reasoning)")
            else:
                self.say(s.think(args[0] if len(args) == 1 else ""))
        elif cmd == "/clear":
            s.clear()
            self.say("conversation cleared")
        elif cmd == "/stats":
            for row in s.backend.stats.lines():
                self.say(row)
        elif cmd == "/set":
            if not args:
                shown = {**s.options, **({"system": s.system} if s.system else {})}
                self.say(", ".join(f"{k} = {v!r}" for k, v in shown.items()) or
                         "no options set (the model's defaults apply)")
            elif len(args) < 2:
                raise UsageError("usage: /set KEY VALUE")
            else:
                self.say(s.set_option(args[0], " ".join(args[1:])))
        elif cmd in ("/save", "/load"):
            if len(args) != 1:
                raise UsageError(f"usage: {cmd} FILE")
            path = Path(args[0]).expanduser()
            if cmd == "/save":
                s.save(path)
                self.say(f"saved {len(s.history)} messages to {path}")
            else:
                self.say(f"loaded {s.load(path)} messages from {path}")
        elif cmd == "/image":
            if len(args) != 1:
                raise UsageError("usage: /image FILE")
            self.say(s.attach_image(Path(args[0])))
        elif cmd == "/switch":
            if len(args) != 1:
                raise UsageError("usage: /switch MODEL")
            backend = self.open_model(args[0])
            s.backend.close()
            s.backend = backend
            self.announce()
            unseen = s.unseen_images()
            if unseen:
                s.images.clear()
                self.say(f"note: {backend.name} cannot see images: the {unseen} in this "
                         "conversation are left out of what it is sent")
        else:
            raise UsageError(f"unknown command {cmd}; /help lists them")
        return True


HISTORY_LINES = 1000


def _history_file() -> Path:
    from inferenceos.paths import data_dir

    return data_dir() / "chat_history"


def _enable_readline() -> bool:
    """Line editing, and the input history of earlier chats under the arrow keys, where
    readline exists."""
    try:
        import readline
    except ImportError:
        return False
    readline.set_history_length(HISTORY_LINES)
    with contextlib.suppress(OSError):  # no history yet, or unreadable: start without
        readline.read_history_file(_history_file())
    return True


def _save_history() -> None:
    try:
        import readline

        path = _history_file()
        path.parent.mkdir(parents=True, exist_ok=True)
        readline.write_history_file(path)
    except (ImportError, OSError):
        pass  # history is a convenience: never fail a chat over it


def chat(
    model: Annotated[str, typer.Argument(
        help="Model name or .gguf path (default: the server's default, else "
             "qwen2.5-coder-0.5b-instruct with the chat extra, else built-in Gemma)")
    ] = "",
    system: SystemOpt = None,
    theme: Annotated[str, typer.Option(
        "--theme", help="Colours: auto, dark, light, nord, none (auto honours NO_COLOR)")
    ] = "auto",
    url: Annotated[str | None, typer.Option(
        "--url", help="Server to talk to (default: the configured one, if running)")] = None,
    api_key: Annotated[str | None, typer.Option(
        "--api-key", help="The server's API key (default: config server.api_key)")] = None,
    local: Annotated[bool, typer.Option(
        "--local", help="Load the model in this process even if a server runs")] = False,
    ctx: Annotated[int, typer.Option("--ctx", min=0, help="Context size (0: planned)")] = 0,
    threads: ThreadsOpt = 0,
    gpu_layers: GpuLayersOpt = None,
    backend: BackendOpt = None,
    temperature: Annotated[float | None, typer.Option("--temperature", "-t")] = None,
    seed: Annotated[int | None, typer.Option("--seed")] = None,
    max_tokens: Annotated[int | None, typer.Option("--max-tokens", "-n", min=0)] = None,
    verbose: VerboseLogOpt = False,
    mmproj: MmprojOpt = None,
    draft: DraftOpt = None,
    lora: LoraOpt = None,
    reasoning_budget: ReasoningBudgetOpt = -1,
) -> None:
    """Chat with a model interactively: streaming, history, /commands (/help)."""
    start_chat(model, system=system, theme=theme, url=url, api_key=api_key,
               local=local or bool(lora), ctx=ctx, threads=threads, verbose=verbose,
               lora=lora_option(lora),
               load={"gpu_layers": gpu_layers, "backend": backend, "mmproj": mmproj,
                     "draft": draft_choice(draft)},
               options={k: v for k, v in (("temperature", temperature), ("seed", seed),
                                          ("max_tokens", max_tokens),
                                          ("reasoning_budget", None if reasoning_budget == -1
                                           else reasoning_budget)) if v is not None})


def start_chat(model: str, *, system: str | None = None, theme: str = "auto",
               url: str | None = None, api_key: str | None = None, local: bool = False,
               ctx: int = 0, threads: int = 0, verbose: bool = False,
               options: dict[str, Any] | None = None,
               load: dict[str, Any] | None = None,
               lora: tuple[tuple[str, float], ...] = ()) -> None:
    """Open the model and run the chat loop (also what `run MODEL` does at a terminal).
    `load`: more `inferenceos.load` options; its `mmproj` is `model`'s projector (a
    model opened by /switch finds its own)."""
    chosen = pick_theme(theme, sys.stdout.isatty())
    # the drafter as `run` takes it (config plan.draft, default auto: the plan's choice)
    load_options = {"n_ctx": ctx, "threads": threads, "verbose": verbose,
                    "draft": draft_choice(None), **(load or {})}
    mmproj = load_options.pop("mmproj", None)

    def open_model(name: str) -> Backend:
        return open_backend(name, url, api_key or "", local, load_options)

    first = open_backend(model, url, api_key or "", local, {**load_options, "mmproj": mmproj})
    session = ChatSession(first, system or "")
    for key, value in (options or {}).items():
        if value is not None:
            session.set_option(key, str(value))
    if lora:  # adapters apply in this process (--lora implies --local)
        session.options["lora"] = lora
    try:
        ChatUI(session, chosen, open_model).loop()
    finally:
        session.backend.close()
