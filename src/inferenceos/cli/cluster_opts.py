"""The `--rpc` option shared by run, serve, simulate, placement and hardware, and the
`--ram` / `--gpu-memory` budgets shared by run, serve, simulate and placement (each
applied to the machine by plan.devices.apply_overrides)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

RpcOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--rpc",
        help="Workers to use (inferenceos worker): host:port[,host:port...] "
        "(default: config cluster.rpc)",
    ),
]


def rpc_workers(values: list[str] | None) -> tuple[str, ...]:
    """The workers asked for: `--rpc` values, else the `cluster.rpc` setting; each
    checked (UsageError for a bad address), as "host:port[=SIZE]" strings."""
    from inferenceos.endpoint import parse_endpoints

    if not values:
        from inferenceos.config import load_config

        values = [str(load_config().get("cluster.rpc") or "")]
    eps = parse_endpoints([v for v in values if v])
    return tuple(
        e.address + (f"/{e.info_port}" if e.info_port else "")
        + (f"={e.mem_cap}" if e.mem_cap else "")
        for e in eps
    )


def budget_caps(
    rpc: list[str] | None, ram: str | None, gpu_memory: list[str] | None
) -> dict[str, Any]:
    """LoadRequest fields for `--rpc`, `--ram` and `--gpu-memory` (run and serve)."""
    ram_bytes, gpu_bytes = memory_caps(ram, gpu_memory)
    return {"rpc": rpc_workers(rpc), "ram": ram_bytes, "gpu_memory": gpu_bytes}


def memory_caps(
    ram: str | None, gpu_memory: list[str] | None
) -> tuple[int | None, tuple[int, ...] | None]:
    """`--ram` and `--gpu-memory` in bytes (None: not given); UsageError for a bad size."""
    from inferenceos.units import parse_size

    return (parse_size(ram) if ram else None,
            tuple(parse_size(g) for g in gpu_memory) if gpu_memory else None)


RamCapOpt = Annotated[
    str | None,
    typer.Option("--ram", help="RAM budget for plans, e.g. 8GiB (leave room for other programs)"),
]
GpuCapOpt = Annotated[
    list[str] | None,
    typer.Option("--gpu-memory", help="GPU memory budget per GPU, e.g. 6GiB (repeatable; "
                 "more or fewer than this machine has: hypothetical GPUs)"),
]
