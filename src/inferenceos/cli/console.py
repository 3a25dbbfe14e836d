"""Shared Rich consoles and the one-line error format used by every command."""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console
from rich.markup import escape

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


_CONTROL = dict.fromkeys(c for c in range(32) if c not in (9,)) | {127: None}


def clean_text(text: str) -> str:
    """Untrusted text with its control characters removed, for output that Rich does not
    parse as markup (a `Text`, or `markup=False`)."""
    return text.translate(_CONTROL)


def safe_text(text: str) -> str:
    """Text from an untrusted source (a GGUF file), made inert for the terminal.

    Control characters (ESC sequences could rewrite the screen or set the window title)
    are removed and Rich markup is escaped.
    """
    return escape(clean_text(text))


def print_error(message: str) -> None:
    """Print `message` as one line on stderr, prefixed `error:`."""
    one_line = " ".join(message.split())
    err.print(f"[bold red]error:[/] {escape(one_line)}", markup=True, highlight=False)


def print_json(data: Any) -> None:
    """Print `data` as JSON on stdout, unstyled, so it can be piped."""
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False) + "\n")
    sys.stdout.flush()
