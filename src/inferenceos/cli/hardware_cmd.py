"""`inferenceos hardware`: what this machine is and what llama.cpp makes of it."""

from __future__ import annotations

import time
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from inferenceos.cli.cluster_opts import RpcOpt, rpc_workers
from inferenceos.cli.console import out, print_json
from inferenceos.hardware import HardwareProfile, get_profile
from inferenceos.units import format_bytes


def hardware(
    refresh: Annotated[bool, typer.Option("--refresh", help="Probe and measure again")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object")] = False,
    rpc: RpcOpt = None,
) -> None:
    """Show CPU, memory, GPUs, llama.cpp devices, measured bandwidth and the backend to use."""
    start = time.perf_counter()
    profile, from_cache = get_profile(refresh=refresh)
    workers = worker_probes(rpc, refresh)
    if as_json:
        extra = {"workers": [_worker_json(w) for w in workers]} if workers else {}
        print_json({**profile.to_json(), "from_cache": from_cache, **extra})
        return
    _print_workers(workers)
    _print_machine(profile)
    _print_gpus(profile)
    _print_llama(profile)
    _print_verdict(profile)
    age = "cached profile" if from_cache else f"measured in {profile.collect_seconds:.1f} s"
    out.print(f"[dim]{age} ({time.perf_counter() - start:.2f} s); "
              "`inferenceos hardware --refresh` measures again[/]")


def _kv_table(title: str) -> Table:
    t = Table(title=title, show_header=False, title_justify="left")
    t.add_column(style="bold cyan")
    t.add_column()
    return t


def _print_machine(p: HardwareProfile) -> None:
    t = _kv_table("Machine")
    c, m, b = p.cpu, p.memory, p.bandwidth
    t.add_row("CPU", f"{c.model} ({c.arch})")
    t.add_row("cores / threads", f"{c.cores} / {c.threads} ({c.usable_threads} usable), "
              f"{c.sockets} socket(s), {c.numa_nodes} NUMA node(s)")
    t.add_row("ISA", " ".join(c.isa) or "-")
    caches = c.cache_bytes.items()
    t.add_row("caches", ", ".join(f"{k.upper()} {format_bytes(v)}" for k, v in caches))
    ram = f"{format_bytes(m.total_bytes)} total, {format_bytes(m.available_bytes)} available"
    if m.cgroup_limit_bytes is not None:
        ram += f", container limit {format_bytes(m.cgroup_limit_bytes)}"
    t.add_row("RAM", ram)
    swap = f"{format_bytes(m.swap_total_bytes)} ({format_bytes(m.swap_free_bytes)} free)"
    t.add_row("swap", swap)
    if b.ram_read_gbps is not None:
        t.add_row("RAM read", f"{b.ram_read_gbps:.1f} GB/s ({b.ram_threads} threads, "
                  f"{format_bytes(b.ram_buffer_bytes)} buffer)")
    if b.disk_read_gbps is not None:
        t.add_row("disk read", f"{b.disk_read_gbps:.2f} GB/s in {escape(str(b.disk_path))} "
                  f"({b.disk_fs}, page cache bypassed by {b.disk_method})")
    if b.disk_random_read_gbps is not None:
        t.add_row("disk random", f"{b.disk_random_read_gbps:.2f} GB/s in 64 KiB reads at random "
                  "offsets (how weights left on disk stream back)")
    if p.llama_speed is not None:  # what simulate's perf model is calibrated on
        sp = p.llama_speed
        t.add_row("llama.cpp probe", f"{sp.decode_tps:.0f} t/s decode, {sp.prefill_tps:.0f} "
                  f"t/s prefill ({sp.threads} threads, {sp.seconds:.1f} s; {sp.probe})")
    out.print(t)


def _print_gpus(p: HardwareProfile) -> None:
    if not p.gpus:
        out.print("[bold]GPUs:[/] none found")
        return
    t = Table(title="GPUs (vendor tools)", title_justify="left")
    cols = ("#", "vendor", "name", "memory free / total", "compute", "PCIe", "driver", "source")
    for col in cols:
        t.add_column(col)
    for g in p.gpus:
        mem = "-" if g.memory_total_bytes is None else (
            f"{format_bytes(g.memory_free_bytes or 0)} / {format_bytes(g.memory_total_bytes)}")
        if g.integrated:
            mem += f" (shared, {int((g.shared_memory_fraction or 0) * 100)}% of RAM)"
        pcie = f"gen{g.pcie_gen} x{g.pcie_width}" if g.pcie_gen and g.pcie_width else "-"
        t.add_row(str(g.index), g.vendor, escape(g.name), mem, g.compute or "-", pcie,
                  g.driver_version or "-", g.source)
    out.print(t)


def _print_llama(p: HardwareProfile) -> None:
    ll = p.llama
    if not ll.loaded:
        out.print(f"[bold]llama.cpp:[/] [red]{escape(ll.error or 'not loaded')}[/]")
        return
    t = Table(title=f"llama.cpp devices (llama-cpp-python {ll.package_version}, ggml "
              f"{ll.ggml_version} {ll.ggml_commit}; backends: {', '.join(ll.backends)})",
              title_justify="left")
    measured = any(d.read_gbps for d in ll.devices)
    for col in ("device", "type", "backend", "description", "memory free / total",
                *(["measured (decode read, copy from host)"] if measured else [])):
        t.add_column(col)
    for d in ll.devices:
        rates = [f"{d.read_gbps:g} GB/s, {d.host_copy_gbps or 0:g} GB/s"
                 if d.read_gbps else ""] if measured else []
        t.add_row(d.name, d.type, d.backend, escape(d.description),
                  f"{format_bytes(d.memory_free_bytes)} / {format_bytes(d.memory_total_bytes)}",
                  *rates)
    out.print(t)


def _print_verdict(p: HardwareProfile) -> None:
    r = p.recommendation
    out.print(f"[bold]Recommended backend:[/] [green]{r.backend}[/] — {escape(r.reason)}")
    if r.reinstall_hint:
        out.print(f"  rebuild: {escape(r.reinstall_hint)}")
    for w in p.warnings:
        out.print(f"[yellow]warning:[/] {escape(w)}")


def worker_probes(rpc: list[str] | None, refresh: bool) -> list[Any]:
    """Each `--rpc` (or cluster.rpc) worker asked now; the link measured once, cached."""
    from inferenceos.cluster.probe import probe_workers
    from inferenceos.endpoint import parse_endpoints

    return probe_workers(parse_endpoints(rpc_workers(rpc)), refresh=refresh)


def _worker_json(w: Any) -> dict[str, Any]:
    return {
        "address": w.endpoint.address,
        "usable": w.usable,
        "error": w.error or None,
        "info": w.info.to_json() if w.info else None,
        "link": {"rtt_s": w.link.rtt_s, "bandwidth_gbps": w.link.bandwidth_gbps,
                 "cached": w.link_cached} if w.link else None,
    }


def _print_workers(workers: list[Any]) -> None:
    from inferenceos.cluster.info import host_id

    if not workers:
        return
    t = Table(title="Cluster workers (llama.cpp RPC)", title_justify="left")
    for col in ("worker", "devices", "offered", "threads", "round trip", "link"):
        t.add_column(col)
    for w in workers:
        if not w.usable:
            t.add_row(w.endpoint.address, f"[red]{escape(w.error)}[/]", "", "", "", "")
            continue
        devs = ", ".join(f"{d.name} ({d.type})" for d in w.info.devices)
        if w.info.host_id and w.info.host_id == host_id():
            devs += " · this machine"  # its memory is this RAM, its compute these cores
        offered = format_bytes(sum(d.offered_bytes for d in w.info.devices))
        rtt = f"{w.link.rtt_s * 1e3:.2f} ms" if w.link else "-"
        bw = f"{w.link.bandwidth_gbps:.2f} GB/s" if w.link else "-"
        t.add_row(w.endpoint.address, devs, offered, str(w.info.threads), rtt, bw)
    out.print(t)
