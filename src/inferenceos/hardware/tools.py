"""Run vendor tools without ever hanging or raising.

`run_tool(["nvidia-smi", "-q", "-x"])` returns a `ToolOutput` whose `stdout` is the text
the tool printed, or None with `problem` saying why (not installed, timed out, exit
status, ...). Every probe in `inferenceos.hardware` goes through here, so a missing or
broken tool becomes one warning line in the profile.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple, TypeVar

DEFAULT_TIMEOUT_S = 4.0


class ToolOutput(NamedTuple):
    """The result of one tool run: `stdout` on success, else `problem`."""

    stdout: str | None
    problem: str | None
    missing: bool = False  # the tool is not installed (as opposed to failing)


def find_tool(name: str) -> str | None:
    """Full path of executable `name` on PATH, or None."""
    return shutil.which(name)


def run_tool(args: list[str], timeout: float = DEFAULT_TIMEOUT_S) -> ToolOutput:
    """Run `args` with stdin closed and a `timeout` in seconds; never raises."""
    exe = find_tool(args[0])
    if exe is None:
        return ToolOutput(None, f"{args[0]} not found on PATH", missing=True)
    try:
        proc = subprocess.Popen(
            [exe, *args[1:]], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL, text=True, errors="replace",
            env={**os.environ, "LC_ALL": "C"}, start_new_session=True,
        )
    except OSError as exc:
        return ToolOutput(None, f"{args[0]} could not be started: {exc}")
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        return ToolOutput(None, f"{args[0]} did not answer within {timeout:g} s")
    if proc.returncode != 0:
        detail = (stderr or stdout).strip().splitlines()
        why = detail[-1] if detail else "no output"
        return ToolOutput(None, f"{args[0]} exited with status {proc.returncode}: {why}")
    return ToolOutput(stdout, None)


def _kill_group(proc: subprocess.Popen[str]) -> None:
    """Kill the tool and anything it started (its own session), then reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        proc.kill()
    proc.communicate()


def read_text(path: Path) -> str | None:
    """The stripped text of a small (sysfs / procfs) file, or None if unreadable."""
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return None


T = TypeVar("T")


def probe_proc(proc: Path, name: str, warnings: list[str] | None, area: str, unknown: str,
               linux: Callable[[str], T], macos: Callable[[list[str]], T],
               fallback: Callable[[], T]) -> T:
    """What a probe of /proc/`name` (as `proc`/`name`) finds, by the rules every such
    probe follows: the live machine on macOS (no /proc there) is `macos`; else the
    file's text goes to `linux`, and an unreadable file is `fallback` with a warning
    "`area`: /proc/`name` is unreadable; `unknown`". A recorded `proc` tree is read as
    Linux's on any OS. Warnings go to `warnings` (dropped when None)."""
    warns = warnings if warnings is not None else []
    if sys.platform == "darwin" and proc == Path("/proc"):
        return macos(warns)
    text = read_text(proc / name)
    if text is None:
        warns.append(f"{area}: /proc/{name} is unreadable; {unknown}")
        return fallback()
    return linux(text)


def read_int(path: Path, base: int = 10) -> int | None:
    """The integer in a small file (sysfs style), or None if missing or not a number."""
    text = read_text(path)
    if text is None:
        return None
    try:
        return int(text.split()[0], base) if text else None
    except ValueError:
        return None


Runner = Callable[[list[str]], ToolOutput]
"""How probes run tools: `run_tool` in production, a replay of recordings in tests."""
