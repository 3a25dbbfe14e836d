"""Server settings: one frozen dataclass, filled by `serve` from the CLI and config."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from inferenceos.media.limits import MediaLimits

LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


def is_loopback(host: str) -> bool:
    """True for `localhost`, 127.0.0.0/8 and ::1 (brackets and zone ids tolerated)."""
    h = host.strip("[]").split("%", 1)[0].lower().rstrip(".")
    if h in LOOPBACK_NAMES or h.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class ServerSettings:
    """How the API server behaves. Defaults are the safe ones."""

    host: str = "127.0.0.1"
    port: int = 11434
    api_key: str = ""  # empty: no authentication
    # CORS: origins allowed besides local ones (http(s)://localhost|127.x|[::1][:port])
    cors_origins: tuple[str, ...] = ()
    cors_allow_local: bool = True
    # Host names accepted besides loopback ones while bound to loopback (DNS rebinding)
    allowed_hosts: tuple[str, ...] = ()
    max_body_bytes: int = 8 * 1024 * 1024
    max_running: int = 4  # requests inside the engine at once
    max_waiting: int = 32  # requests queued behind them; beyond: 429
    retry_after_s: int = 2
    shutdown_grace_s: float = 10.0  # streams get this long to finish on shutdown
    default_model: str = ""  # used when a request names no model
    any_model: bool = False  # an unknown model name reaches default_model (llama-server)
    n_predict: int = -1  # llama.cpp routes: tokens to predict when a request sets none
    seed: int | None = None  # llama.cpp routes: the seed when a request sets none (random)
    # tokens of reasoning a reply may write when its request names no budget (serve
    # --reasoning-budget): -1 unrestricted, 0 thinking off, N closed after N tokens
    reasoning_budget: int = -1
    # media in requests: limits on every image / clip, and whether http(s) URLs are
    # fetched (off: only data: URLs and base64; `serve --allow-media-urls`)
    media_limits: MediaLimits = field(default_factory=MediaLimits)
    media_fetch: bool = False
    # `serve MODEL --lora FILE[:SCALE]`: LoRA adapters (file, global scale) of the
    # default model, llama-server's /lora-adapters list (server/presets.py)
    lora: tuple[tuple[str, float], ...] = ()
    # a plain stream's tokens written by the model worker itself (server/direct_stream.py)
    direct_writes: bool = True
    # ... and written together while they come faster than this (engine/worker/direct.py)
    stream_interval_ms: float = 5.0
    version: str = field(default="")

    @property
    def on_loopback(self) -> bool:
        return is_loopback(self.host)
