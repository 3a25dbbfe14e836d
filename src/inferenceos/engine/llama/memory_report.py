"""What llama.cpp itself says it allocates: buffer sizes parsed from its load log.

llama.cpp prints one line per buffer when it loads a model and creates a context
(Ollama reads the same lines):

    load_tensors:   CPU_Mapped model buffer size =   235.16 MiB
    load_tensors:   CPU_REPACK model buffer size =    12.66 MiB
    llama_kv_cache:        CPU KV buffer size =    24.00 MiB
    llama_context:        CPU  output buffer size =     1.00 MiB
    sched_reserve:        CPU compute buffer size =   514.50 MiB
    load_tensors: RPC0[127.0.0.1:50052] model buffer size =     3.75 MiB

`measure_load()` loads a model with the given settings, turned into llama.cpp's
parameters by the engine's own builder (engine/llama/structs.py: the same devices,
tensor split and overrides as `LoadedModel`), or dry-runs it (`no_alloc`,
where llama.cpp sizes the compute buffers but prints model and KV buffers as 0) and
returns a `BufferReport`: bytes per (buffer kind, buffer type) plus the process's RSS
growth. This is the ground truth the analytical memory model in `plan/memory.py` is
checked against.
"""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inferenceos import interrupt
from inferenceos.engine.llama.lib import lib, log
from inferenceos.engine.llama.structs import LOAD_MODE_NONE as LOAD_MODE_NONE  # re-exported
from inferenceos.engine.llama.structs import context_params, model_params
from inferenceos.errors import ModelLoadError
from inferenceos.plan.llama_params import LlamaParams

MIB = 1024 * 1024

# an RPC worker's buffer type carries its address: "RPC0[127.0.0.1:50052]"
_BUFFER_LINE = re.compile(
    r"(?P<buft>[A-Za-z0-9_]+(?:\[[^\]\s]*\])?)\s+(?P<kind>model|KV|output|compute) "
    r"buffer size\s*=\s*(?P<mib>[0-9.]+) MiB"
)


@dataclass(frozen=True)
class BufferReport:
    """Bytes per buffer as llama.cpp logged them.

    `buffers` maps (kind, buffer type) → bytes, kind being "model", "KV", "output" or
    "compute" and the buffer type e.g. "CPU_Mapped", "CPU_REPACK", "CUDA0",
    "RPC0[127.0.0.1:50052]" (a worker's device 0 at that address). Sizes are
    exact to the 0.01 MiB llama.cpp prints. `rss_growth` is the resident set growth of
    this process across the load (None for a dry run).
    """

    buffers: dict[tuple[str, str], int] = field(default_factory=dict)
    rss_growth: int | None = None
    n_ctx: int = 0
    dry_run: bool = False

    def kind(self, kind: str) -> int:
        """Total bytes of one kind of buffer over all buffer types."""
        return sum(v for (k, _), v in self.buffers.items() if k == kind)

    @property
    def total(self) -> int:
        return sum(self.buffers.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "buffers": {f"{k}:{b}": v for (k, b), v in self.buffers.items()},
            "model": self.kind("model"),
            "kv": self.kind("KV"),
            "output": self.kind("output"),
            "compute": self.kind("compute"),
            "total": self.total,
            "rss_growth": self.rss_growth,
            "n_ctx": self.n_ctx,
            "dry_run": self.dry_run,
        }


def parse_buffer_lines(lines: list[str]) -> dict[tuple[str, str], int]:
    """(kind, buffer type) → bytes from llama.cpp log lines; repeated buffers add up
    (an SWA model logs two KV buffers, one per cache)."""
    out: dict[tuple[str, str], int] = {}
    for line in lines:
        m = _BUFFER_LINE.search(line)
        if m:
            key = (m.group("kind"), m.group("buft"))
            out[key] = out.get(key, 0) + round(float(m.group("mib")) * MIB)
    return out


def rss_bytes() -> int:
    """This process's resident set size (Linux /proc; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            resident_pages = int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return 0
    return resident_pages * os.sysconf("SC_PAGE_SIZE")


def measure_load(path: Path, settings: LlamaParams, dry_run: bool = False) -> BufferReport:
    """Load `path` with `settings` (or dry-run it), free it, and report its buffers.

    The parameters are the engine's (`LoadedModel` builds them with the same
    functions); the one difference is the prefetcher's eval callback of a disk-bound
    plan, which sizes no buffer. Raises ModelLoadError with llama.cpp's own reason when
    it refuses the settings (e.g. a quantized V cache without flash attention).
    """
    ll = lib()
    mark = log().mark()  # a line count: valid however many lines the bounded log drops
    rss0 = rss_bytes()
    # the engine's own builder (engine/llama/structs.py), so what is measured is the
    # load the engine makes; `params` (and the buffers it points into) lives until the
    # model is freed, as LoadedModel keeps its own
    params = model_params(settings, dry_run=dry_run)
    model = ll.llama_model_load_from_file(str(path).encode(), params.struct)
    if not model:
        interrupt.check()  # stopped by a Ctrl-C: KeyboardInterrupt, not a load error
        why = "; ".join(log().errors_since(mark)[-3:]) or "unknown reason"
        raise ModelLoadError(f"llama.cpp could not load {path}: {why}")
    try:
        ctx = ll.llama_init_from_model(model, context_params(settings))
        if not ctx:
            why = "; ".join(log().errors_since(mark)[-3:]) or "unknown reason"
            raise ModelLoadError(f"llama.cpp could not create a context: {why}")
        n_ctx = int(ll.llama_n_ctx(ctx))
        rss1 = rss_bytes()
        ll.llama_free(ctx)
    finally:
        ll.llama_model_free(model)
    return BufferReport(
        buffers=parse_buffer_lines(log().since(mark)),
        rss_growth=None if dry_run else rss1 - rss0,
        n_ctx=n_ctx,
        dry_run=dry_run,
    )


def _main() -> None:
    """`python -m inferenceos.engine.llama.memory_report MODEL key=value...`: one measurement
    as JSON, in a fresh process so RSS growth is not blurred by earlier loads."""
    args = sys.argv[1:]
    if not args:
        raise SystemExit("usage: python -m inferenceos.engine.llama.memory_report MODEL [k=v ...]")
    kw: dict[str, Any] = {}
    dry = False
    for item in args[1:]:
        key, _, value = item.partition("=")
        if key == "dry_run":
            dry = value.lower() in ("1", "true")
            continue
        default = getattr(LlamaParams, key)
        kw[key] = (
            (value.lower() in ("1", "true"))
            if isinstance(default, bool)
            else (type(default)(value))
        )
    report = measure_load(Path(args[0]), LlamaParams(**kw), dry_run=dry)
    sys.stdout.write(json.dumps(report.to_json()) + "\n")


if __name__ == "__main__":
    _main()
