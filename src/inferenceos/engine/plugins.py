"""Plugins by entry point: the one lookup the KV policies and the drafters share.

A package registers a class under a group (`inferenceos.kv_policies`,
`inferenceos.drafters`) in its metadata; this package registers its own built-ins the
same way, and passes them as `builtin` too, so they work from a source tree that was
never installed."""

from __future__ import annotations

import functools
import sys
from collections.abc import Mapping
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from inferenceos.errors import UsageError


def _entries(group: str) -> tuple[EntryPoint, ...]:
    """The installed entry points of `group`, read once per import path: the scan of
    every distribution's metadata took 25-70 ms, paid by each scheduler a wake (warm →
    hot) builds and by each request naming a KV policy. A plugin installed into a
    folder already on the path is seen by the next process."""
    return _scan(group, tuple(sys.path))


@functools.cache
def _scan(group: str, path: tuple[str, ...]) -> tuple[EntryPoint, ...]:
    return tuple(entry_points(group=group))


def registered(group: str) -> dict[str, str]:
    """Installed names in `group` → 'module:Class'."""
    return {ep.name: ep.value for ep in _entries(group)}


def find(group: str, name: str, builtin: Mapping[str, Any], what: str, also: str = "") -> Any:
    """The class registered as `name` in `group`, else `builtin[name]`; UsageError
    naming every known choice (and `also`) when neither has it (`what`: "KV policy")."""
    for ep in _entries(group):
        if ep.name == name:
            return ep.load()
    if name not in builtin:
        known = sorted(set(registered(group)) | set(builtin))
        raise UsageError(f"unknown {what} {name!r} (available: {', '.join(known)}{also})")
    return builtin[name]
