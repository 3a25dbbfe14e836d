"""The GPU path on a real GPU, step by step, each time-boxed; a report under OUT.

Run by scripts/gpu_check.sh after it has built llama-cpp-python with CUDA and installed
our package; with `--dry-run` (CPU machine, the test suite) the same steps run against
a fake `nvidia-smi` that prints a recorded H200's output (scripts/gpu_fixtures/), the
steps that load a model run on the CPU build, and every check that needs a real GPU is
reported as "dry" instead of pass/fail: the dry run proves the script's logic (commands,
parsing, time boxes, the report), not the GPU.

Steps (docs/gpu.md says how long each should take on the H200 machine):
  model      a synthetic llama of a realistic shape (random f16 weights: speed does not
             depend on their values), written with gguf
  hardware   `hardware --json`: the GPU seen (NVML / nvidia-smi), its memory
  doctor     `doctor`: exit status and what it says about the GPU
  simulate   `simulate --json`: the planner offloads every layer; predicted t/s
  placement  `placement --json`: the per-layer placement on the GPU
  run        `run --gpu-layers -1 --json`: decode and prefill t/s, fully offloaded
  bench      llama-bench (built in the same step) on the same file: the ratio of ours
  partial    `run --gpu-memory SIZE -v`: a partial offload (llama.cpp's "offloaded N/M")
  serve      `serve`, a request, `/api/ps` size_vram > 0
  memory     the planner's memory per device against llama.cpp's reported buffers
  migrate    a live migration under VRAM pressure (a lowered cap), and back up

    python scripts/gpu_check.py --out DIR [--dry-run] [--budget-s 420] [--bench BIN]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "scripts" / "gpu_fixtures"
GiB = 1 << 30


@dataclass
class Step:
    name: str
    status: str = "not run"  # pass, fail, dry, skip, timeout, error
    seconds: float = 0.0
    checks: list[str] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)
    note: str = ""


@dataclass
class Ctx:
    out: Path
    dry: bool
    deadline: float
    home: Path
    model: Path = Path()
    bench: Path | None = None
    env: dict[str, str] = field(default_factory=dict)
    gpu_env: dict[str, str] = field(default_factory=dict)  # what planning steps see
    steps: list[Step] = field(default_factory=list)

    def left(self) -> float:
        return self.deadline - time.monotonic()


# -- helpers --------------------------------------------------------------------------------


def cli(ctx: Ctx, args: list[str], timeout: float, env: dict[str, str] | None = None,
        log: str | None = None) -> subprocess.CompletedProcess[str]:
    """`python -m inferenceos ARGS` with the step's time box; its output kept in OUT."""
    timeout = max(1.0, min(timeout, ctx.left()))
    r = subprocess.run([sys.executable, "-m", "inferenceos", *args], env=env or ctx.env,
                       capture_output=True, text=True, timeout=timeout)
    if log:
        (ctx.out / "logs").mkdir(exist_ok=True)
        (ctx.out / "logs" / f"{log}.txt").write_text(
            f"$ inferenceos {' '.join(args)}\n# exit {r.returncode}\n{r.stdout}\n"
            f"--- stderr ---\n{r.stderr}")
    return r


def check(step: Step, ctx: Ctx, ok: bool, what: str, needs_gpu: bool = True) -> None:
    """Record a check; on a dry run one that needs a real GPU is "dry", not pass/fail."""
    if ctx.dry and needs_gpu:
        step.checks.append(f"dry  {what}")
        return
    step.checks.append(f"{'ok  ' if ok else 'FAIL'} {what}")
    if not ok:
        step.status = "fail"


def json_out(r: subprocess.CompletedProcess[str]) -> Any:
    """The last JSON object on stdout."""
    text = r.stdout.strip()
    start = text.find("{")
    if start < 0:
        raise ValueError(f"no JSON in the output (exit {r.returncode}): {r.stderr[-300:]}")
    return json.loads(text[start:])


# -- the model ------------------------------------------------------------------------------


def write_model(path: Path, n_layer: int, n_embd: int, n_head: int, n_head_kv: int,
                n_ff: int, n_ctx: int) -> Path:
    """A llama of this shape, f16 weights (one random matrix per tensor shape, reused
    across layers: writing GiBs stays I/O-bound), the tiny test vocabulary."""
    import numpy as np
    from gguf import GGUFWriter

    sys.path.insert(0, str(ROOT / "tests"))
    from tiny_models import TinyShape, _add_metadata, _vocab

    shape = TinyShape(n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv,
                      n_ff=n_ff, n_ctx=n_ctx)
    rng = np.random.default_rng(0)
    cache: dict[tuple[int, ...], Any] = {}

    def mat(*dims: int) -> Any:
        if dims not in cache:
            cache[dims] = (rng.standard_normal(dims, dtype=np.float32) * 0.02).astype(np.float16)
        return cache[dims]

    n_vocab = len(_vocab()[0])
    w = GGUFWriter(str(path), "llama")
    _add_metadata(w, shape, n_vocab, None)  # its general.file_type says F32: display only
    w.add_tensor("token_embd.weight", mat(n_vocab, n_embd).astype(np.float32))
    hd = n_embd // n_head
    for i in range(n_layer):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        w.add_tensor(f"blk.{i}.attn_q.weight", mat(n_head * hd, n_embd))
        w.add_tensor(f"blk.{i}.attn_k.weight", mat(n_head_kv * hd, n_embd))
        w.add_tensor(f"blk.{i}.attn_v.weight", mat(n_head_kv * hd, n_embd))
        w.add_tensor(f"blk.{i}.attn_output.weight", mat(n_embd, n_head * hd))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", mat(n_ff, n_embd))
        w.add_tensor(f"blk.{i}.ffn_up.weight", mat(n_ff, n_embd))
        w.add_tensor(f"blk.{i}.ffn_down.weight", mat(n_embd, n_ff))
    w.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    w.add_tensor("output.weight", mat(n_vocab, n_embd).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def step_model(ctx: Ctx, step: Step) -> None:
    # real: a Llama-3.2-1B-like body (16 layers, 2048 wide, GQA 32/8, ffn 8192): 1.9 GiB
    # of f16 weights, so decode reads ~1.9 GiB a token (bandwidth-bound, as real models);
    # dry: the same code path at a toy size
    dims = (4, 128, 4, 2, 512, 2048) if ctx.dry else (16, 2048, 32, 8, 8192, 8192)
    ctx.model = write_model(ctx.home / "synthetic-llama.gguf", *dims)
    step.figures = {"file_bytes": ctx.model.stat().st_size, "n_layer": dims[0],
                    "n_embd": dims[1], "n_ff": dims[4]}
    check(step, ctx, ctx.model.stat().st_size > (GiB if not ctx.dry else 0),
          "model written", needs_gpu=False)


# -- the steps ------------------------------------------------------------------------------


def _gpus(profile: dict[str, Any]) -> list[dict[str, Any]]:
    return [g for g in profile.get("gpus", []) if "nvidia" in str(g).lower()]


def step_hardware(ctx: Ctx, step: Step) -> None:
    r = cli(ctx, ["hardware", "--json", "--refresh"], 120, ctx.gpu_env, "hardware")
    if r.returncode and "--refresh" in r.stderr:
        r = cli(ctx, ["hardware", "--json"], 120, ctx.gpu_env, "hardware")
    gpus = _gpus(json_out(r))
    step.figures = {"gpus": [{k: g.get(k) for k in ("name", "memory_total_bytes",
                                                    "memory_free_bytes", "compute_capability",
                                                    "source")} for g in gpus]}
    # the fake nvidia-smi of a dry run describes an H200 too: these checks are real there
    check(step, ctx, len(gpus) == 1, "one NVIDIA GPU seen", needs_gpu=False)
    check(step, ctx, bool(gpus) and "H200" in str(gpus[0].get("name")), "it is an H200",
          needs_gpu=False)
    total = max((int(g.get("memory_total_bytes") or 0) for g in gpus), default=0)
    check(step, ctx, total > 100 * GiB, f"memory total {total / GiB:.1f} GiB > 100 GiB",
          needs_gpu=False)
    src = str(gpus[0].get("source", "")) if gpus else ""
    step.figures["source"] = src
    check(step, ctx, "nvml" in src.lower(), f"seen through NVML (source: {src or '?'})")


def step_doctor(ctx: Ctx, step: Step) -> None:
    r = cli(ctx, ["doctor"], 120, ctx.gpu_env, "doctor")
    text = r.stdout + r.stderr
    step.figures = {"exit": r.returncode, "lines": len(text.splitlines())}
    check(step, ctx, "Traceback" not in text, "no traceback", needs_gpu=False)
    check(step, ctx, "H200" in text or "CUDA" in text, "names the GPU or CUDA",
          needs_gpu=False)
    check(step, ctx, "CUDA" in text and r.returncode == 0, "llama.cpp's CUDA backend is fine")


def step_simulate(ctx: Ctx, step: Step) -> None:
    r = cli(ctx, ["simulate", str(ctx.model), "--json", "--prompt-tokens", "512",
                  "--output-tokens", "128"], 120, ctx.gpu_env, "simulate")
    d = json_out(r)
    params = d.get("plan", {}).get("llama_params", {})
    step.figures = {k: d.get(k) for k in ("feasible", "decode_tps", "prefill_tps", "ttft_s",
                                          "peak_memory_bytes", "bottleneck")}
    step.figures["n_gpu_layers"] = params.get("n_gpu_layers")
    check(step, ctx, bool(d.get("feasible")), "feasible", needs_gpu=False)
    gpu_bytes = sum(v for k, v in (d.get("peak_memory_bytes") or {}).items() if k != "CPU")
    check(step, ctx, gpu_bytes > 0, "memory planned on the GPU", needs_gpu=False)


def step_placement(ctx: Ctx, step: Step) -> None:
    r = cli(ctx, ["placement", str(ctx.model), "--json"], 120, ctx.gpu_env, "placement")
    d = json_out(r)
    text = json.dumps(d)
    step.figures = {"bytes": len(text), "devices": sorted(set(re.findall(r'"(GPU\d+|CUDA\d+)"',
                                                                       text)))}
    check(step, ctx, bool(step.figures["devices"]), "layers placed on the GPU",
          needs_gpu=False)


def _prompt(n_words: int) -> str:
    return " ".join(f"w{i % 97}" for i in range(n_words))


def step_run(ctx: Ctx, step: Step) -> None:
    args = ["run", str(ctx.model), "--raw", "-p", _prompt(400), "-n", "128", "--ignore-eos",
            "--temperature", "0", "--json", "--ctx", "4096", "--draft", "none"]
    if not ctx.dry:
        args += ["--gpu-layers", "-1"]
    r = cli(ctx, args, 180, ctx.env, "run")
    m = json_out(r)["metrics"]
    step.figures = {k: m.get(k) for k in ("load_s", "prompt_tokens", "prompt_tps",
                                          "completion_tokens", "decode_tps")}
    check(step, ctx, m.get("completion_tokens") == 128, "128 tokens decoded", needs_gpu=False)
    check(step, ctx, float(m.get("decode_tps") or 0) > 100, "decode > 100 t/s (GPU speed)")


def step_bench(ctx: Ctx, step: Step) -> None:
    if ctx.bench is None or not ctx.bench.is_file():
        step.status, step.note = "skip", "llama-bench was not built in time"
        return
    args = [str(ctx.bench), "-m", str(ctx.model), "-p", "512", "-n", "128", "-r", "3",
            "-o", "json"] + ([] if ctx.dry else ["-ngl", "99"])
    r = subprocess.run(args, capture_output=True, text=True,
                       timeout=max(1.0, min(180.0, ctx.left())))
    (ctx.out / "logs").mkdir(exist_ok=True)
    (ctx.out / "logs" / "bench.txt").write_text(r.stdout + "\n--- stderr ---\n" + r.stderr)
    rows = json.loads(r.stdout[r.stdout.find("["):])
    pp = next(x["avg_ts"] for x in rows if x.get("n_prompt") and not x.get("n_gen"))
    tg = next(x["avg_ts"] for x in rows if x.get("n_gen") and not x.get("n_prompt"))
    ours = next((s.figures for s in ctx.steps if s.name == "run"), {})
    step.figures = {"pp512_tps": pp, "tg128_tps": tg,
                    "decode_ratio": (ours.get("decode_tps") or 0) / tg if tg else None,
                    "prefill_ratio": (ours.get("prompt_tps") or 0) / pp if pp else None}
    ratio = step.figures["decode_ratio"] or 0
    check(step, ctx, ratio >= 0.8, f"our decode / llama-bench tg128 = {ratio:.2f} (>= 0.8)")


def step_partial(ctx: Ctx, step: Step) -> None:
    size = max(1, int(ctx.model.stat().st_size * 0.5 / (1 << 20)))
    args = ["run", str(ctx.model), "--raw", "-p", "hello", "-n", "16", "--ignore-eos",
            "--temperature", "0", "--json", "-v", "--ctx", "2048"]
    if not ctx.dry:
        args += ["--gpu-memory", f"{size}MiB"]
    r = cli(ctx, args, 180, ctx.env, "partial")
    m = re.search(r"offloaded (\d+)/(\d+) layers", r.stderr)
    done, total = (int(m[1]), int(m[2])) if m else (0, 0)
    step.figures = {"gpu_memory_mib": size, "offloaded": done, "layers": total,
                    "decode_tps": json_out(r)["metrics"].get("decode_tps")}
    check(step, ctx, r.returncode == 0, "ran", needs_gpu=False)
    check(step, ctx, 0 < done < total, f"partial offload: {done}/{total} layers on the GPU")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def serving(ctx: Ctx, log_name: str, extra_env: dict[str, str] | None = None
            ) -> Iterator[str]:
    """`inferenceos serve MODEL` on a free loopback port; yields its base URL."""
    import httpx

    port = _free_port()
    log = ctx.out / "logs" / f"{log_name}.txt"
    log.parent.mkdir(exist_ok=True)
    with log.open("w") as f:
        proc = subprocess.Popen(
            [sys.executable, "-m", "inferenceos", "serve", str(ctx.model), "--port", str(port),
             "--ctx", "4096", "--parallel", "2"],
            env={**ctx.env, **(extra_env or {})}, stdout=f, stderr=f,
            start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + min(90.0, ctx.left())
        while True:
            try:
                if httpx.get(base + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"serve did not start (logs/{log_name}.txt)")
            time.sleep(0.3)
        yield base
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def _vram(base: str, key: str = "size_vram") -> int:
    """What the loaded models hold on GPUs (`size` on a dry run: all of it)."""
    import httpx

    ps = httpx.get(base + "/api/ps", timeout=10).json()["models"]
    return sum(int(m.get(key) or 0) for m in ps)


def step_serve(ctx: Ctx, step: Step) -> None:
    import httpx

    with serving(ctx, "serve") as base:
        r = httpx.post(base + "/api/generate", timeout=120, json={
            "model": ctx.model.stem, "prompt": "hello", "stream": False,
            "options": {"num_predict": 32, "temperature": 0}})
        r.raise_for_status()
        ps = httpx.get(base + "/api/ps", timeout=10).json()["models"]
        gen = r.json()
        step.figures = {"eval_count": gen.get("eval_count"),
                        "eval_tps": gen["eval_count"] / (gen["eval_duration"] / 1e9)
                        if gen.get("eval_duration") else None,
                        "ps": [{k: m.get(k) for k in ("name", "size", "size_vram", "state",
                                                      "context_length")} for m in ps]}
        vram = sum(int(m.get("size_vram") or 0) for m in ps)
        check(step, ctx, len(ps) == 1, "one model loaded", needs_gpu=False)
        check(step, ctx, vram > 0, f"/api/ps size_vram {vram / GiB:.2f} GiB > 0")


def step_migrate(ctx: Ctx, step: Step) -> None:
    """Live migration under VRAM pressure (docs/migration.md): while a stream runs, the
    GPU's cap is lowered to half of what the model holds there (`POST /api/budget`):
    the model must move to a smaller placement with the stream going on, then back up
    once the cap is lifted."""
    import threading

    import httpx

    env = {"INFERENCEOS_PRESSURE_DWELL_S": "1"}
    with serving(ctx, "migrate", env) as base:
        name = ctx.model.stem
        httpx.post(base + "/api/generate", timeout=120, json={
            "model": name, "prompt": "hi", "stream": False,
            "options": {"num_predict": 1}}).raise_for_status()
        # a dry run walks the same path on the CPU (its cap, its memory, short waits)
        key, wait_s, n_predict = ("size", 2.0, 300) if ctx.dry else ("size_vram", 60.0, 3000)
        v0 = _vram(base, key)
        devices = [d["name"] for d in httpx.get(base + "/api/budget", timeout=10).json()
                   ["devices"] if d["name"] != "CPU" or ctx.dry]
        step.figures = {"vram_before": v0, "devices": devices}
        if not devices or v0 == 0:
            check(step, ctx, False, "a GPU holds the model (nothing to migrate)")
            return
        dev = devices[0]
        lines: list[dict[str, Any]] = []

        def stream() -> None:  # llama-server's dialect: it has ignore_eos
            with httpx.stream("POST", base + "/completion", timeout=300, json={
                    "prompt": "count", "n_predict": n_predict, "temperature": 0,
                    "ignore_eos": True, "stream": True}) as r:
                lines.extend(json.loads(ln[6:]) for ln in r.iter_lines()
                             if ln.startswith("data: {"))

        t = threading.Thread(target=stream, daemon=True)
        t.start()
        time.sleep(1.0)
        t0 = time.monotonic()
        httpx.post(base + "/api/budget", timeout=10,
                   json={"device": dev, "bytes": v0 // 2}).raise_for_status()
        down = None
        while time.monotonic() - t0 < min(wait_s, ctx.left() - 20):
            if _vram(base, key) < v0:
                down = time.monotonic() - t0
                break
            time.sleep(0.5)
        v1 = _vram(base, key)
        httpx.post(base + "/api/budget", timeout=10,
                   json={"device": dev, "bytes": None}).raise_for_status()
        t1, up = time.monotonic(), None
        while time.monotonic() - t1 < min(wait_s, ctx.left() - 10):
            if _vram(base, key) >= v0 * 0.9:
                up = time.monotonic() - t1
                break
            time.sleep(0.5)
        t.join(max(1.0, min(120.0, ctx.left() - 5)))
        events = httpx.get(base + "/api/events", timeout=10).json()
        migrations = [e for e in (events.get("events", events) if isinstance(events, dict)
                                  else events) if "migrat" in json.dumps(e)]
        step.figures.update({"device": dev, "cap": v0 // 2, "vram_after_cap": v1,
                             "down_s": down, "up_s": up, "vram_after_lift": _vram(base, key),
                             "stream_tokens": len(lines), "migration_events": len(migrations),
                             "stream_done": bool(lines and lines[-1].get("stop")),
                             "stream_error": lines[-1].get("error") if lines else None})
        check(step, ctx, down is not None and v1 <= v0 // 2 + (64 << 20),
              f"moved down under the cap: {v0 / GiB:.2f} -> {v1 / GiB:.2f} GiB on {dev}")
        check(step, ctx, bool(lines) and lines[-1].get("stop") is True
              and not lines[-1].get("error"), "the stream went on to its end",
              needs_gpu=False)
        check(step, ctx, len(lines) >= n_predict, f"{len(lines)} of {n_predict} tokens streamed")
        check(step, ctx, up is not None, "moved back up once the cap was lifted")


def step_memory(ctx: Ctx, step: Step) -> None:
    """The plan's charge per device against the buffers llama.cpp logged at load."""
    code = f"""
import json, re
from pathlib import Path
from inferenceos.plan.entry import LoadRequest
from inferenceos.registry.catalog import Catalog
from inferenceos.registry.manager import ModelManager
from inferenceos.registry.store import ModelStore
cat = Catalog(ModelStore(Path({str(ctx.home / 'mm-models')!r})))
name = cat.add_file(Path({str(ctx.model)!r})).name
mgr = ModelManager(cat.resolve, base=LoadRequest(n_ctx=8192), slots=2, context_hint=None)
plan = mgr.plan_for(name)
with mgr.acquire(name) as lease:
    buffers = lease.engine.memory_buffers
mgr.close()
gpu = {{k: v for k, v in buffers.items() if re.search(r":CUDA\\d+$", k)}}
print(json.dumps({{"predicted": plan.charge(), "buffers": buffers,
                  "measured_gpu": sum(gpu.values()),
                  "measured_host": sum(buffers.values()) - sum(gpu.values())}}))
"""
    timeout = max(1.0, min(180.0, ctx.left()))
    r = subprocess.run([sys.executable, "-c", code], env=ctx.env, capture_output=True,
                       text=True, timeout=timeout)
    (ctx.out / "logs").mkdir(exist_ok=True)
    (ctx.out / "logs" / "memory.txt").write_text(r.stdout + "\n--- stderr ---\n" + r.stderr)
    d = json.loads(r.stdout.strip().splitlines()[-1])
    pred_gpu = sum(v for k, v in d["predicted"].items() if k != "CPU")
    ratio = pred_gpu / d["measured_gpu"] if d["measured_gpu"] else None
    step.figures = {**d, "predicted_gpu": pred_gpu, "gpu_ratio": ratio}
    check(step, ctx, bool(d["buffers"]), "llama.cpp reported its buffers", needs_gpu=False)
    check(step, ctx, ratio is not None and 0.9 <= ratio <= 1.25,
          f"predicted GPU bytes / CUDA buffers = {ratio or 0:.3f} (0.9..1.25)")


STEPS: list[tuple[str, Callable[[Ctx, Step], None], float]] = [
    # name, function, the most seconds it may take (the script's time boxes)
    ("model", step_model, 60), ("hardware", step_hardware, 60), ("doctor", step_doctor, 60),
    ("simulate", step_simulate, 45), ("placement", step_placement, 45),
    ("run", step_run, 120), ("bench", step_bench, 120), ("partial", step_partial, 120),
    ("serve", step_serve, 120), ("memory", step_memory, 120),
    ("migrate", step_migrate, 180),
]


def fake_nvidia(ctx: Ctx) -> dict[str, str]:
    """A PATH whose `nvidia-smi` prints the recorded H200's output (dry run only)."""
    bin_dir = ctx.home / "fake-bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f"""#!/bin/sh
# FAKE nvidia-smi for gpu_check --dry-run: recorded output of an H200 machine
case "$*" in
  *-q*) cat {FIXTURES / 'nvidia_smi_q_x_h200.xml'} ;;
  *--query-gpu*) cat {FIXTURES / 'nvidia_smi_compute_cap_h200.csv'} ;;
  *-L*) echo "GPU 0: NVIDIA H200 (UUID: GPU-00000000-0000-0000-0000-000000000000)" ;;
  *) cat {FIXTURES / 'nvidia_smi_h200.txt'} ;;
esac
""")
    smi.chmod(0o755)
    # NVML must fail here so the profiler falls back to the fake tool, as it would
    return {**ctx.env, "PATH": f"{bin_dir}{os.pathsep}{ctx.env.get('PATH', '')}",
            "INFERENCEOS_HOME": str(ctx.home / "fake-gpu-home")}


def report(ctx: Ctx, total_s: float) -> int:
    failed = [s for s in ctx.steps if s.status in ("fail", "error", "timeout")]
    data = {"dry_run": ctx.dry, "seconds": round(total_s, 1), "ok": not failed,
            "steps": [asdict(s) for s in ctx.steps]}
    (ctx.out / "report.json").write_text(json.dumps(data, indent=1, default=str))
    lines = [f"# gpu_check {'(DRY RUN: fake nvidia-smi, CPU build)' if ctx.dry else ''}",
             f"total {total_s:.0f} s", ""]
    for s in ctx.steps:
        lines.append(f"{s.name:<10} {s.status:<8} {s.seconds:6.1f} s  {s.note}")
        lines += [f"    {c}" for c in s.checks]
        if s.figures:
            lines.append("    " + json.dumps(s.figures, default=str)[:600])
    text = "\n".join(lines)
    (ctx.out / "report.md").write_text(text + "\n")
    print(text)
    print("GPU CHECK " + ("PASSED" if not failed else "FAILED: " + ", ".join(
        s.name for s in failed)))
    return 1 if failed else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--budget-s", type=float, default=420.0, help="all steps together")
    ap.add_argument("--bench", type=Path, default=None, help="llama-bench binary")
    ap.add_argument("--only", default="", help="comma-separated step names")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    home = args.out / "work" if args.dry_run else Path(os.environ.get("TMPDIR", "/tmp")) / "ios-gpu"
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    t0 = time.monotonic()
    ctx = Ctx(out=args.out, dry=args.dry_run, deadline=t0 + args.budget_s, home=home,
              bench=args.bench)
    ctx.env = {**os.environ, "INFERENCEOS_HOME": str(home / "ios-home"),
               "PYTHONUNBUFFERED": "1"}
    ctx.gpu_env = fake_nvidia(ctx) if ctx.dry else ctx.env
    only = {s for s in args.only.split(",") if s}
    for name, fn, box in STEPS:
        if only and name not in only and name != "model":
            continue
        step = Step(name)
        ctx.steps.append(step)
        if ctx.left() < 5:
            step.status, step.note = "skip", "out of time"
            continue
        start = time.monotonic()
        step.status = "pass"
        try:
            fn(ctx, step)
        except subprocess.TimeoutExpired:
            step.status, step.note = "timeout", f"over its time box ({box:.0f} s)"
        except Exception as exc:  # a step's failure is reported, the next one still runs
            step.status, step.note = "error", f"{type(exc).__name__}: {str(exc)[:300]}"
        step.seconds = time.monotonic() - start
        if step.status == "pass" and ctx.dry and any(c.startswith("dry") for c in step.checks):
            step.status = "dry"
        if step.seconds > box and step.status in ("pass", "dry"):
            step.note += f" (over its {box:.0f} s box)"
        print(f"[{time.monotonic() - t0:6.1f} s] {name}: {step.status} {step.note}",
              flush=True)
    return report(ctx, time.monotonic() - t0)


if __name__ == "__main__":
    sys.exit(main())
