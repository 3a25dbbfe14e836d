"""`inferenceos serve [MODEL]`: the OpenAI- and Ollama-compatible API server."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Annotated

import typer

from inferenceos.cli.console import err
from inferenceos.cli.limits import check_threads

_LOCAL_WARNING = (
    "WARNING: serving on {host} without an API key: anyone who can reach this machine "
    "can use the models, pull, copy and delete them. Set --api-key (or server.api_key)."
)


def _default_model(model: str, catalog: object) -> str:
    """The model requests default to: a served file, a registry name, or the built-in."""
    from inferenceos.model.default_model import DEFAULT_MODEL_NAME
    from inferenceos.registry.catalog import Catalog

    assert isinstance(catalog, Catalog)
    if model and (model.endswith(".gguf") or Path(model).expanduser().is_file()):
        return catalog.add_file(Path(model)).name
    if model:
        return catalog.resolve(model).name  # fails early on an unknown name
    if catalog.store.find(DEFAULT_MODEL_NAME) is None:
        err.print("Registering the built-in model (Gemma 3 270M)...")
        catalog.store.pull(DEFAULT_MODEL_NAME)
    return catalog.resolve(DEFAULT_MODEL_NAME).name


def serve(
    model: Annotated[str, typer.Argument(
        help="Default model: a .gguf path, a registry name (default: built-in Gemma 3 270M)"
    )] = "",
    host: Annotated[str | None, typer.Option("--host", help="Bind address (server.host)")] = None,
    port: Annotated[int | None, typer.Option("--port", help="TCP port (server.port)")] = None,
    api_key: Annotated[str | None, typer.Option(
        "--api-key", help="Require this key (server.api_key / INFERENCEOS_SERVER_API_KEY)"
    )] = None,
    ctx: Annotated[int, typer.Option(
        "--ctx", min=0, help="Context per sequence (0: auto)")] = 0,
    threads: Annotated[int, typer.Option(
        "--threads", callback=check_threads, help="CPU threads (0: auto)")] = 0,
    parallel: Annotated[int, typer.Option(
        "--parallel", min=1, help="Sequences batched at once")] = 4,
    queue: Annotated[int, typer.Option("--queue", help="Requests queued beyond those")] = 32,
    keep_alive: Annotated[float, typer.Option(
        "--keep-alive", help="Seconds an idle model stays loaded (<0: forever)")] = 300.0,
    max_models: Annotated[int, typer.Option("--max-models", help="Models loaded at once")] = 3,
    allow_host: Annotated[list[str] | None, typer.Option(
        "--allow-host", help="Extra Host header accepted on loopback (repeatable)")] = None,
    cors_origin: Annotated[list[str] | None, typer.Option(
        "--cors-origin", help="Extra CORS origin allowed (repeatable)")] = None,
    max_body_mb: Annotated[float, typer.Option("--max-body-mb", help="Largest body")] = 8.0,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Access log")] = False,
) -> None:
    """Serve models over the OpenAI and Ollama APIs (loopback only unless told)."""
    from inferenceos.config import load_config
    from inferenceos.engine.session import LoadSettings
    from inferenceos.errors import UsageError
    from inferenceos.hardware.memory import detect_memory
    from inferenceos.net import bind_error
    from inferenceos.registry.catalog import Catalog
    from inferenceos.registry.loaded import ModelManager, engine_factory
    from inferenceos.registry.store import ModelStore
    from inferenceos.server.app import create_app
    from inferenceos.server.runner import make_server
    from inferenceos.server.settings import ServerSettings

    cfg = load_config()
    settings = ServerSettings(
        host=host or cfg.get("server.host"), port=port or cfg.get("server.port"),
        api_key=api_key if api_key is not None else cfg.get("server.api_key"),
        allowed_hosts=tuple(allow_host or ()), cors_origins=tuple(cors_origin or ()),
        max_body_bytes=int(max_body_mb * 1024 * 1024), max_running=parallel,
        max_waiting=queue,
    )
    catalog = Catalog(ModelStore(cfg.models_dir))
    settings = dataclasses.replace(settings, default_model=_default_model(model, catalog))
    budget = int(detect_memory().usable_bytes * 0.9) or None
    manager = ModelManager(
        catalog.resolve, factory=engine_factory(parallel, queue),
        base_settings=LoadSettings(n_ctx=ctx or cfg.get("run.n_ctx"),
                                   n_threads=threads or cfg.get("run.threads")),
        keep_alive_s=keep_alive, max_loaded=max_models, memory_budget_bytes=budget,
        slots=parallel,
    )
    if not settings.on_loopback and not settings.api_key:
        err.print(_LOCAL_WARNING.format(host=settings.host), style="bold red")
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(message)s")
    problem = bind_error(settings.host, settings.port)
    if problem is not None:
        raise UsageError(
            f"cannot listen on {settings.host}:{settings.port}: {problem.strerror or problem} "
            "(another InferenceOS or Ollama server? choose one with --port)"
        )
    err.print(f"InferenceOS API on http://{settings.host}:{settings.port} "
              f"(default model {settings.default_model}; OpenAI at /v1, Ollama at /api)")
    server = make_server(create_app(settings, catalog, manager), settings.host, settings.port,
                         grace_s=settings.shutdown_grace_s)
    server.run()
