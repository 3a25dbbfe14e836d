"""`inferenceos serve [MODEL]`: the OpenAI- and Ollama-compatible API server."""

from __future__ import annotations

import dataclasses
import logging
import ssl
from pathlib import Path
from typing import TYPE_CHECKING

from inferenceos.app.serve import PoolOptions, model_pool
from inferenceos.cli import plan_opts as po
from inferenceos.cli.cluster_opts import GpuCapOpt, RamCapOpt, RpcOpt
from inferenceos.cli.console import err
from inferenceos.cli.gen_opts import LoadOptions, LoraOpt, ReasoningBudgetOpt
from inferenceos.cli.serve_opts import (
    AccessLogOpt,
    AllowHostOpt,
    AllowMediaUrlsOpt,
    AnyModelOpt,
    ApiKeyOpt,
    CorsOriginOpt,
    HostOpt,
    KeepAliveOpt,
    KvCacheDiskOpt,
    KvCacheRamOpt,
    ListenOptions,
    MaxBodyOpt,
    MaxModelsOpt,
    MemoryBudgetOpt,
    NPredictOpt,
    ParallelOpt,
    PinOpt,
    PortOpt,
    QueueOpt,
    ServeCtxOpt,
    ServeKvPolicyOpt,
    ServeModelArg,
    ServeSeedOpt,
    TlsCertOpt,
    TlsKeyOpt,
)

if TYPE_CHECKING:
    from inferenceos.config import Config
    from inferenceos.server.settings import ServerSettings

_LOCAL_WARNING = (
    "WARNING: serving on {host} without an API key: anyone who can reach this machine "
    "can use the models, pull, copy and delete them. Set --api-key (or server.api_key)."
)
_TLS_WARNING = (
    "WARNING: serving on {host} without TLS: prompts, answers{key} cross the network in "
    "clear text. Use --tls-cert and --tls-key (or a TLS proxy in front)."
)


def _tls_files(cert: Path | None, key: Path | None) -> tuple[str, str] | tuple[None, None]:
    """Both TLS files or neither; each must be a readable file (UsageError otherwise)."""
    from inferenceos.errors import UsageError

    if (cert is None) != (key is None):
        raise UsageError("--tls-cert and --tls-key go together: give both PEM files")
    if cert is None or key is None:
        return None, None
    for flag, f in (("--tls-cert", cert), ("--tls-key", key)):
        if not f.expanduser().is_file():
            raise UsageError(f"{flag}: no such file: {f}")
    files = str(cert.expanduser()), str(key.expanduser())
    try:  # load them now: a bad pair fails here in one line, not as uvicorn's traceback
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(*files)
    except (ssl.SSLError, OSError) as exc:
        raise UsageError(f"--tls-cert/--tls-key: not a usable PEM certificate and key: "
                         f"{exc.strerror or exc}") from None
    return files


def _default_model(model: str, catalog: object, mmproj: str | None = None) -> str:
    """The model requests default to: a served file, a registry name, or the built-in.
    `mmproj` (--mmproj): its projector instead of the one found beside it or recorded
    ("none": text only)."""
    from inferenceos.errors import UsageError
    from inferenceos.model.default_model import DEFAULT_MODEL_NAME
    from inferenceos.registry.catalog import Catalog
    from inferenceos.registry.store import AUTO

    assert isinstance(catalog, Catalog)
    if model and (model.endswith(".gguf") or Path(model).expanduser().is_file()):
        served = catalog.add_file(Path(model), mmproj=mmproj or AUTO)
        _register_in_place(catalog, served)
        return served.name
    if model:
        known = catalog.resolve(model)  # fails early on an unknown name
        if mmproj:  # the same file under the same name, with the projector asked for
            catalog.add_file(known.path, name=known.name, mmproj=mmproj)
        return known.name
    if mmproj:
        raise UsageError("--mmproj goes with a model: serve MODEL --mmproj FILE")
    if catalog.store.find(DEFAULT_MODEL_NAME) is None:
        err.print("Registering the built-in model (Gemma 3 270M)...")
        catalog.store.pull(DEFAULT_MODEL_NAME)
    return catalog.resolve(DEFAULT_MODEL_NAME).name


def _register_in_place(catalog: object, served: object) -> None:
    """A served file is registered in place under the name it answers to, so `models
    show NAME` (and every command taking a name) finds the model `serve` names."""
    from inferenceos.errors import InferenceOSError
    from inferenceos.registry.catalog import Catalog, ResolvedModel

    assert isinstance(catalog, Catalog) and isinstance(served, ResolvedModel)
    try:
        entry = catalog.store.find(served.name)
        if entry is None:
            catalog.store.register_in_place(served.path, served.name, served.digest, "serve",
                                            projector=served.mmproj)
        elif entry.path.resolve() != served.path.resolve():
            err.print(f"note: the registry's {served.name} is another file; the served "
                      f"file answers to that name here", markup=False)
    except (InferenceOSError, OSError) as exc:  # serving never depends on the registry
        err.print(f"note: {served.name} is served but not registered ({exc})", markup=False)


def _default_plan(manager: object, name: str, show: bool) -> object | None:
    """The default model's plan before any request loads it (planning only), its line
    printed when `show` (a pinned model prints it as it loads); None when it cannot be
    planned here (said in one line: requests will say it again)."""
    from inferenceos.errors import InferenceOSError
    from inferenceos.registry.manager import ModelManager

    assert isinstance(manager, ModelManager)
    try:
        plan = manager.plan_for(name)
    except InferenceOSError as exc:
        if show:  # a pinned model's load says it and stops serve
            err.print(f"{name}: cannot be planned here: {exc}", markup=False)
        return None
    if show:
        err.print(f"{name}: {plan.summary()}", style="dim", markup=False)
    return plan


def _share_cpus(plan: object) -> None:
    """Lower the HTTP side's threads below the worker's when `plan` (the default
    model's) fills the CPUs (hardware/cpu_share.py). Before any worker or serving
    thread starts."""
    from inferenceos.hardware import cpu_share
    from inferenceos.plan.plan import Plan

    assert isinstance(plan, Plan)
    cpu_share.configure(cpu_share.http_nice(plan.params().n_threads,
                                            plan.placement.gpu_layers > 0))


def _yields(cfg: Config, tls: bool) -> bool:
    """Whether the HTTP side gives way to the compute threads (`server.yield_cpu`): only
    where it still wakes once per token, i.e. when the worker cannot write the streams
    (`server.direct_writes` off, or TLS). With direct writes its work is per request,
    and lowered it made each first token wait for the worker's gaps: at 8 streams of the
    tiny model 0.892 of llama-server against 1.002 at equal priority, 32 streams 1.059
    against 1.134, in the same rounds (docs/engine.md, "Who runs first")."""
    return bool(cfg.get("server.yield_cpu")) and (tls or not cfg.get("server.direct_writes"))


def _stderr_logging(verbose: bool) -> None:
    """What the server prints on stderr: warnings, and with -v the INFO lines too (the
    access log, one JSON line per response, and the server's events), as `ollama serve`
    and llama-server users expect. Our loggers' warnings already reach stderr through
    `logs.setup` (once: this handler leaves them out); the root handler is only added
    when none is configured (an embedding program keeps its own)."""
    root = logging.getLogger()
    if root.handlers:
        return

    def keep(record: logging.LogRecord) -> bool:
        ours = record.name == "inferenceos" or record.name.startswith("inferenceos.")
        return not ours or (verbose and record.levelno < logging.WARNING)

    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    handler.addFilter(keep)
    root.addHandler(handler)
    root.setLevel(logging.INFO if verbose else logging.WARNING)


def _load_pinned(manager: object) -> None:
    """Load the pinned models before the server listens: a pinned model is hot when the
    server first answers (its plan line prints as it loads). One that cannot be loaded
    stops `serve` with the reason (InferenceOSError), after unloading the others."""
    from inferenceos.errors import InferenceOSError
    from inferenceos.registry.manager import ModelManager

    assert isinstance(manager, ModelManager)
    current = [""]

    def starting(name: str) -> None:
        current[0] = name
        err.print(f"loading pinned model {name}...", style="dim", markup=False)

    try:
        manager.load_pinned(on_start=starting)
    except InferenceOSError as exc:
        manager.close()
        raise InferenceOSError(f"cannot load the pinned model {current[0]}: {exc}") from None
    except BaseException:  # Ctrl-C while loading: no worker left behind
        manager.close()
        raise


def serve(
    model: ServeModelArg = "", host: HostOpt = None, port: PortOpt = None,
    api_key: ApiKeyOpt = None, ctx: ServeCtxOpt = 0, threads: po.ThreadsOpt = 0,
    parallel: ParallelOpt = 4, queue: QueueOpt = 32, keep_alive: KeepAliveOpt = 300.0,
    max_models: MaxModelsOpt = 0, memory_budget: MemoryBudgetOpt = None, pin: PinOpt = None,
    gpu_layers: po.GpuLayersOpt = None, backend: po.BackendOpt = None,
    cache_type_k: po.CacheTypeKOpt = None, cache_type_v: po.CacheTypeVOpt = None,
    flash_attn: po.FlashAttnOpt = "auto", policy: po.PolicyOpt = "balanced",
    kv_policy: ServeKvPolicyOpt = "none", draft: po.DraftOpt = None,
    n_predict: NPredictOpt = -1, seed: ServeSeedOpt = None, any_model: AnyModelOpt = False,
    allow_host: AllowHostOpt = None, cors_origin: CorsOriginOpt = None,
    max_body_mb: MaxBodyOpt = 8.0, verbose: AccessLogOpt = False, rpc: RpcOpt = None,
    ram: RamCapOpt = None, gpu_memory: GpuCapOpt = None, tls_cert: TlsCertOpt = None,
    tls_key: TlsKeyOpt = None, mmproj: po.MmprojOpt = None,
    kv_cache_ram: KvCacheRamOpt = None, kv_cache_disk: KvCacheDiskOpt = None,
    allow_media_urls: AllowMediaUrlsOpt = False, lora: LoraOpt = None,
    reasoning_budget: ReasoningBudgetOpt = -1,
) -> None:
    """Serve models over the OpenAI and Ollama APIs (loopback only unless told)."""
    listen = ListenOptions(host, port, api_key, tuple(allow_host or ()),
                           tuple(cors_origin or ()), max_body_mb, any_model, n_predict,
                           seed, allow_media_urls, tls_cert, tls_key, tuple(lora or ()),
                           reasoning_budget)
    pool = PoolOptions(parallel, queue, keep_alive, max_models, memory_budget,
                       tuple(pin or ()), kv_cache_ram, kv_cache_disk)
    load = LoadOptions(ctx=ctx, threads=threads, gpu_layers=gpu_layers, backend=backend,
                       cache_type_k=cache_type_k, cache_type_v=cache_type_v,
                       flash_attn=flash_attn, policy=policy, kv_policy=kv_policy, rpc=rpc,
                       ram=ram, gpu_memory=gpu_memory, draft=draft, mmproj=mmproj)
    _serve(model, listen, pool, load, verbose)


def _serve(model: str, listen: ListenOptions, pool: PoolOptions, load: LoadOptions,
           verbose: bool) -> None:
    """Settings, default model, model pool, the checks before listening, the pinned
    models loaded; then serve until stopped and exit 0 once drained. Each failure
    before listening is an InferenceOSError (UsageError for options), in that order."""
    from inferenceos.config import load_config
    from inferenceos.registry.catalog import Catalog
    from inferenceos.registry.store import ModelStore

    cfg = load_config()
    settings = listen.settings(cfg, pool)
    catalog = Catalog(ModelStore(cfg.models_dir))
    settings = dataclasses.replace(
        settings, default_model=_default_model(model, catalog, load.mmproj))
    manager, pins = model_pool(
        cfg, catalog, pool, load.request, kv_policy=load.kv_policy,
        on_load=lambda name, plan: err.print(f"{name}: {plan.summary()}", markup=False),
        lora=settings.lora, default_model=settings.default_model)
    cert_file, key_file = _tls_files(listen.tls_cert, listen.tls_key)
    _check_listening(settings, cert_file is not None, verbose)
    plan = _default_plan(manager, settings.default_model,
                         show=settings.default_model not in pins)
    if plan is not None and _yields(cfg, cert_file is not None):
        _share_cpus(plan)
    _load_pinned(manager)
    scheme = "https" if cert_file else "http"
    err.print(f"InferenceOS API on {scheme}://{settings.host}:{settings.port} "
              f"(default model {settings.default_model}; OpenAI at /v1, Ollama at /api)")
    from inferenceos.server.app import create_app
    from inferenceos.server.runner import make_server

    server = make_server(create_app(settings, catalog, manager), settings.host, settings.port,
                         grace_s=settings.shutdown_grace_s, tls_cert=cert_file,
                         tls_key=key_file)
    server.run()
    from inferenceos.interrupt import exit_now

    exit_now(0)  # drained and closed: what is left of the exit is the interpreter's


def _check_listening(settings: ServerSettings, tls: bool, verbose: bool) -> None:
    """Warn (in red) when serving off loopback without a key or without TLS; set up the
    server's stderr logging; UsageError when the address cannot be bound now."""
    from inferenceos.errors import UsageError
    from inferenceos.net import bind_error

    if not settings.on_loopback and not settings.api_key:
        err.print(_LOCAL_WARNING.format(host=settings.host), style="bold red")
    if not settings.on_loopback and not tls:
        err.print(_TLS_WARNING.format(
            host=settings.host, key=" and the API key" if settings.api_key else ""),
            style="bold red")
    _stderr_logging(verbose)
    problem = bind_error(settings.host, settings.port)
    if problem is not None:
        raise UsageError(
            f"cannot listen on {settings.host}:{settings.port}: {problem.strerror or problem} "
            "(another InferenceOS or Ollama server? choose one with --port)"
        )
