"""`inferenceos ps`: models loaded by a running server (asks its /api/ps, and its
/metrics for the weights' residency: a model that streams weights from disk gets a
line of its own under the table, so the common case's table does not grow)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Annotated, Any

import typer
from rich.cells import cell_len
from rich.text import Text

from inferenceos.cli.console import clean_text, out, print_json
from inferenceos.cli.server_client import (
    FIRST_TIMEOUT_S,
    Patience,
    ServerBusy,
    ServerClient,
    ServerError,
    TimeoutOpt,
    retry_busy,
    say_busy,
)
from inferenceos.units import format_bytes as fmt_bytes


def loaded_models(client: ServerClient, notify: Callable[[ServerBusy], None] = say_busy
                  ) -> dict[str, Any]:
    """The server's /api/ps, each model that streams weights from disk with its figures
    from /metrics under `weights`. A busy server is asked again, with longer waits,
    until it answers (`retry_busy`; each wait told to `notify`); an absent one or an
    HTTP error is a ServerError. The figures are left out when /metrics cannot be read
    (a plain Ollama has none)."""
    patience = Patience(client.timeout)
    data: dict[str, Any] = retry_busy(lambda t: client.get_json("/api/ps", t), notify,
                                      patience)
    if not data.get("models"):
        return data
    try:
        text = retry_busy(lambda t: client.get_text("/metrics", t), notify, patience)
    except ServerError:
        text = ""
    weights = weight_figures(text)
    for m in data.get("models", []):
        if str(m.get("name")) in weights:
            m["weights"] = weights[str(m.get("name"))]
    return data


# /metrics families (server/ops/weight_metrics.py) -> the key `ps --json` gives them
WEIGHT_FIGURES = {
    "weights_resident_bytes": "resident_bytes",
    "weights_streamed_bytes": "streamed_bytes",
    "weights_mapped_resident_bytes": "mapped_resident_bytes",
    "weight_page_ins_per_token": "page_ins_per_token",
    "weight_read_bytes_per_token": "read_bytes_per_token",
    "expert_hit_ratio": "expert_hit_ratio",
}


def weight_figures(metrics_text: str) -> dict[str, dict[str, float]]:
    """{model name: {figure: value}} of the weights' families in a scrape; {} when
    the text is not the Prometheus format."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, dict[str, float]] = {}
    try:
        for family in text_string_to_metric_families(metrics_text):
            key = WEIGHT_FIGURES.get(family.name.removeprefix("inferenceos:"))
            for sample in family.samples if key else ():
                name = sample.labels.get("model_name", "")
                out.setdefault(name, {})[str(key)] = float(sample.value)
    except ValueError:
        return {}
    return out


def streaming_line(name: str, w: dict[str, float]) -> str | None:
    """One line for a model that streams weights from disk; None when nothing
    streams: 'NAME streams 38 MiB of weights from disk, 15 MiB resident (30 MiB of
    the file in memory now); per token 41 page-ins, 2.1 MiB read; experts 87 % hit'."""
    streamed = int(w.get("streamed_bytes", 0))
    if streamed <= 0:
        return None
    line = (f"{name} streams {fmt_bytes(streamed)} of weights from disk, "
            f"{fmt_bytes(int(w.get('resident_bytes', 0)))} resident")
    if "mapped_resident_bytes" in w:
        line += f" ({fmt_bytes(int(w['mapped_resident_bytes']))} of the file in memory now)"
    if "page_ins_per_token" in w:
        line += (f"; per token {w['page_ins_per_token']:.0f} page-ins, "
                 f"{fmt_bytes(int(w.get('read_bytes_per_token', 0)))} read")
    if "expert_hit_ratio" in w:
        line += f"; experts {w['expert_hit_ratio']:.0%} hit"
    return line


def ps(
    host: Annotated[str | None, typer.Option("--host")] = None,
    port: Annotated[int | None, typer.Option("--port")] = None,
    api_key: Annotated[str | None, typer.Option(
        "--api-key", help="The server's API key (default: config server.api_key)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON")] = False,
    timeout: TimeoutOpt = FIRST_TIMEOUT_S,
) -> None:
    """Models loaded by the running server: state (hot / warm), memory per device,
    context × slots, pinned, expiry and the reason for the last change. A busy server
    is asked again until it answers (said on stderr); an absent one is an error."""
    data = loaded_models(ServerClient.configured(host=host, port=port, api_key=api_key,
                                                 timeout=timeout))
    if as_json:
        print_json(data)
        return
    rows = [[clean_text(str(m.get("name"))), _state(m), _memory(m),
             f"{m.get('context_length', '')} × {m.get('slots', 1)}",
             human_until(str(m.get("expires_at") or "")),
             clean_text(str(m.get("reason") or ""))]
            for m in data.get("models", [])]
    for i, line in enumerate(render_table(rows, out.width)):
        out.print(Text(line, style="bold" if i < 2 and _is_header(line) else ""),
                  soft_wrap=True)
    for m in data.get("models", []):
        streams = streaming_line(clean_text(str(m.get("name"))), m.get("weights") or {})
        if streams:
            out.print(Text(streams), soft_wrap=True)


HEADERS = ("NAME", "STATE", "MEMORY", "CONTEXT", "UNTIL", "WHY")
GAP = "  "
WHY_MIN = 20  # a reason narrower than this says too little: it gets its own line


def render_table(rows: list[list[str]], width: int) -> list[str]:
    """The table's lines for a terminal `width` cells wide.

    Wide enough: one line per model (NAME STATE MEMORY CONTEXT UNTIL WHY), the reason
    cut with an ellipsis to the width left. Narrower (at 80 columns with real names):
    each model takes three lines, its whole name, then its state, memory, context and
    expiry under one header, then `why:` and its reason on one line. Names are never
    cut; a reason in full is in `ps --json`."""
    cols = [max([cell_len(h), *(cell_len(r[i]) for r in rows)])
            for i, h in enumerate(HEADERS[:5])]
    used = sum(cols) + len(GAP) * len(cols)
    longest_why = max((cell_len(r[5]) for r in rows), default=0)
    if width - used >= min(WHY_MIN, max(3, longest_why)):
        left = width - used
        return [_line([*HEADERS[:5], HEADERS[5]], cols),
                *(_line([*r[:5], _fit(r[5], left)], cols) for r in rows)]
    rest = cols[1:]
    lines = ["NAME", GAP + _line(list(HEADERS[1:5]), rest)]
    for r in rows:
        lines += [r[0], GAP + _line(r[1:5], rest)]
        if r[5]:
            lines.append(_fit(f"{GAP}why: {r[5]}", width))
    return lines


def _line(cells: list[str], widths: list[int]) -> str:
    """Cells padded to `widths` (the last cell, beyond them, as it is)."""
    padded = [c + " " * (w - cell_len(c)) for c, w in zip(cells, widths, strict=False)]
    return GAP.join([*padded, *cells[len(widths):]]).rstrip()


def _fit(text: str, width: int) -> str:
    """`text` cut to `width` cells, an ellipsis marking the cut."""
    if cell_len(text) <= width:
        return text
    cut = text
    while cut and cell_len(cut) > width - 1:
        cut = cut[:-1]
    return cut.rstrip() + "…"


def _is_header(line: str) -> bool:
    return line.startswith("NAME") or line.strip().startswith("STATE")


def human_until(expires_at: str, now: float | None = None) -> str:
    """An expiry as Ollama's `ps` shows it: "4 minutes from now", "Forever" (Ollama's
    far-future "never", and pins), "Stopping..." once past; text it cannot read as a
    time is shown as it is."""
    from datetime import datetime

    if not expires_at:
        return ""
    try:
        when = datetime.fromisoformat(expires_at).timestamp()
    except (ValueError, OverflowError, OSError):
        return clean_text(expires_at)
    now = time.time() if now is None else now
    left = when - now
    if left > 20 * 365 * 86400:
        return "Forever"
    if left <= 0:
        return "Stopping..."
    return f"{human_duration(left)} from now"


def human_duration(seconds: float) -> str:
    """Ollama's HumanDuration: "Less than a second", "30 seconds", "About a minute",
    "4 minutes", "About an hour", "3 hours", "5 days", "3 weeks", "4 months", "2 years"."""
    s = int(seconds)
    if s < 1:
        return "Less than a second"
    if s == 1:
        return "1 second"
    if s < 60:
        return f"{s} seconds"
    minutes = s // 60
    if minutes == 1:
        return "About a minute"
    if minutes < 60:
        return f"{minutes} minutes"
    hours = round(seconds / 3600)
    if hours == 1:
        return "About an hour"
    if hours < 48:
        return f"{hours} hours"
    if hours < 24 * 7 * 2:
        return f"{hours // 24} days"
    if hours < 24 * 30 * 2:
        return f"{hours // 24 // 7} weeks"
    if hours < 24 * 365 * 2:
        return f"{hours // 24 // 30} months"
    return f"{int(seconds / 3600 / 24 / 365)} years"


def _state(m: dict[str, Any]) -> str:
    state = str(m.get("state", "hot"))
    return state + (" (pinned)" if m.get("pinned") else "")


def _memory(m: dict[str, Any]) -> str:
    """Per device ('CPU 512 MiB, CUDA0 4.1 GiB'), or the total from a plain Ollama."""
    by_device = m.get("memory_by_device") or {}
    if not by_device:
        return fmt_bytes(int(m.get("size", 0)))
    shown = ", ".join(f"{clean_text(str(d))} {fmt_bytes(int(b))}" for d, b in by_device.items())
    kv = int(m.get("kv_cache_ram") or 0)  # the KV cache's RAM tier, within the CPU figure
    return shown + (f" (KV cache {fmt_bytes(kv)})" if kv else "")
