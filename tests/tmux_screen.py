"""A terminal program driven as a person would: tmux runs it, send-keys types, and
capture-pane reads the screen (tests/cli/test_chat_cli.py, test_monitor_cli.py)."""

from __future__ import annotations

import re
import shlex
import subprocess
import time
import uuid
from pathlib import Path


class Screen:
    """One tmux session running a command; type into it and read what it shows. Each
    screen has its own tmux server (socket), so tests never share or race one."""

    def __init__(self, args: list[str], env: dict[str, str], cwd: Path) -> None:
        self.name = f"ios-chat-{uuid.uuid4().hex[:8]}"
        self.tmux = ["tmux", "-L", self.name]
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()
                           if k in ("PYTHONPATH", "INFERENCEOS_HOME", "PATH", "HOME"))
        cmd = f"env {exports} TERM=xterm-256color {shlex.join(args)}; echo EXITED=$?; sleep 60"
        subprocess.run([*self.tmux, "new-session", "-d", "-s", self.name, "-x", "150", "-y", "50",
                        "-c", str(cwd), cmd], check=True)

    def send(self, *keys: str) -> None:
        subprocess.run([*self.tmux, "send-keys", "-t", self.name, *keys], check=True)

    def line(self, text: str) -> None:
        self.send("-l", text)
        self.send("Enter")

    def text(self) -> str:
        return subprocess.run([*self.tmux, "capture-pane", "-p", "-J", "-S", "-200", "-t",
                               self.name], capture_output=True, text=True).stdout

    def wait(self, pattern: str, timeout: float = 60, count: int = 1) -> str:
        """The screen once `pattern` (a regex) appears `count` times."""
        deadline = time.monotonic() + timeout
        while True:
            screen = self.text()
            if len(re.findall(pattern, screen)) >= count:
                return screen
            if time.monotonic() > deadline:
                raise AssertionError(f"{pattern!r} did not appear; screen:\n{screen}")
            time.sleep(0.1)

    def close(self) -> None:
        subprocess.run([*self.tmux, "kill-server"], capture_output=True)
