"""Where InferenceOS keeps its files.

By default the platform's user directories (platformdirs). `INFERENCEOS_HOME` puts
everything under one folder instead (tests use it to isolate themselves); the single
`INFERENCEOS_CACHE_DIR`, `INFERENCEOS_DATA_DIR` and `INFERENCEOS_CONFIG_DIR` variables
override one location each. Directories are created on first use.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import platformdirs

APP_NAME = "inferenceos"


def _resolve(env_var: str, home_sub: str, default: Callable[[str], str]) -> Path:
    """`env_var`, else `INFERENCEOS_HOME/home_sub`, else the platform's `default(APP_NAME)`
    (asked only then: platformdirs costs more than the rest, and the telemetry of every
    served request asks for the data dir)."""
    explicit = os.environ.get(env_var)
    if explicit:
        return Path(explicit).expanduser()
    home = os.environ.get("INFERENCEOS_HOME")
    if home:
        return Path(home).expanduser() / home_sub
    return Path(default(APP_NAME))


def cache_dir() -> Path:
    """Re-creatable files: the assembled default model, digests, build products."""
    return _resolve("INFERENCEOS_CACHE_DIR", "cache", platformdirs.user_cache_dir)


def data_dir() -> Path:
    """Files worth keeping: models, telemetry database, hardware profile."""
    return _resolve("INFERENCEOS_DATA_DIR", "data", platformdirs.user_data_dir)


def config_dir() -> Path:
    """The TOML configuration."""
    return _resolve("INFERENCEOS_CONFIG_DIR", "config", platformdirs.user_config_dir)


def ensure_dir(path: Path) -> Path:
    """Create `path` (and parents) if missing and return it."""
    path.mkdir(parents=True, exist_ok=True)
    return path
