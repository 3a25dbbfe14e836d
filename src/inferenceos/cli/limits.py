"""Option checks shared by the commands that load a model (`run`, `serve`, `chat`).

Typer's `min=` catches negative counts; a thread count also has a ceiling that depends on
the machine: more than a few threads per logical CPU only slows llama.cpp down, and a
typo (`--threads 1000` for 10) should be an error, not a machine brought to its knees.
"""

from __future__ import annotations

import os

import typer

THREADS_PER_CPU = 4  # the most oversubscription we accept


def max_threads() -> int:
    """The largest --threads accepted on this machine."""
    return THREADS_PER_CPU * (os.cpu_count() or 1)


def check_threads(value: int) -> int:
    """Typer callback for --threads: 0 (automatic) up to max_threads()."""
    if value < 0:
        raise typer.BadParameter(f"{value} is negative; use 0 (automatic) or a count of threads")
    if value > max_threads():
        cpus = os.cpu_count() or 1
        raise typer.BadParameter(f"{value} threads on a machine with {cpus} logical CPUs; "
                                 f"use 0 (automatic) or at most {max_threads()}")
    return value
