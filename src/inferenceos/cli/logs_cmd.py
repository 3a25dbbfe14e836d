"""`inferenceos logs [-f]`: the runtime log the server and the CLI write (see logs.py)."""

from __future__ import annotations

import os
import sys
import time
from typing import Annotated

import typer
from rich.console import Console

from inferenceos.cli.console import err
from inferenceos.errors import UsageError
from inferenceos.logs import LEVELS, level_of, log_path, read_tail

_RANK = {name: i for i, name in enumerate(LEVELS)}
_STYLE = {"WARNING": "yellow", "ERROR": "red", "CRITICAL": "bold red", "DEBUG": "dim"}


def _emit(line: str, floor: int) -> None:
    level = level_of(line)
    if level is not None and _RANK[level] < floor:
        return
    if sys.stdout.isatty() and level in _STYLE:
        from rich.text import Text

        Console(highlight=False, soft_wrap=True).print(Text(line, style=_STYLE[level]))
    else:
        sys.stdout.write(line + "\n")


def logs(
    follow: Annotated[bool, typer.Option("--follow", "-f",
                                         help="Keep printing new lines (Ctrl-C stops)")] = False,
    lines: Annotated[int, typer.Option("--lines", "-n", help="How many last lines")] = 50,
    level: Annotated[str, typer.Option(
        "--level", help="Only this level and above: DEBUG, INFO, WARNING, ERROR")] = "DEBUG",
) -> None:
    """Print the runtime log (levels, component, process); -f follows it."""
    floor = _RANK.get(level.upper())
    if floor is None:
        raise UsageError(f"unknown level {level!r} (use {', '.join(LEVELS[:4])})")
    if lines < 0:
        raise UsageError("--lines must be >= 0")
    path = log_path()
    if not path.exists() and not follow:
        err.print(f"no log yet ({path})", markup=False)
        return
    for line in read_tail(path, lines):
        _emit(line, floor)
    sys.stdout.flush()
    if follow:
        _follow(path, floor)


def _follow(path: os.PathLike[str], floor: int, poll_s: float = 0.25) -> None:
    """Print lines appended to `path`, reopening it when it rotates or reappears."""
    fh = None
    inode = None
    from_start = not os.path.exists(path)  # a log that appears later is read whole
    try:
        while True:
            try:
                st = os.stat(path)
            except FileNotFoundError:
                st = None
            if st is not None and (fh is None or st.st_ino != inode):
                if fh is not None:
                    fh.close()
                fh = open(path, encoding="utf-8", errors="replace")  # noqa: SIM115
                if inode is None and not from_start:
                    fh.seek(0, os.SEEK_END)  # the tail was printed already
                inode = st.st_ino
            if fh is not None:
                for line in fh.readlines():
                    _emit(line.rstrip("\n"), floor)
                sys.stdout.flush()
            time.sleep(poll_s)
    except KeyboardInterrupt:
        pass
    finally:
        if fh is not None:
            fh.close()
