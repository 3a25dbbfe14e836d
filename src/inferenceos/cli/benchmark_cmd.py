"""`inferenceos benchmark [MODEL]`: a matrix of threads × batch × context × concurrency
through the serving engine, against llama.cpp's defaults measured in the same run, as a
table, `--json`, and a `--chart FILE.png`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from inferenceos.cli.console import err, out, print_json, safe_text
from inferenceos.cli.gen_opts import RunModelArg
from inferenceos.cli.model_arg import resolve_model
from inferenceos.errors import UsageError

if TYPE_CHECKING:
    from inferenceos.tuning.matrix import Point, Row


def parse_list(text: str, option: str) -> list[int]:
    """`"1,2,4"` → [1, 2, 4]; a clear UsageError for anything else."""
    try:
        values = [int(part) for part in text.replace(" ", "").split(",") if part]
    except ValueError:
        raise UsageError(f"{option} takes comma-separated whole numbers, got {text!r}") from None
    if not values or min(values) < 1:
        raise UsageError(f"{option} takes positive whole numbers, got {text!r}")
    return values


def _default_threads() -> str:
    from inferenceos.tuning.space import usable_threads

    n = usable_threads()
    return ",".join(str(t) for t in dict.fromkeys((max(1, n // 2), n)))


def _rate(v: float) -> str:
    """At most 5 characters: 12.3, 456, 7890, 12.3k."""
    return f"{v / 1000:.1f}k" if v >= 10_000 else f"{v:.0f}" if v >= 100 else f"{v:.1f}"


def _times(x: float) -> str:
    return f"{x:.2f}" if x < 10 else f"{x:.1f}" if x < 100 else f"{x:.0f}"


def _table(rows: list[Row]) -> None:
    from rich import box
    from rich.table import Table

    base = rows[0]
    # compact enough for an 80-column terminal
    table = Table(title="benchmark: t/s, and × llama.cpp's defaults (the * row)",
                  title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False,
                  collapse_padding=True)
    for col in ("", "thr", "batch", "ctx", "strm", "prefill", "×", "decode", "×", "total",
                "×", "TTFT"):
        table.add_column(col, justify="left" if not col else "right")
    for r in rows:
        p = r.point
        head = ["*" if p.baseline else "", str(p.threads), str(p.n_batch), str(p.n_ctx),
                str(p.concurrency)]
        if r.error:
            table.add_row(*head, "[red]failed[/]", "", safe_text(r.error[:40]), "", "", "", "")
            continue
        table.add_row(
            *head,
            _rate(r.prefill_tps), _times(r.ratio(base, 'prefill_tps')),
            _rate(r.decode_tps), _times(r.ratio(base, 'decode_tps')),
            _rate(r.total_tps), _times(r.ratio(base, 'total_tps')),
            f"{r.ttft_s * 1000:.0f}ms",
            style="bold" if p.baseline else None,
        )
    out.print(table)
    out.print(
        "decode: t/s of one stream (mean); total: t/s of all streams together; "
        "TTFT: mean time to first token",
        style="dim",
    )


ThreadListOpt = Annotated[str | None, typer.Option(
    "--threads",
    help="Thread counts, comma-separated (default: half and all of the usable cores)")]
BatchListOpt = Annotated[
    str, typer.Option("--batch", help="Batch sizes (n_batch), comma-separated")]
CtxListOpt = Annotated[
    str, typer.Option("--ctx", help="Context sizes per stream, comma-separated")]
ConcurrencyListOpt = Annotated[
    str, typer.Option("--concurrency", help="Simultaneous streams, comma-separated")]
StreamPromptOpt = Annotated[
    int, typer.Option("--prompt-tokens", help="Prompt length of each stream")]
GenTokensOpt = Annotated[int, typer.Option("--gen-tokens", help="Tokens each stream generates")]
RoundsOpt = Annotated[
    int, typer.Option("--rounds", help="Rounds per point (the median is shown)")]
MatrixJsonOpt = Annotated[bool, typer.Option("--json", help="Print the matrix as JSON")]
ChartOpt = Annotated[
    Path | None, typer.Option("--chart", help="Also draw the matrix into this PNG file")]


def benchmark(
    model: RunModelArg = "", threads: ThreadListOpt = None, batch: BatchListOpt = "64,512",
    ctx: CtxListOpt = "512,4096", concurrency: ConcurrencyListOpt = "1,4",
    prompt_tokens: StreamPromptOpt = 128, gen_tokens: GenTokensOpt = 32, rounds: RoundsOpt = 1,
    as_json: MatrixJsonOpt = False, chart: ChartOpt = None,
) -> None:
    """Measure prefill, decode and aggregate t/s over a matrix of settings, with
    llama.cpp's defaults as the baseline row."""
    from inferenceos.model.spec import load_spec
    from inferenceos.tuning.matrix import points

    pts = points(parse_list(threads or _default_threads(), "--threads"),
                 parse_list(batch, "--batch"), parse_list(ctx, "--ctx"),
                 parse_list(concurrency, "--concurrency"))
    if chart is not None and chart.suffix.lower() != ".png":
        raise UsageError(f"--chart writes a PNG: give a file name ending in .png, not {chart}")
    if chart is not None and not chart.parent.is_dir():
        raise UsageError(f"--chart: the folder {chart.parent} does not exist")
    spec = load_spec(resolve_model(model))
    rows = _measure(spec.path, pts, prompt_tokens, gen_tokens, rounds)
    if chart is not None:
        from inferenceos.tuning.chart import write_chart

        write_chart(rows, chart, f"{spec.path.name}: {prompt_tokens} prompt + {gen_tokens} "
                                 "generated tokens per stream")
    if as_json:
        base = rows[0]
        print_json({
            "model": str(spec.path),
            "prompt_tokens": prompt_tokens,
            "gen_tokens": gen_tokens,
            "rounds": rounds,
            "baseline": base.to_json(),
            "rows": [r.to_json(base) for r in rows],
            "chart": str(chart) if chart is not None else None,
        })
    else:
        _table(rows)
        if chart is not None:
            err.print(f"chart written to {chart}", style="dim")


def _measure(path: Path, pts: list[Point], prompt_tokens: int, gen_tokens: int,
             rounds: int) -> list[Row]:
    """app/benchmark.measure, with a transient progress bar on stderr."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from inferenceos.app.benchmark import measure

    progress = Progress(TextColumn("[bold]benchmark[/]"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("{task.description}"), console=err,
                        transient=True)
    with progress:
        task = progress.add_task("starting", total=len(pts))

        def on_row(row: Row) -> None:
            progress.update(task, advance=1, description=row.point.label())

        return measure(path, pts, prompt_tokens, gen_tokens, rounds, on_row=on_row)
