"""The cached profile: one JSON file in the data dir, reused while the fingerprint holds.

`get_profile()` is what callers use. A cached profile is returned when its fingerprint
matches the machine now and it was written by this schema version; otherwise (or with
`refresh=True`) the machine is probed again and the cache rewritten atomically. A file
lock keeps two processes from measuring bandwidth at the same time (they would disturb
each other's figures); the second waits and then reuses the first one's result.
"""

from __future__ import annotations

import fcntl
from pathlib import Path
from typing import NamedTuple

from inferenceos.atomic import read_json, write_json_atomic
from inferenceos.hardware.fingerprint import current_fingerprint
from inferenceos.hardware.profile import SCHEMA_VERSION, HardwareProfile
from inferenceos.paths import data_dir, ensure_dir


class ProfileResult(NamedTuple):
    profile: HardwareProfile
    from_cache: bool


def profile_dir() -> Path:
    """Where hardware profiles are kept."""
    return data_dir() / "hardware"


def profile_path() -> Path:
    return profile_dir() / "profile.json"


def load_cached(fingerprint: str | None = None) -> HardwareProfile | None:
    """The stored profile if readable, of this schema and (when given) `fingerprint`."""
    data = read_json(profile_path(), None)
    if not isinstance(data, dict) or data.get("schema_version") != SCHEMA_VERSION:
        return None
    try:
        profile = HardwareProfile.from_json(data)
    except (KeyError, TypeError, ValueError):
        return None
    if fingerprint is not None and profile.fingerprint != fingerprint:
        return None
    return profile


def save(profile: HardwareProfile) -> None:
    """Write `profile` as the cached one (atomically)."""
    write_json_atomic(profile_path(), profile.to_json())


def get_profile(refresh: bool = False, models_dir: Path | None = None,
                measure: bool | None = None) -> ProfileResult:
    """The machine's profile: cached when still valid, else freshly collected and saved.

    `models_dir` and `measure` default to the `models.dir` and
    `hardware.measure_bandwidth` settings.
    """
    if models_dir is None or measure is None:
        from inferenceos.config import load_config

        cfg = load_config()
        models_dir = models_dir or cfg.models_dir
        measure = cfg.get("hardware.measure_bandwidth") if measure is None else measure
    fingerprint = current_fingerprint(models_dir)
    if not refresh and (cached := _usable(load_cached(fingerprint), measure)) is not None:
        return ProfileResult(cached, True)
    from inferenceos.hardware.collect import collect_profile

    with open(ensure_dir(profile_dir()) / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not refresh and (cached := _usable(load_cached(fingerprint), measure)) is not None:
            return ProfileResult(cached, True)  # another process just collected it
        profile = collect_profile(models_dir, measure=bool(measure))
        save(profile)
    return ProfileResult(profile, False)


def _usable(profile: HardwareProfile | None, measure: bool | None) -> HardwareProfile | None:
    """`profile`, unless bandwidth is wanted and it was collected without measuring
    (`seconds` stays 0 then; a measurement that failed still took time)."""
    if profile is None or not measure:
        return profile
    return None if profile.bandwidth.seconds == 0 else profile
