"""`inferenceos profile [MODEL]`: one run broken down by phase (load, tokenize, prefill
chunks, decode steps, sampling, detokenize) into a self-contained HTML report with a
timeline."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from inferenceos.cli.console import err, out, print_json
from inferenceos.cli.gen_opts import (
    MaxTokensOpt,
    RunModelArg,
    SeedOpt,
    TemperatureOpt,
    VerboseLogOpt,
)
from inferenceos.cli.model_arg import resolve_model
from inferenceos.errors import UsageError

if TYPE_CHECKING:
    from inferenceos.plan.plan import Plan

DEFAULT_PROMPT_REPEATS = 4  # the built-in prose four times: ~200 tokens


ProfilePromptOpt = Annotated[str | None, typer.Option(
    "--prompt", "-p", help="Prompt, sent as is (default: built-in prose of ~200 tokens)")]
OutputOpt = Annotated[
    Path, typer.Option("--output", "-o", help="Where to write the HTML report")]
PlannedCtxOpt = Annotated[int, typer.Option("--ctx", help="Context size (0: planned)")]
PlannedThreadsOpt = Annotated[
    int, typer.Option("--threads", help="CPU threads (0: planned)")]
ChunkOpt = Annotated[int, typer.Option("--batch", help="Prefill chunk size (0: planned)")]
ProfileJsonOpt = Annotated[
    bool, typer.Option("--json", help="Print the phases and every step as JSON")]


def profile(
    model: RunModelArg = "", prompt: ProfilePromptOpt = None, max_tokens: MaxTokensOpt = 64,
    output: OutputOpt = Path("profile.html"), ctx: PlannedCtxOpt = 0,
    threads: PlannedThreadsOpt = 0, batch: ChunkOpt = 0, temperature: TemperatureOpt = 0.8,
    seed: SeedOpt = None, as_json: ProfileJsonOpt = False, verbose: VerboseLogOpt = False,
) -> None:
    """Profile one generation and write an HTML report with a timeline of its phases."""
    from inferenceos.app.profile import profile_prompt
    from inferenceos.engine.llama.lib import log
    from inferenceos.engine.sampling import SamplingParams
    from inferenceos.model.spec import load_spec
    from inferenceos.tuning.trials import PROSE

    _check_output(output)
    params = SamplingParams(temperature=temperature, seed=seed, max_tokens=max_tokens)
    params.validate()  # UsageError for a value out of range
    text = prompt if prompt is not None else PROSE * DEFAULT_PROMPT_REPEATS
    spec = load_spec(resolve_model(model))
    log().echo = verbose
    data = profile_prompt(spec.path, text, params, output, ctx=ctx, threads=threads,
                          batch=batch, on_plan=_print_plan)
    if as_json:
        print_json({**data, "report": str(output)})
        return
    _print_phases(data)
    err.print(f"report written to {output}", style="dim")


def _print_plan(plan: Plan) -> None:
    """The plan's line, dim, on stderr (without run's list of changes, as before)."""
    err.print(plan.summary(), style="dim", markup=False)


def _check_output(output: Path) -> None:
    """UsageError unless --output names an .html file in a folder that exists."""
    if output.suffix.lower() not in (".html", ".htm"):
        raise UsageError(f"--output writes HTML: give a file name ending in .html, not {output}")
    if not output.parent.is_dir():
        raise UsageError(f"--output: the folder {output.parent} does not exist")


def _print_phases(data: dict[str, Any]) -> None:
    """Where the time went, one row a phase, and the run's rates under it."""
    from rich.table import Table

    table = Table(title="where the time went", title_justify="left", show_edge=False)
    for col in ("phase", "steps", "total ms", "mean ms", "longest ms", "share"):
        table.add_column(col, justify="left" if col == "phase" else "right")
    for r in data["phases"]:
        table.add_row(r["phase"], str(r["steps"]), f"{r['total_s'] * 1000:,.1f}",
                      f"{r['mean_ms']:,.2f}", f"{r['max_ms']:,.2f}",
                      f"{r['share'] * 100:.1f} %")
    out.print(table)
    out.print(f"prompt {data['prompt_tokens']} tok at {data['prefill_tps']:,.1f} t/s · "
              f"generated {data['completion_tokens']} tok at {data['decode_tps']:,.1f} t/s · "
              f"total {data['total_s']:.2f} s")
