"""Multi-node over llama.cpp RPC: local against split across two workers, measured and
predicted by `simulate`'s model, at added network latencies.

For each point (loopback, then each `--netem` delay), two `inferenceos worker`
processes each offer memory for a third of the model's layers and this machine's RAM
budget is capped so that the planner must put a third here and a third on each worker.
Rounds alternate local and split runs (same model, same prompt, greedy); each prints
prefill and decode t/s, measured (median of rounds) and predicted (the plan's
prediction with the links as the profiler measured them), and the split/local ratios.
The split run's tokens are checked against the local run's.

With `--netem DELAY[,DELAY...]` (milliseconds) each worker runs in its own network
namespace behind a veth pair (`ip netns`, addresses 10.231.N.0/24), and the delay is
added to every packet from the worker with `tc netem` (round trip + DELAY). Where the
kernel has no netem qdisc (e.g. a Firecracker VM kernel: "Specified qdisc kind is
unknown"), the same delay is added by a small userspace TCP relay in front of each
namespace (`--delay-by relay`), and the report says so.

    sudo .venv/bin/python benchmarks/cluster.py [--netem 0,1,5] [--rounds 3]
        [--prompt-tokens 128] [--gen-tokens 48] [--threads 2] [--model PATH]

Target: every prediction within 25 % of the measurement.
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "benchmarks")]

NS_PREFIX = "iosbench"
SUBNET = "10.231.{i}.{h}"
TARGET = 0.25


# -- the delay relay (used only when the kernel has no netem) ---------------------------


def _relay_main(listen: int, host: str, port: int, delay_s: float) -> None:
    """Forward 127.0.0.1:listen → host:port; bytes coming back wait `delay_s` first."""
    srv = socket.create_server(("127.0.0.1", listen))
    while True:
        client, _ = srv.accept()
        try:
            upstream = socket.create_connection((host, port))
        except OSError:
            client.close()
            continue
        for s in (client, upstream):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=_pipe, args=(client, upstream, 0.0), daemon=True).start()
        threading.Thread(target=_pipe, args=(upstream, client, delay_s), daemon=True).start()


def _pipe(src: socket.socket, dst: socket.socket, delay_s: float) -> None:
    import queue

    if delay_s <= 0:  # nothing to hold back: forward in this thread (no hand-off per message)
        _send_all(iter(lambda: _recv(src), b""), dst)
        return
    q: queue.Queue[tuple[float, bytes]] = queue.Queue()

    def due() -> Iterator[bytes]:
        while (item := q.get())[1]:
            wait = item[0] - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            yield item[1]

    sender = threading.Thread(target=_send_all, args=(due(), dst), daemon=True)
    sender.start()
    while True:
        data = _recv(src)
        q.put((time.perf_counter() + delay_s, data))
        if not data:
            break
    sender.join()


def _send_all(chunks: Iterator[bytes], dst: socket.socket) -> None:
    """Send every chunk, then close our sending side (the peer sees end of stream)."""
    for data in chunks:
        try:
            dst.sendall(data)
        except OSError:
            break
    with contextlib.suppress(OSError):
        dst.shutdown(socket.SHUT_WR)


def _recv(src: socket.socket) -> bytes:
    try:
        return src.recv(1 << 20)
    except OSError:
        return b""


# -- namespaces ------------------------------------------------------------------------


def _sh(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True)


def netem_available() -> tuple[bool, str]:
    """Whether `tc netem` works here; the exact error when it does not."""
    ns = f"{NS_PREFIX}-probe"
    r = _sh("ip", "netns", "add", ns)
    if r.returncode:
        return False, f"ip netns add: {r.stderr.strip()}"
    try:
        _sh("ip", "-n", ns, "link", "set", "lo", "up")
        r = _sh("tc", "-n", ns, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms")
        return r.returncode == 0, r.stderr.strip()
    finally:
        _sh("ip", "netns", "del", ns)


@dataclass
class Namespace:
    name: str
    host_ip: str
    ns_ip: str


@contextlib.contextmanager
def namespace(i: int, delay_ms: float, use_netem: bool) -> Iterator[Namespace]:
    """A network namespace joined to this one by a veth pair; with `use_netem`, packets
    leaving the namespace wait `delay_ms`."""
    ns = Namespace(f"{NS_PREFIX}{i}", SUBNET.format(i=i, h=1), SUBNET.format(i=i, h=2))
    host_if, ns_if = f"iosb{i}h", f"iosb{i}n"
    _sh("ip", "netns", "del", ns.name)  # a leftover from an interrupted run
    steps = [
        ("ip", "netns", "add", ns.name),
        ("ip", "link", "add", host_if, "type", "veth", "peer", "name", ns_if),
        ("ip", "link", "set", ns_if, "netns", ns.name),
        ("ip", "addr", "add", f"{ns.host_ip}/24", "dev", host_if),
        ("ip", "link", "set", host_if, "up"),
        ("ip", "-n", ns.name, "addr", "add", f"{ns.ns_ip}/24", "dev", ns_if),
        ("ip", "-n", ns.name, "link", "set", ns_if, "up"),
        ("ip", "-n", ns.name, "link", "set", "lo", "up"),
    ]
    if use_netem and delay_ms > 0:
        steps.append(("tc", "-n", ns.name, "qdisc", "add", "dev", ns_if, "root", "netem",
                      "delay", f"{delay_ms}ms"))
    try:
        for step in steps:
            r = _sh(*step)
            if r.returncode:
                raise RuntimeError(f"{' '.join(step)}: {r.stderr.strip()}")
        yield ns
    finally:
        _sh("ip", "link", "del", host_if)
        _sh("ip", "netns", "del", ns.name)


# -- one point: two workers, local vs split ----------------------------------------------


@dataclass
class Point:
    label: str
    measured: dict[str, list[float]]
    predicted: dict[str, float]
    same_tokens: bool
    plan_line: str
    rtts_ms: list[float]
    load: str  # the 1-minute load average before and after: other work skews everything


def _generate(lm: Any, tokens: list[int], n_gen: int) -> tuple[float, float, list[int]]:
    from inferenceos.engine.sampling import SamplingParams
    from inferenceos.engine.scheduler import generate_one

    sp = SamplingParams(temperature=0.0, max_tokens=n_gen, ignore_eos=True)
    out = [ev.token for ev in generate_one(lm, tokens, sp, adaptive_threads=False)]
    m = lm.metrics
    return m.prompt_tps, m.decode_tps, out


def _split_plan(facts: Any, machine: Any, req: Any, names: list[str]) -> Any:
    """The plan with the most RAM whose offloaded block covers both workers."""
    from inferenceos.plan.devices import Overrides, apply_overrides
    from inferenceos.plan.entry import plan_load

    ram = machine.cpu.memory_bytes
    step = 4 << 20
    while ram > step:
        plan = plan_load(facts, apply_overrides(machine, Overrides(ram=ram)), req)
        if all(n in plan.placement.dense for n in names) and not plan.disk_bound:
            counts = [plan.placement.dense.count(n) for n in names]
            if min(counts) >= len(plan.placement.dense) // 3 - 1:
                return plan, apply_overrides(machine, Overrides(ram=ram))
        ram -= step
    raise RuntimeError("no RAM cap makes the planner use both workers")


def run_point(
    label: str, model: Path, args: argparse.Namespace, addresses: list[str], logs: Path
) -> Point:
    from inferenceos.engine.session import LoadedModel
    from inferenceos.plan.calibration_load import machine_calibration
    from inferenceos.plan.devices import local_machine, with_workers
    from inferenceos.plan.entry import LoadRequest, plan_load
    from inferenceos.plan.model_facts import load_model_facts
    from inferenceos.plan.simulate import Workload, predict

    load_before = _loadavg()
    facts = load_model_facts(model)
    cal = machine_calibration()
    req = LoadRequest(n_ctx=args.ctx, threads=args.threads)
    local_m = local_machine()
    local = plan_load(facts, local_m, req)
    machine = with_workers(local_m, ",".join(addresses), refresh=True)
    names = [f"RPC[{a}]" for a in addresses]
    split, split_m = _split_plan(facts, machine, req, names)
    w = Workload(prompt_tokens=args.prompt_tokens, output_tokens=args.gen_tokens, n_ctx=args.ctx)
    pl, ps = predict(facts, local_m, local, w, cal), predict(facts, split_m, split, w, cal)
    rtts = [d.rtt_s * 1e3 for d in split_m.accelerators if d.is_remote]
    measured: dict[str, list[float]] = {k: [] for k in ("lp", "ld", "sp", "sd")}
    same = True
    # both loaded at once, rounds alternating: other work on the machine slows both alike
    with LoadedModel(model, local.params()) as lm, LoadedModel(model, split.params()) as sm:
        text = "The quick brown fox jumps over the lazy dog. " * 200
        tokens = lm.tokenize(text)[: args.prompt_tokens]
        _generate(lm, tokens[:8], 4)  # warm up
        _generate(sm, tokens[:8], 4)
        for _ in range(args.rounds):
            lp, ld, lt = _generate(lm, tokens, args.gen_tokens)
            sp_, sd, st = _generate(sm, tokens, args.gen_tokens)
            measured["lp"].append(lp)
            measured["ld"].append(ld)
            measured["sp"].append(sp_)
            measured["sd"].append(sd)
            same = same and lt == st
    predicted = {"lp": pl.prefill_tps, "ld": pl.decode_tps,
                 "sp": ps.prefill_tps, "sd": ps.decode_tps}
    load = f"{load_before} → {_loadavg()}"
    return Point(label, measured, predicted, same, split.summary(), rtts, load)


def _loadavg() -> str:
    try:
        return Path("/proc/loadavg").read_text().split()[0]
    except OSError:
        return "?"


@contextlib.contextmanager
def workers(
    model: Path, args: argparse.Namespace, delay_ms: float | None, mode: str, logs: Path
) -> Iterator[list[str]]:
    """Two workers, each offering memory for a third of the model; yields addresses."""
    from inferenceos.cluster.spawn import free_port, spawn_worker, stop_worker

    mem = _worker_mem(model, args)
    procs: list[subprocess.Popen[bytes]] = []
    relays: list[subprocess.Popen[bytes]] = []
    with contextlib.ExitStack() as stack:
        addresses = []
        for i in (1, 2):
            port = free_port()
            prefix: tuple[str, ...] = ()
            extra: tuple[str, ...] = ()
            if delay_ms is None:
                host = "127.0.0.1"
            else:
                ns = stack.enter_context(namespace(i, delay_ms, mode == "netem"))
                host, prefix = ns.ns_ip, ("ip", "netns", "exec", ns.name)
                extra = ("--allow-remote",)  # a private namespace, reachable from here only
            log = logs / f"worker{i}.log"
            proc = spawn_worker(port, host=host, mem=mem, threads=args.threads,
                                prefix=prefix, log=log, extra=extra)
            procs.append(proc)
            if delay_ms is not None and mode == "relay":
                local = free_port()
                for off in (0, 1):  # the RPC port and the info port
                    relays.append(subprocess.Popen(
                        [sys.executable, __file__, "--_relay",
                         f"{local + off}:{host}:{port + off}:{delay_ms}"]))
                time.sleep(0.5)
                host, port = "127.0.0.1", local
            addresses.append(f"{host}:{port}")
        try:
            yield addresses
        finally:
            for r in relays:
                r.kill()
                r.wait()
            for p in procs:
                stop_worker(p)


def _worker_mem(model: Path, args: argparse.Namespace) -> str:
    """Memory for a third of the layers plus the compute buffer the planner reserves."""
    from inferenceos.plan.devices import local_machine
    from inferenceos.plan.entry import LoadRequest, plan_load
    from inferenceos.plan.footprint import gpu_compute_reserve
    from inferenceos.plan.model_facts import load_model_facts
    from inferenceos.plan.placement import layer_parts
    from inferenceos.plan.preflight import GPU_RESERVE_FRACTION

    facts = load_model_facts(model)
    plan = plan_load(facts, local_machine(), LoadRequest(n_ctx=args.ctx, threads=args.threads))
    ctx = replace(plan.ctx, n_ubatch=512)  # the preflight sizes budgets before the ubatch
    parts = layer_parts(facts, ctx)
    third = sum(p.dense_bytes + p.kv_bytes for p in parts[: (len(parts) + 2) // 3])
    need = (gpu_compute_reserve(facts, ctx) + third) / (1 - GPU_RESERVE_FRACTION)
    return str(int(need) + (1 << 20))


def _pct(pred: float, meas: float) -> float:
    return (pred - meas) / meas * 100 if meas else float("nan")


def report(points: list[Point], note: str) -> bool:
    print(f"\n{note}")
    head = (f"{'point':<22} {'RTT ms':>8} {'':<8} {'local meas':>11} {'local pred':>11} "
            f"{'err':>6} {'split meas':>11} {'split pred':>11} {'err':>6} "
            f"{'ratio meas':>10} {'ratio pred':>10}")
    print(head)
    ok = True
    for p in points:
        rtt = "/".join(f"{r:.2f}" for r in p.rtts_ms)
        for kind, lk, sk in (("prefill", "lp", "sp"), ("decode", "ld", "sd")):
            lm, sm = statistics.median(p.measured[lk]), statistics.median(p.measured[sk])
            lp, sp = p.predicted[lk], p.predicted[sk]
            el, es = _pct(lp, lm), _pct(sp, sm)
            ok = ok and abs(el) <= TARGET * 100 and abs(es) <= TARGET * 100
            print(f"{p.label:<22} {rtt:>8} {kind:<8} {lm:>11.1f} {lp:>11.1f} "
                  f"{el:>+5.0f}% {sm:>11.1f} {sp:>11.1f} {es:>+5.0f}% "
                  f"{sm / lm:>10.2f} {sp / lp:>10.2f}")
        print(f"{'':<22} tokens identical to local: {p.same_tokens}; load average {p.load}")
        print(f"{'':<22} {p.plan_line}")
    print(f"\ntarget: every prediction within {TARGET:.0%} of the measurement: "
          f"{'MET' if ok else 'NOT MET'}")
    return ok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--netem", default=None, help="delays in ms, e.g. 0,1,5")
    ap.add_argument("--delay-by", choices=("auto", "netem", "relay"), default="auto")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--gen-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--_relay", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._relay:
        listen, host, port, delay = args._relay.split(":")
        _relay_main(int(listen), host, int(port), float(delay) / 1e3)
        return
    import os
    import tempfile

    # a fresh data dir (the workers inherit it): the prediction rests on the hardware
    # profile measured now, with its llama.cpp probe, as on a new machine; no history
    os.environ["INFERENCEOS_DATA_DIR"] = tempfile.mkdtemp(prefix="cluster-data-")
    from inferenceos.hardware.cache import get_profile
    from inferenceos.model.default_model import ensure_default_model

    model = args.model or ensure_default_model()

    def probe() -> None:
        """A fresh hardware profile before each point: this VM's speed drifts by 10-30 %
        within minutes, and a prediction can only be as good as the probe it rests on."""
        sp = get_profile(refresh=True, measure=True).profile.llama_speed
        print("llama.cpp probe: " + (f"{sp.decode_tps:.0f} t/s decode, {sp.prefill_tps:.0f} "
              f"t/s prefill at {sp.threads} threads ({sp.probe})" if sp else "none"),
              flush=True)

    logs = Path(tempfile.mkdtemp(prefix="cluster-bench-"))
    points = []
    probe()
    with workers(model, args, None, "none", logs) as addrs:
        points.append(run_point("loopback", model, args, addrs, logs))
    note = f"model {model.name}, {args.threads} threads everywhere, prompt " \
           f"{args.prompt_tokens}, {args.gen_tokens} generated, {args.rounds} rounds (medians)"
    if args.netem is not None:
        delays = [float(d) for d in args.netem.split(",") if d.strip()]
        mode = args.delay_by
        if mode in ("auto", "netem"):
            has, err = netem_available()
            if not has:
                if mode == "netem":
                    sys.exit(f"tc netem is not available here: {err}")
                print(f"tc netem is not available here ({err}): the delay is added by a "
                      "userspace relay in front of each worker's namespace instead")
                mode = "relay"
            else:
                mode = "netem"
        note += f"; delay by {mode}"
        for d in delays:
            probe()
            with workers(model, args, d, mode, logs) as addrs:
                points.append(run_point(f"netns +{d:g} ms ({mode})", model, args, addrs, logs))
    report(points, note)


if __name__ == "__main__":
    main()
