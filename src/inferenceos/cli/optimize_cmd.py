"""`inferenceos optimize [MODEL] [--budget SECONDS] [--json]`: find the fastest settings
for a model on this machine by short real trials, and store them for `run` and `serve`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from inferenceos.cli.console import err, out, print_json, safe_text
from inferenceos.cli.gen_opts import RunModelArg, VerboseLogOpt
from inferenceos.cli.model_arg import resolve_model
from inferenceos.errors import InferenceOSError, UsageError

if TYPE_CHECKING:
    from inferenceos.tuning.search import SearchResult

MIN_BUDGET_S = 5.0


def _has_gpu() -> bool:
    """An accelerator here that this llama.cpp build can offload to."""
    from inferenceos.engine.llama.lib import lib
    from inferenceos.plan.devices import local_machine

    return bool(lib().llama_supports_gpu_offload()) and bool(local_machine().accelerators)


def _report_baseline_only(result: SearchResult) -> None:
    """The budget paid for the baseline alone: its figures, and no trials table."""
    base = result.baseline_measured
    out.print(
        f"baseline (llama.cpp defaults)  {result.baseline.label()}\n"
        f"  prefill {base['prefill_tps']:,.1f} t/s · decode {base['decode_tps']:,.1f} t/s"
    )


def _needed_budget(result: SearchResult) -> int:
    """A budget that pays for a search: about a dozen trials like the baseline, in
    whole tens of seconds (at least 30)."""
    first = result.trials[0].elapsed_s if result.trials else MIN_BUDGET_S
    return max(30, int(-(-12 * first // 10) * 10))


def _report(result: SearchResult) -> None:
    from rich import box
    from rich.table import Table

    # compact enough for an 80-column terminal; errors in full are in --json
    table = Table(title="search trials (t/s)", title_justify="left", box=box.SIMPLE_HEAD,
                  pad_edge=False, collapse_padding=True)
    for col in ("dimension", "settings", "prefill", "decode", ""):
        table.add_column(col, justify="right" if col in ("prefill", "decode") else "left",
                         no_wrap=col == "settings")
    for t in result.trials:
        if t.phase != "search":
            continue
        status = "refused" if t.error else "stopped" if t.stopped_early else ""
        table.add_row(t.dimension, t.knobs.label(), f"{t.prefill_tps:,.1f}",
                      f"{t.decode_tps:,.1f}" if t.decode_tokens else "—", status)
    if table.row_count:
        out.print(table)
    base, best, r = result.baseline_measured, result.best_measured, result.ratios
    out.print(
        f"\nbaseline (llama.cpp defaults)  {result.baseline.label()}\n"
        f"  prefill {base['prefill_tps']:,.1f} t/s · decode {base['decode_tps']:,.1f} t/s"
    )
    out.print(f"best                           {result.best.label()}\n"
              f"  prefill {best['prefill_tps']:,.1f} t/s ({r['prefill']:.2f}x) · decode "
              f"{best['decode_tps']:,.1f} t/s ({r['decode']:.2f}x)", style="bold")
    for note in result.notes:
        out.print(f"note: {note}", style="yellow")
    stopped = sum(t.stopped_early for t in result.trials)
    failed = sum(bool(t.error) for t in result.trials)
    n = result.confirm_rounds
    conf = f", confirmed over {n} paired round{'s' if n > 1 else ''}" if n else ""
    err.print(f"{len(result.trials)} trials in {result.elapsed_s:.0f} s ({stopped} stopped "
              f"early as hopeless, {failed} refused by llama.cpp){conf}; "
              f"{'search complete' if result.ended == 'searched' else 'budget reached'}. "
              "Stored as this machine's best settings for the model: `run` and `serve` "
              "use them.", style="dim")


BudgetOpt = Annotated[
    float, typer.Option("--budget", help="Seconds the whole search may take")]
OptimizeJsonOpt = Annotated[
    bool, typer.Option("--json", help="Print the baseline, best and every trial as JSON")]


def optimize(
    model: RunModelArg = "", budget: BudgetOpt = 120, as_json: OptimizeJsonOpt = False,
    verbose: VerboseLogOpt = False,
) -> None:
    """Search threads, batch sizes, flash attention, KV types (and GPU layers) by short
    real trials; store the fastest settings for this machine and model."""
    if not budget >= MIN_BUDGET_S:
        raise UsageError(f"--budget must be at least {MIN_BUDGET_S:.0f} seconds")
    from inferenceos.engine.llama.lib import log
    from inferenceos.model.spec import load_spec

    spec = load_spec(resolve_model(model))
    log().echo = verbose
    result, stored = _search(spec.path, spec.block_count, budget)
    if as_json:
        print_json({**result.to_json(), "stored": stored})
    elif stored:
        _report(result)
    else:
        _report_baseline_only(result)
    if not stored:
        raise InferenceOSError(
            f"--budget {budget:g} s paid for the baseline trial only "
            f"({result.trials[0].elapsed_s:.1f} s): nothing was compared and nothing "
            f"stored; give it --budget {_needed_budget(result)} or more")


def _search(path: Path, n_layers: int, budget: float) -> tuple[SearchResult, bool]:
    """app/optimize.optimize_model, with a transient progress bar on stderr (time spent
    against the budget, trials, the one just run)."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from inferenceos.app.optimize import optimize_model
    from inferenceos.tuning.trials import TrialResult

    has_gpu = _has_gpu()
    progress = Progress(TextColumn("[bold]optimize[/]"), BarColumn(), TimeElapsedColumn(),
                        TextColumn("/ {task.total:.0f} s · {task.fields[trials]} trials · "
                                   "{task.description}"),
                        console=err, transient=True)
    with progress:
        task = progress.add_task("baseline", total=budget, trials=0)
        count = 0
        elapsed = 0.0

        def on_trial(res: TrialResult) -> None:
            nonlocal count, elapsed
            count += 1
            elapsed += res.elapsed_s
            what = f"{res.phase} {res.dimension} {res.knobs.label()}".replace("  ", " ")
            progress.update(task, completed=min(elapsed, budget), trials=count,
                            description=safe_text(what))

        return optimize_model(path, n_layers, budget, has_gpu=has_gpu, on_trial=on_trial)
