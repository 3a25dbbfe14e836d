"""A profiled run as one self-contained HTML page: inline CSS and SVG, no script, no
fonts or styles from the network, so it opens anywhere (an air-gapped machine, a mail
attachment) and shows the same thing.

Sections: the run's figures; a timeline with one lane per phase and one rectangle per
step (hover for its name and duration); the share of each phase as a stacked bar and a
table; the latency of every decode step (where jitter shows). Every text that comes from
the model or the user is escaped.
"""

from __future__ import annotations

import math
from html import escape
from pathlib import Path
from typing import Any

from inferenceos.atomic import write_text_atomic
from inferenceos.errors import UsageError
from inferenceos.tuning.profiler import PHASES, Profile

COLOURS = {
    "load": "#7570b3",
    "tokenize": "#66a61e",
    "prefill": "#d95f02",
    "decode": "#1b9e77",
    "sampling": "#e7298a",
    "detokenize": "#a6761d",
    "other": "#bbbbbb",
}
_W = 1100  # drawing width of the charts, px
_LABEL_W = 90
_LANE_H = 28

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 24px;
       color: #222; max-width: 1180px; }
h1 { font-size: 20px; margin-bottom: 4px; } h2 { font-size: 16px; margin-top: 28px; }
.meta { color: #555; font-size: 13px; }
.figures { display: flex; gap: 28px; margin: 14px 0; flex-wrap: wrap; }
.figures div { font-size: 13px; color: #555; }
.figures b { display: block; font-size: 22px; color: #222; }
table { border-collapse: collapse; font-size: 13px; }
th, td { padding: 4px 10px; border-bottom: 1px solid #ddd; text-align: right; }
th:first-child, td:first-child { text-align: left; }
.swatch { display: inline-block; width: 10px; height: 10px; margin-right: 6px; }
pre { background: #f6f6f6; padding: 10px; white-space: pre-wrap; font-size: 13px; }
svg text { font-size: 11px; fill: #333; }
"""


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:,.1f} ms" if seconds < 10 else f"{seconds:,.2f} s"


def _step_ms(row: dict[str, Any], key: str) -> str:
    return f"{row[key]:,.2f} ms" if row["steps"] else ""


def _ticks(total: float, n: int = 8) -> list[float]:
    """Round tick values (1, 2 or 5 times a power of ten) from 0 to `total`, about `n`."""
    if total <= 0:
        return [0.0]
    raw = total / n
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    return [i * step for i in range(int(total / step) + 1)]


def timeline_svg(p: Profile) -> str:
    """One lane per phase, one rectangle per span, a time axis in milliseconds."""
    total = p.total_s or 1e-9
    lanes = [ph for ph in PHASES if any(s.phase == ph for s in p.spans)]
    height = _LANE_H * len(lanes) + 34
    scale = (_W - _LABEL_W - 10) / total
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{height}" '
           f'role="img" aria-label="timeline">']
    for i, ph in enumerate(lanes):
        y = i * _LANE_H
        out.append(f'<rect x="{_LABEL_W}" y="{y}" width="{_W - _LABEL_W - 10}" '
                   f'height="{_LANE_H - 4}" fill="#f3f3f3"/>')
        out.append(f'<text x="4" y="{y + _LANE_H / 2 + 2}">{ph}</text>')
        for s in (s for s in p.spans if s.phase == ph):
            x = _LABEL_W + s.start_s * scale
            w = max(s.duration_s * scale, 1.0)
            tip = f"{s.phase}: {s.name} — {_ms(s.duration_s)} at {_ms(s.start_s)}"
            out.append(f'<rect class="span" data-phase="{ph}" x="{x:.2f}" y="{y + 2}" '
                       f'width="{w:.2f}" height="{_LANE_H - 8}" fill="{COLOURS[ph]}">'
                       f'<title>{escape(tip)}</title></rect>')
    axis_y = _LANE_H * len(lanes) + 4
    out.append(f'<line x1="{_LABEL_W}" y1="{axis_y}" x2="{_W - 10}" y2="{axis_y}" '
               'stroke="#999"/>')
    for t in _ticks(total):
        x = _LABEL_W + t * scale
        out.append(f'<line x1="{x:.1f}" y1="{axis_y}" x2="{x:.1f}" y2="{axis_y + 5}" '
                   f'stroke="#999"/><text x="{x:.1f}" y="{axis_y + 18}" '
                   f'text-anchor="middle">{t * 1000:,.0f} ms</text>')
    out.append("</svg>")
    return "\n".join(out)


def shares_svg(p: Profile) -> str:
    """The phases' shares of the run as one stacked bar."""
    rows = p.summary()
    total = sum(r["total_s"] for r in rows) or 1e-9
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="44" role="img" '
           'aria-label="phase shares">']
    x = 0.0
    for r in rows:
        w = r["total_s"] / total * (_W - 10)
        out.append(f'<rect x="{x:.2f}" y="0" width="{max(w, 0.5):.2f}" height="24" '
                   f'fill="{COLOURS[r["phase"]]}"><title>{r["phase"]}: '
                   f'{r["share"] * 100:.1f} %</title></rect>')
        if w > 60:
            out.append(f'<text x="{x + 4:.1f}" y="38">{r["phase"]} '
                       f'{r["share"] * 100:.0f} %</text>')
        x += w
    out.append("</svg>")
    return "\n".join(out)


def decode_steps_svg(p: Profile) -> str:
    """One bar per decode step: its latency in ms (the dashed line is the median)."""
    steps = [s for s in p.spans if s.phase == "decode"]
    if not steps:
        return "<p>No decode steps (the model stopped at its first token).</p>"
    h, pad = 160, 40
    top = max(s.duration_s for s in steps) * 1.15 or 1e-9
    bw = (_W - pad - 10) / len(steps)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{h + 24}" '
           'role="img" aria-label="decode step latency">']
    for i, s in enumerate(steps):
        bh = s.duration_s / top * h
        out.append(f'<rect x="{pad + i * bw:.2f}" y="{h - bh:.2f}" '
                   f'width="{max(bw - 1, 0.8):.2f}" height="{bh:.2f}" '
                   f'fill="{COLOURS["decode"]}"><title>{escape(s.name)}: '
                   f'{_ms(s.duration_s)}</title></rect>')
    med = sorted(s.duration_s for s in steps)[len(steps) // 2]
    y = h - med / top * h
    out.append(f'<line x1="{pad}" y1="{y:.1f}" x2="{_W - 10}" y2="{y:.1f}" stroke="#333" '
               f'stroke-dasharray="4 3"/><text x="{pad + 4}" y="{y - 4:.1f}">median '
               f'{_ms(med)}</text>')
    out.append(f'<text x="0" y="12">{_ms(top)}</text><text x="0" y="{h}">0</text>')
    out.append(
        f'<text x="{pad}" y="{h + 18}">step 1</text>'
        f'<text x="{_W - 10}" y="{h + 18}" text-anchor="end">step {len(steps)}</text>'
    )
    out.append("</svg>")
    return "\n".join(out)


def render_html(p: Profile) -> str:
    """The whole page."""
    rates = p.rates()
    settings = " · ".join(f"{k} {v}" for k, v in p.settings.items())
    table = ["<table><tr><th>phase</th><th>steps</th><th>total</th><th>mean</th>"
             "<th>longest</th><th>share</th><th>tokens</th></tr>"]
    for r in p.summary():
        table.append(
            f'<tr><td><span class="swatch" style="background:{COLOURS[r["phase"]]}"></span>'
            f'{r["phase"]}</td><td>{r["steps"] or ""}</td><td>{_ms(r["total_s"])}</td>'
            f'<td>{_step_ms(r, "mean_ms")}</td><td>{_step_ms(r, "max_ms")}</td>'
            f'<td>{r["share"] * 100:.1f} %</td><td>{r["tokens"] or ""}</td></tr>')
    table.append("</table>")
    chunks = [s for s in p.spans if s.phase == "prefill"]
    chunk_rows = "".join(
        f"<tr><td>{escape(s.name)}</td><td>{_ms(s.duration_s)}</td>"
        f"<td>{s.tokens / s.duration_s if s.duration_s else 0:,.0f} t/s</td></tr>"
        for s in chunks
    )
    figures = [
        ("total", _ms(p.total_s)),
        ("load", _ms(sum(s.duration_s for s in p.spans if s.phase == "load"))),
        ("prompt", f"{p.prompt_tokens} tok"),
        ("prefill", f"{rates['prefill_tps']:,.1f} t/s"),
        ("generated", f"{p.completion_tokens} tok"),
        ("decode", f"{rates['decode_tps']:,.1f} t/s"),
    ]
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>InferenceOS profile — {escape(Path(p.model).name)}</title>
<style>{_CSS}</style></head>
<body>
<h1>Profile of one run — {escape(Path(p.model).name)}</h1>
<div class="meta">{escape(p.model)}<br>{escape(settings)}</div>
<div class="figures">{"".join(f"<div><b>{v}</b>{k}</div>" for k, v in figures)}</div>
<h2>Timeline</h2>
{timeline_svg(p)}
<h2>Where the time went</h2>
{shares_svg(p)}
{"".join(table)}
<h2>Prefill chunks</h2>
<table><tr><th>chunk</th><th>time</th><th>rate</th></tr>{chunk_rows}</table>
<h2>Decode step latency</h2>
{decode_steps_svg(p)}
<h2>Generated text</h2>
<pre>{escape(p.text)}</pre>
</body></html>
"""


def write_report(p: Profile, path: Path) -> Path:
    """Write the page to `path` atomically. UsageError when it cannot be written."""
    try:
        write_text_atomic(path, render_html(p))
    except OSError as exc:
        raise UsageError(f"cannot write the report to {path}: {exc.strerror or exc}") from exc
    return path
