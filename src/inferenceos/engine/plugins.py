"""Plugins by entry point: the one lookup the KV policies and the drafters share.

A package registers a class under a group (`inferenceos.kv_policies`,
`inferenceos.drafters`) in its metadata; this package registers its own built-ins the
same way, and passes them as `builtin` too, so they work from a source tree that was
never installed."""

from __future__ import annotations

from collections.abc import Mapping
from importlib.metadata import entry_points
from typing import Any

from inferenceos.errors import UsageError


def registered(group: str) -> dict[str, str]:
    """Installed names in `group` → 'module:Class'."""
    return {ep.name: ep.value for ep in entry_points(group=group)}


def find(group: str, name: str, builtin: Mapping[str, Any], what: str, also: str = "") -> Any:
    """The class registered as `name` in `group`, else `builtin[name]`; UsageError
    naming every known choice (and `also`) when neither has it (`what`: "KV policy")."""
    for ep in entry_points(group=group):
        if ep.name == name:
            return ep.load()
    if name not in builtin:
        known = sorted(set(registered(group)) | set(builtin))
        raise UsageError(f"unknown {what} {name!r} (available: {', '.join(known)}{also})")
    return builtin[name]
