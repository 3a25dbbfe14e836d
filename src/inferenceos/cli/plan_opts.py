"""The planner-override options `run` and `serve` share, and the LoadRequest they make.

Each option keeps its spelling and meaning in both commands (a flag is a contract);
`load_request` turns them, with the config's defaults, into the one LoadRequest the
planner takes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from inferenceos.cli.cluster_opts import budget_caps
from inferenceos.cli.limits import check_threads

if TYPE_CHECKING:
    from inferenceos.plan.entry import LoadRequest

ThreadsOpt = Annotated[int, typer.Option(
    "--threads", callback=check_threads, help="CPU threads (0: auto)")]
GpuLayersOpt = Annotated[int | None, typer.Option(
    "--gpu-layers", help="Layers to offload, overriding the plan (-1: all)")]
BackendOpt = Annotated[str | None, typer.Option(
    "--backend", help="Run on this device only: cpu, or a GPU name (CUDA0, Metal...)")]
CacheTypeKOpt = Annotated[str | None, typer.Option(
    "--cache-type-k", help="K cache type: f16, q8_0, q4_0 (default: planned)")]
CacheTypeVOpt = Annotated[str | None, typer.Option(
    "--cache-type-v", help="V cache type: f16, q8_0, q4_0 (needs flash attention)")]
PolicyOpt = Annotated[str, typer.Option(
    "--policy", help="Planner objective: latency, throughput, capacity, balanced, adaptive")]
def _check_kv_quality(value: str | None) -> str | None:
    if value is None:
        return None
    v = value.strip().lower()
    if v not in ("f16", "q8_0", "q4_0"):
        raise typer.BadParameter(f"{value!r}: one of f16, q8_0, q4_0")
    return v


KvQualityOpt = Annotated[str | None, typer.Option(
    "--kv-quality", callback=_check_kv_quality,
    help="Lowest KV cache precision the plan may lower to when memory is short: f16, "
    "q8_0, q4_0 (default: the config's plan.kv_quality, q4_0)")]
def _check_flash_attn(value: str) -> str:
    v = value.strip().lower()
    if v not in ("on", "off", "auto"):
        raise typer.BadParameter(f"{value!r}: one of on, off, auto")
    return v


FlashAttnOpt = Annotated[str, typer.Option(
    "--flash-attn", callback=_check_flash_attn,
    help="Flash attention: on, off, auto (the plan's choice: on, except off for served "
    "conversations on the CPU alone)")]


def flash_attn_choice(value: str, reads_attention: bool = False) -> bool | None:
    """--flash-attn as LoadRequest.flash_attn (None: auto). A KV policy that reads
    attention probabilities (H2O) needs it off: UsageError when it was asked on."""
    from inferenceos.errors import UsageError

    asked = {"on": True, "off": False}.get(value.strip().lower())
    if reads_attention and asked:
        raise UsageError("this KV policy reads attention probabilities, which llama.cpp "
                         "has only without flash attention: drop --flash-attn on")
    return False if reads_attention else asked


DraftOpt = Annotated[str | None, typer.Option(
    "--draft", help="Speculative decoding: auto (the plan chooses from what each drafter "
    "gave this model before), ngram, self, a draft model .gguf, or none")]
MmprojOpt = Annotated[str | None, typer.Option(
    "--mmproj", help="Multimodal projector .gguf (default: the one beside the model or "
    "recorded with it; 'none': text only)")]


def draft_choice(draft: str | None) -> str:
    """`--draft` as given, else the config's `plan.draft` (default auto)."""
    from inferenceos.config import load_config

    return (draft or str(load_config().get("plan.draft") or "auto")).strip()


def load_request(
    *, ctx: int, threads: int, gpu_layers: int | None, backend: str | None,
    cache_type_k: str | None, cache_type_v: str | None, policy: str,
    rpc: list[str] | None, ram: str | None, gpu_memory: list[str] | None,
    kv_quality: str | None = None, **more: Any,
) -> LoadRequest:
    """The LoadRequest for these options; 0 context or threads fall back to the config's
    `run.n_ctx` / `run.threads` (then to the plan). `more`: other LoadRequest fields."""
    from inferenceos.config import load_config
    from inferenceos.plan.entry import LoadRequest

    cfg = load_config()
    return LoadRequest(
        n_ctx=ctx or int(cfg.get("run.n_ctx") or 0),
        threads=threads or int(cfg.get("run.threads") or 0),
        gpu_layers=gpu_layers, backend=backend, type_k=cache_type_k, type_v=cache_type_v,
        policy=policy, kv_quality=kv_quality, **budget_caps(rpc, ram, gpu_memory), **more,
    )
