"""`serve`'s own options, as Annotated aliases, and the group of how the server listens
and answers (ListenOptions). How its model pool is sized is app/serve.PoolOptions (the
application layer builds the pool); the planner's overrides are plan_opts', shared
with `run`.

A flag's spelling and help text live here once (docs/cli.md is the contract).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from inferenceos.cli.gen_opts import lora_option

if TYPE_CHECKING:
    from inferenceos.app.serve import PoolOptions
    from inferenceos.server.settings import ServerSettings

ServeModelArg = Annotated[str, typer.Argument(
    help="Default model: a .gguf path, a registry name (default: built-in Gemma 3 270M)")]
HostOpt = Annotated[str | None, typer.Option("--host", help="Bind address (server.host)")]
PortOpt = Annotated[int | None, typer.Option("--port", help="TCP port (server.port)")]
ApiKeyOpt = Annotated[str | None, typer.Option(
    "--api-key", help="Require this key (server.api_key / INFERENCEOS_SERVER_API_KEY)")]
ServeCtxOpt = Annotated[int, typer.Option(
    "--ctx", min=0, help="Context per sequence (0: auto)")]
ParallelOpt = Annotated[int, typer.Option(
    "--parallel", min=1, help="Sequences batched at once")]
QueueOpt = Annotated[int, typer.Option("--queue", help="Requests queued beyond those")]
KeepAliveOpt = Annotated[float, typer.Option(
    "--keep-alive", help="Seconds an idle model stays loaded (<0: forever)")]
MaxModelsOpt = Annotated[int, typer.Option(
    "--max-models", help="Extra cap on models loaded at once (0: by memory only)")]
MemoryBudgetOpt = Annotated[str | None, typer.Option(
    "--memory-budget", help="Cap on the memory all models may hold (e.g. 8GiB)")]
PinOpt = Annotated[list[str] | None, typer.Option(
    "--pin", help="Keep this model hot: never demoted (repeatable; server.pin)")]
ServeKvPolicyOpt = Annotated[str, typer.Option(
    "--kv-policy", help="KV cache eviction: none, streaming, h2o (requests may pick)")]
NPredictOpt = Annotated[int, typer.Option(
    "--n-predict", help="Tokens a llama.cpp-dialect request generates by default "
    "(-1: until the end; llama-server's -n)")]
ServeSeedOpt = Annotated[int | None, typer.Option(
    "--seed", help="Default sampling seed of llama.cpp-dialect requests")]
AnyModelOpt = Annotated[bool, typer.Option(
    "--any-model", help="An unknown model name reaches the default model (llama-server)")]
AllowHostOpt = Annotated[list[str] | None, typer.Option(
    "--allow-host", help="Extra Host header accepted on loopback (repeatable)")]
CorsOriginOpt = Annotated[list[str] | None, typer.Option(
    "--cors-origin", help="Extra CORS origin allowed (repeatable)")]
MaxBodyOpt = Annotated[float, typer.Option("--max-body-mb", help="Largest body")]
AccessLogOpt = Annotated[bool, typer.Option("--verbose", "-v", help="Access log")]
TlsCertOpt = Annotated[Path | None, typer.Option(
    "--tls-cert", help="Serve HTTPS with this certificate (PEM; with --tls-key)")]
TlsKeyOpt = Annotated[Path | None, typer.Option(
    "--tls-key", help="The certificate's private key (PEM)")]
KvCacheRamOpt = Annotated[str | None, typer.Option(
    "--kv-cache-ram", help="Host RAM each model's KV cache tier may hold (e.g. 2GiB; "
    "0: none; default: an eighth of free RAM, at most 1GiB; kv_cache.ram)")]
KvCacheDiskOpt = Annotated[str | None, typer.Option(
    "--kv-cache-disk", help="Disk the KV cache may fill under <data dir>/kv-cache "
    "(0: none; default: a quarter of free disk, at most 20GiB; kv_cache.disk)")]
AllowMediaUrlsOpt = Annotated[bool, typer.Option(
    "--allow-media-urls", help="Fetch http(s) image URLs in requests (public "
    "addresses only; off: data: URLs and base64 only; server.media_fetch)")]


@dataclass(frozen=True)
class ListenOptions:
    """Where the server listens and how it answers: the flags as given (None: the
    config's value)."""

    host: str | None = None
    port: int | None = None
    api_key: str | None = None
    allow_host: tuple[str, ...] = ()
    cors_origin: tuple[str, ...] = ()
    max_body_mb: float = 8.0
    any_model: bool = False
    n_predict: int = -1
    seed: int | None = None
    allow_media_urls: bool = False
    tls_cert: Path | None = None
    tls_key: Path | None = None
    lora: tuple[str, ...] = ()  # --lora FILE[:SCALE]: the default model's adapters
    reasoning_budget: int = -1  # --reasoning-budget: requests that name none keep it

    def settings(self, cfg: Any, pool: PoolOptions) -> ServerSettings:
        """The ServerSettings: these flags over the config's `server.*` keys, with the
        pool's batch and queue sizes (no default model yet)."""
        from inferenceos.server.settings import ServerSettings

        return ServerSettings(
            host=self.host or cfg.get("server.host"), port=self.port or cfg.get("server.port"),
            api_key=self.api_key if self.api_key is not None else cfg.get("server.api_key"),
            allowed_hosts=self.allow_host, cors_origins=self.cors_origin,
            max_body_bytes=int(self.max_body_mb * 1024 * 1024), max_running=pool.parallel,
            max_waiting=pool.queue, any_model=self.any_model, n_predict=self.n_predict,
            seed=self.seed, lora=lora_option(self.lora),
            reasoning_budget=self.reasoning_budget,
            media_fetch=self.allow_media_urls or bool(cfg.get("server.media_fetch")),
            shutdown_grace_s=float(cfg.get("server.shutdown_grace_s")),
            direct_writes=bool(cfg.get("server.direct_writes")),
            stream_interval_ms=float(cfg.get("server.stream_interval_ms")),
        )
