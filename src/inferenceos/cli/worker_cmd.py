"""`inferenceos worker`: serve this machine's devices to others over llama.cpp's RPC."""

from __future__ import annotations

from typing import Annotated

import typer

from inferenceos.cli.console import err, out


def worker(
    host: Annotated[str, typer.Option(
        "--host", help="Address to bind (loopback unless --allow-remote)")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="RPC port (info endpoint: port + 1)")] = 50052,
    mem: Annotated[str | None, typer.Option(
        "--mem", help="Most memory to offer, e.g. 8GiB (default: all free memory)")] = None,
    threads: Annotated[int, typer.Option("--threads", help="CPU threads (0: all cores)")] = 0,
    device: Annotated[str | None, typer.Option(
        "--device", help="ggml devices to serve: CUDA0, CPU... (default: GPUs, else CPU)",
    )] = None,
    info_port: Annotated[int, typer.Option(
        "--info-port", help="Port of the info endpoint (0: RPC port + 1)")] = 0,
    allow_remote: Annotated[bool, typer.Option(
        "--allow-remote", help="Allow a non-loopback bind (RPC is unauthenticated)")] = False,
) -> None:
    """Serve this machine's devices to `run`/`serve --rpc HOST:PORT` on other machines.

    Stops cleanly on Ctrl-C or SIGTERM. RPC traffic is neither authenticated nor
    encrypted: keep it on loopback and tunnel it over SSH (docs/cluster.md)."""
    from inferenceos.cluster.worker import WorkerConfig, run_worker
    from inferenceos.units import parse_size

    cfg = WorkerConfig(
        host=host, port=port, mem=parse_size(mem) if mem else None, threads=threads,
        device=device, allow_remote=allow_remote, info_port=info_port,
    )

    def say(line: str) -> None:
        (err if line.startswith("WARNING") else out).print(
            line, style="bold yellow" if line.startswith("WARNING") else None, markup=False
        )

    raise typer.Exit(run_worker(cfg, say))
