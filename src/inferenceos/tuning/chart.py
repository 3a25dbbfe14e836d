"""The benchmark matrix as a PNG chart (matplotlib, no display needed).

Three panels side by side — prefill t/s, decode t/s per stream, total decode t/s over
the streams — with one horizontal bar per row of the matrix. The baseline (llama.cpp's
defaults) is drawn in its own colour, with a dashed line at its value across each panel,
and each bar is labelled with its value and its ratio to the baseline.
"""

from __future__ import annotations

from pathlib import Path

from inferenceos.errors import UsageError
from inferenceos.tuning.matrix import Row

_PANELS = (
    ("prefill_tps", "prefill t/s"),
    ("decode_tps", "decode t/s per stream"),
    ("total_tps", "decode t/s, all streams"),
)
_BASE_COLOUR = "#d95f02"
_ROW_COLOUR = "#1b9e77"
_FAILED_COLOUR = "#bbbbbb"


# bars spanning more than this factor are drawn on a log axis (a collapsed baseline, e.g.
# two threads fighting a busy neighbour at 3 t/s beside 7000, would be invisible)
LOG_RANGE = 50.0


def write_chart(rows: list[Row], path: Path, title: str) -> Path:
    """Draw `rows` (the baseline first) into the PNG `path`; returns `path`.

    Raises UsageError when the file cannot be written (a missing folder, no permission).
    """
    import matplotlib

    matplotlib.use("Agg")  # no display: render to a file only
    import matplotlib.pyplot as plt

    base = rows[0]
    labels = [r.point.label() + (" (failed)" if r.error else "") for r in rows]
    height = max(3.0, 0.42 * len(rows) + 1.6)
    fig, axes = plt.subplots(1, len(_PANELS), figsize=(16, height), sharey=True)
    try:
        for ax, (key, name) in zip(axes, _PANELS, strict=True):
            values = [getattr(r, key) for r in rows]
            colours = [_FAILED_COLOUR if r.error else
                       _BASE_COLOUR if r.point.baseline else _ROW_COLOUR
                       for r in rows]
            ys = list(range(len(rows)))
            ax.barh(ys, values, color=colours)
            ref = getattr(base, key)
            if ref > 0:
                ax.axvline(ref, color=_BASE_COLOUR, linestyle="--", linewidth=1)
            top = max(values) if values and max(values) > 0 else 1.0
            low = min((v for v in values if v > 0), default=top)
            log = top / low > LOG_RANGE  # a linear axis would hide the small bars
            for y, r, v in zip(ys, rows, values, strict=True):
                value = f"{v:,.1f}" if v < 100 else f"{v:,.0f}"
                ratio = f"  {v / ref:.2f}x" if ref > 0 and not r.point.baseline else ""
                text = "failed" if r.error else value + ratio
                ax.text(v * 1.05 if log else v + top * 0.01, y, text, va="center", fontsize=8)
            if log:
                ax.set_xscale("log")
                ax.set_xlim(low / 2, top * 4)
            else:
                ax.set_xlim(0, top * 1.3)
            ax.set_title(name)
            ax.set_xlabel("tokens / s")
            ax.grid(axis="x", alpha=0.3)
        axes[0].set_yticks(list(range(len(rows))), labels, fontsize=8)
        axes[0].invert_yaxis()  # the baseline on top
        fig.suptitle(title)
        fig.tight_layout()
        try:
            fig.savefig(path, dpi=110)
        except OSError as exc:
            raise UsageError(f"cannot write the chart to {path}: {exc.strerror or exc}") from exc
    finally:
        plt.close(fig)
    return path
