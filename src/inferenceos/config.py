"""The TOML configuration: known settings, their defaults, validation and env overrides.

The file lives at `config_dir()/config.toml` and holds only what the user changed, as
`[section]` tables (`server.port` is `port` under `[server]`). Every setting can be
overridden by an environment variable named `INFERENCEOS_` + the key in upper case with
dots as underscores (`server.port` → `INFERENCEOS_SERVER_PORT`). Precedence: env var,
then file, then default.

Unknown keys and bad values are rejected with a `ConfigError` that names the key, the
value, where it came from, and what is allowed: a typo never passes silently.
"""

from __future__ import annotations

import difflib
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inferenceos.atomic import write_text_atomic
from inferenceos.errors import InferenceOSError
from inferenceos.paths import config_dir, data_dir

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

ENV_PREFIX = "INFERENCEOS_"


class ConfigError(InferenceOSError):
    """The configuration file, an env var, or a `config set` value is invalid."""

    exit_code = 2


Check = Callable[[Any], "str | None"]


@dataclass(frozen=True)
class Setting:
    """One known setting: its type, default, a one-line help, and an optional check that
    returns what is wrong with a value (None when it is fine)."""

    key: str
    kind: type
    default: Any
    help: str
    check: Check | None = None


def _range(lo: float, hi: float) -> Check:
    return lambda v: None if lo <= v <= hi else f"must be between {lo:g} and {hi:g}"


def _host(v: str) -> str | None:
    return None if v and not any(c.isspace() for c in v) else "must be a host name or IP"


def _error_of(parse: Callable[[str], object], v: str) -> str | None:
    """What `parse` says is wrong with `v` (its InferenceOSError's message), or None
    when it parses: a check for a setting whose parser already explains itself."""
    try:
        parse(v)
    except InferenceOSError as exc:
        return str(exc)
    return None


def _workers(v: str) -> str | None:
    from inferenceos.endpoint import parse_endpoints

    return _error_of(parse_endpoints, v)


def _size(v: str) -> str | None:
    """A size (parse_size) or empty."""
    if not v.strip():
        return None
    from inferenceos.units import parse_size

    return _error_of(parse_size, v)


def _url(v: str) -> str | None:
    return None if v.startswith(("http://", "https://")) else "must start with http(s)://"


SETTINGS: dict[str, Setting] = {s.key: s for s in (
    Setting("server.host", str, "127.0.0.1", "Address the API server binds to", _host),
    Setting("server.port", int, 11434, "TCP port of the API server", _range(1, 65535)),
    Setting("server.api_key", str, "", "Require this key from API clients (empty: none)"),
    Setting("server.pin", str, "", "Models kept hot by `serve`, comma-separated"),
    Setting("server.media_fetch", bool, False,
            "Fetch http(s) image URLs in requests (public addresses only)"),
    Setting("server.shutdown_grace_s", float, 10.0,
            "Seconds streams get to finish on SIGINT/SIGTERM before they are cancelled",
            _range(0, 3600)),
    Setting("server.yield_cpu", bool, True,
            "Where the model's compute threads fill the CPUs and the HTTP side wakes per "
            "token (server.direct_writes off, or TLS), run it at nice +10 so it does not "
            "preempt them (off: equal priority)"),
    Setting("server.direct_writes", bool, True,
            "The model worker writes a plain stream's tokens to the client itself, "
            "instead of waking the HTTP side per token (off: every token through it)"),
    Setting("server.stream_interval_ms", float, 5.0,
            "With direct writes, a stream's tokens that come faster than this are written "
            "together, one send per this many ms at most (0: one send per step)",
            _range(0, 1000)),
    Setting("run.threads", int, 0, "CPU threads for llama.cpp (0: automatic)",
            _range(0, 4096)),
    Setting("run.n_ctx", int, 0, "Context length in tokens (0: from the plan)",
            _range(0, 1 << 24)),
    Setting("plan.kv_quality", str, "q4_0",
            "Lowest KV cache precision a plan may lower to: f16, q8_0 or q4_0",
            lambda v: None if v.strip().lower() in ("f16", "q8_0", "q4_0")
            else "must be f16, q8_0 or q4_0"),
    Setting("plan.draft", str, "auto",
            "Speculative drafter when run and serve name none: auto (the plan chooses "
            "from what each drafter gave the model before), none, ngram, self or a "
            "draft .gguf", lambda v: None if v.strip() else "must not be empty"),
    Setting("models.dir", str, "", "Where models are stored (empty: <data dir>/models)"),
    Setting("hardware.measure_bandwidth", bool, True,
            "Measure RAM and disk bandwidth when profiling the machine"),
    Setting("update.timeout_s", float, 3.0, "Seconds `update` waits for the package index",
            _range(0.1, 30)),
    Setting("update.index_url", str, "https://pypi.org/pypi",
            "Package index JSON API that `update` asks", _url),
    Setting("telemetry.enabled", bool, True,
            "Record runs, requests and loads in the telemetry database"),
    Setting("pressure.enabled", bool, True,
            "serve migrates models down when a device fills up, back up when it frees"),
    Setting("pressure.high", float, 0.95,
            "Device fill (or share of its cap) that is memory pressure", _range(0.05, 1.0)),
    Setting("pressure.low", float, 0.85,
            "Fill below which pressure is over (models migrate back up)", _range(0.0, 1.0)),
    Setting("pressure.dwell_s", float, 10.0,
            "Seconds a signal must stay past a watermark before a migration", _range(0, 3600)),
    Setting("kv_cache.ram", str, "",
            "Host RAM for each model's KV cache tier, e.g. 2GiB (empty: automatic; 0: off)",
            lambda v: _size(v)),
    Setting("kv_cache.disk", str, "",
            "Disk for the KV cache under <data dir>/kv-cache (empty: automatic; 0: off)",
            lambda v: _size(v)),
    Setting("cluster.rpc", str, "",
            "RPC workers every plan may use, comma-separated host:port (inferenceos worker)",
            lambda v: _workers(v)),
)}


def config_path() -> Path:
    """The TOML file (it may not exist yet)."""
    return config_dir() / "config.toml"


def env_var(key: str) -> str:
    """`server.port` → `INFERENCEOS_SERVER_PORT`."""
    return ENV_PREFIX + key.upper().replace(".", "_")


def setting(key: str) -> Setting:
    """The known setting `key`; ConfigError (with a suggestion) when unknown."""
    if key in SETTINGS:
        return SETTINGS[key]
    close = difflib.get_close_matches(key, SETTINGS, n=1)
    hint = f"did you mean '{close[0]}'? " if close else ""
    raise ConfigError(f"unknown config key '{key}'; {hint}known keys: {', '.join(SETTINGS)}")


def validate(key: str, value: Any, origin: str = "value") -> Any:
    """`value` checked against `key`'s type and rule (ints widen to float settings)."""
    s = setting(key)
    ok = isinstance(value, s.kind) and not (s.kind is int and isinstance(value, bool))
    if s.kind is float and isinstance(value, int) and not isinstance(value, bool):
        value, ok = float(value), True
    if not ok:
        raise ConfigError(f"{key} = {value!r} from {origin}: expected {s.kind.__name__}")
    problem = s.check(value) if s.check else None
    if problem:
        raise ConfigError(f"{key} = {value!r} from {origin}: {problem}")
    return value


def parse_value(key: str, text: str, origin: str = "command line") -> Any:
    """A setting's value from text (CLI argument or env var), typed and validated."""
    kind = setting(key).kind
    raw = text.strip()
    try:
        value: Any
        if kind is bool:
            table = {"true": True, "1": True, "yes": True, "on": True,
                     "false": False, "0": False, "no": False, "off": False}
            value = table[raw.lower()]
        elif kind is int:
            value = int(raw)
        elif kind is float:
            value = float(raw)
        else:
            value = text
    except (KeyError, ValueError):
        raise ConfigError(f"{key} = {text!r} from {origin}: expected "
                          f"{'true/false' if kind is bool else kind.__name__}") from None
    return validate(key, value, origin)


def _flatten(table: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for k, v in table.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            flat.update(_flatten(v, key + "."))
        else:
            flat[key] = v
    return flat


def read_file(path: Path | None = None) -> dict[str, Any]:
    """The validated settings stored in the TOML file ({} when it does not exist)."""
    path = path or config_path()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    try:
        table = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from None
    return {k: validate(k, v, str(path)) for k, v in _flatten(table).items()}


def to_toml(values: dict[str, Any]) -> str:
    """Flat `section.name` settings as TOML text, one table per section."""
    tables: dict[str, list[str]] = {}
    for key in sorted(values):
        section, _, name = key.rpartition(".")
        v = values[key]
        text = json.dumps(v, ensure_ascii=False) if isinstance(v, str) else (
            ("true" if v else "false") if isinstance(v, bool) else repr(v))
        tables.setdefault(section, []).append(f"{name} = {text}")
    parts = [f"[{sec}]\n" + "\n".join(lines) + "\n" for sec, lines in tables.items()]
    return "# InferenceOS configuration; see `inferenceos config show`.\n\n" + "\n".join(parts)


def write_file(values: dict[str, Any], path: Path | None = None) -> None:
    """Replace the TOML file with `values` (validated first), atomically."""
    for k, v in values.items():
        validate(k, v)
    write_text_atomic(path or config_path(), to_toml(values))


@dataclass(frozen=True)
class Config:
    """The effective settings and where each came from ("default", "file", "env")."""

    values: dict[str, Any]
    sources: dict[str, str]
    path: Path

    def get(self, key: str) -> Any:
        """The effective value of `key` (ConfigError when the key is unknown)."""
        setting(key)
        return self.values[key]

    def source(self, key: str) -> str:
        setting(key)
        return self.sources[key]

    @property
    def models_dir(self) -> Path:
        """`models.dir`, or `<data dir>/models` when it is empty."""
        raw = self.values["models.dir"]
        return Path(raw).expanduser() if raw else data_dir() / "models"


def load_config(path: Path | None = None) -> Config:
    """Defaults, overlaid by the TOML file, overlaid by INFERENCEOS_* env vars."""
    path = path or config_path()
    values = {k: s.default for k, s in SETTINGS.items()}
    sources = dict.fromkeys(SETTINGS, "default")
    for k, v in read_file(path).items():
        values[k], sources[k] = v, "file"
    for k in SETTINGS:
        raw = os.environ.get(env_var(k))
        if raw is not None:
            values[k], sources[k] = parse_value(k, raw, f"env {env_var(k)}"), "env"
    return Config(values, sources, path)


def set_value(key: str, text: str) -> Any:
    """Parse `text` for `key`, store it in the file, and return the typed value."""
    value = parse_value(key, text)
    stored = read_file()
    stored[key] = value
    write_file(stored)
    return value


def unset_value(key: str) -> bool:
    """Remove `key` from the file (back to its default); False if it was not set."""
    setting(key)
    stored = read_file()
    if key not in stored:
        return False
    del stored[key]
    write_file(stored)
    return True


def models_dir() -> Path:
    """Shortcut: the effective models directory."""
    return load_config().models_dir
