"""`inferenceos run [MODEL] --prompt TEXT`: one prompt, streamed, then a metrics footer."""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from inferenceos import interrupt
from inferenceos.app.run import PromptShape, plan_for, run_prompt
from inferenceos.cli.cluster_opts import GpuCapOpt, RamCapOpt, RpcOpt
from inferenceos.cli.console import err, print_json
from inferenceos.cli.gen_opts import (
    AudioOpt,
    BatchOpt,
    IgnoreEosOpt,
    ImageOpt,
    JsonOpt,
    LoadOptions,
    LoraOpt,
    MaxTokensOpt,
    MinPOpt,
    PromptOpt,
    RawOpt,
    ReasoningBudgetOpt,
    RunCtxOpt,
    RunKvPolicyOpt,
    RunModelArg,
    SamplingOptions,
    SeedOpt,
    StopOpt,
    SystemOpt,
    TemperatureOpt,
    TemplateOpt,
    TopKOpt,
    TopPOpt,
    VerboseLogOpt,
)
from inferenceos.cli.model_arg import resolve_model
from inferenceos.cli.plan_opts import (
    BackendOpt,
    CacheTypeKOpt,
    CacheTypeVOpt,
    DraftOpt,
    FlashAttnOpt,
    GpuLayersOpt,
    KvQualityOpt,
    MmprojOpt,
    PolicyOpt,
    ThreadsOpt,
    draft_choice,
    flash_attn_choice,
)
from inferenceos.errors import UsageError

if TYPE_CHECKING:  # the engine, gguf, numpy, jinja2 and Pillow load only when a run starts
    from inferenceos.engine.generation import GenerationMetrics
    from inferenceos.plan.entry import LoadRequest
    from inferenceos.plan.plan import Plan


def _read_prompt(prompt: str | None) -> str:
    if prompt is not None:
        return prompt
    if not sys.stdin.isatty():
        text = sys.stdin.read()
        if text.strip():
            return text
    raise UsageError("no prompt: pass --prompt TEXT or pipe the prompt on stdin")


def _plan_here(path: Path, req: LoadRequest) -> Plan:
    """Ask the planner how to load the model here now; print its plan line."""
    plan = plan_for(path, req)
    _print_plan(plan)
    return plan


def _print_plan(plan: Plan) -> None:
    """The plan's line and each change from the request, dim, on stderr."""
    err.print(plan.summary(), style="dim", markup=False)
    for change in plan.changes:
        err.print(f"  {change}", style="dim", markup=False)


def footer(m: GenerationMetrics) -> str:
    """The one-line summary printed after a streamed answer."""
    return (
        f"load {m.load_s:.2f}s · prompt {m.prompt_tokens} tok at {m.prompt_tps:.1f} t/s · "
        f"TTFT {m.ttft_s * 1000:.0f} ms · generated {m.completion_tokens} tok at "
        f"{m.decode_tps:.1f} t/s · stop: {m.stop_reason}"
    ) + (f" · draft {m.draft}: {m.acceptance_rate:.0%} accepted, "
         f"{m.tokens_per_step:.2f} tok/step" if m.draft else "")


def run(
    model: RunModelArg = "", prompt: PromptOpt = None, system: SystemOpt = None,
    raw: RawOpt = False, template: TemplateOpt = None, max_tokens: MaxTokensOpt = 256,
    temperature: TemperatureOpt = 0.8, top_k: TopKOpt = 40, top_p: TopPOpt = 0.95,
    min_p: MinPOpt = 0.05, seed: SeedOpt = None, stop: StopOpt = None,
    ignore_eos: IgnoreEosOpt = False, ctx: RunCtxOpt = 0, threads: ThreadsOpt = 0,
    batch: BatchOpt = 0, gpu_layers: GpuLayersOpt = None, backend: BackendOpt = None,
    cache_type_k: CacheTypeKOpt = None, cache_type_v: CacheTypeVOpt = None,
    flash_attn: FlashAttnOpt = "auto", policy: PolicyOpt = "balanced",
    kv_quality: KvQualityOpt = None, kv_policy: RunKvPolicyOpt = "none", rpc: RpcOpt = None,
    ram: RamCapOpt = None, gpu_memory: GpuCapOpt = None, as_json: JsonOpt = False,
    verbose: VerboseLogOpt = False, draft: DraftOpt = None, image: ImageOpt = None,
    audio: AudioOpt = None, mmproj: MmprojOpt = None, lora: LoraOpt = None,
    reasoning_budget: ReasoningBudgetOpt = -1,
) -> None:
    """Generate a completion for one prompt, streaming tokens as they come.

    Without a prompt at a terminal, chat interactively instead (as `ollama run` does).
    Ctrl-C stops it at any moment: exit 130, with the footer once the model is loaded
    (`stop: interrupted`), one line before."""
    interrupt.install()
    sampling = SamplingOptions(temperature, top_k, top_p, min_p, seed, max_tokens,
                               tuple(stop or ()), ignore_eos, tuple(lora or ()))
    load = LoadOptions(ctx, threads, gpu_layers, backend, cache_type_k, cache_type_v,
                       flash_attn, policy, kv_quality, kv_policy, rpc, ram, gpu_memory,
                       draft, mmproj)
    if prompt is None and sys.stdin.isatty() and sys.stdout.isatty() and not as_json:
        from inferenceos.cli.chat_cmd import start_chat

        start_chat(model, system=system, ctx=ctx, threads=threads, verbose=verbose,
                   options=sampling.chat_options(),
                   load={"mmproj": mmproj, "gpu_layers": gpu_layers, "backend": backend,
                         "draft": draft_choice(draft)})
        return
    text = _read_prompt(prompt)
    params = sampling.params()
    shape = PromptShape(system, raw, template, tuple(image or ()), tuple(audio or ()),
                        reasoning_budget)
    writers = _writers()
    result = run_prompt(
        model, resolve_model(model), text, shape, params,
        request=partial(load.request, n_batch=batch),
        flash_attn=partial(flash_attn_choice, flash_attn), kv_policy=kv_policy,
        mmproj=mmproj, verbose=verbose, on_plan=_print_plan,
        on_text=_no_text if as_json else writers[0],
        on_reasoning=_no_text if as_json else writers[1])
    if as_json:
        out = {"text": result.text, "metrics": result.metrics.to_json()}
        if result.reasoning:
            out["reasoning"] = result.reasoning
        print_json(out)
    else:
        sys.stdout.write("\n")
        sys.stdout.flush()
        err.print(footer(result.metrics), style="dim")
    if result.interrupted:
        raise typer.Exit(130)


def _write_text(text: str) -> None:
    """A streamed piece, on stdout at once (flushed: the reader watches it come)."""
    if text:
        sys.stdout.write(text)
        sys.stdout.flush()


def _writers() -> tuple[Callable[[str], None], Callable[[str], None]]:
    """(answer, reasoning) writers for a thinking model's reply: on a terminal the
    reasoning is dimmed on stdout, a blank line before the answer; piped, it goes to
    stderr, so that stdout holds the answer alone."""
    import os

    tty = sys.stdout.isatty()
    dim = tty and not os.environ.get("NO_COLOR")
    state = {"reasoning": False, "text": False}

    def reasoning(piece: str) -> None:
        if not piece:
            return
        if not state["reasoning"]:
            piece = piece.lstrip("\n")
        state["reasoning"] = True
        stream = sys.stdout if tty else sys.stderr
        stream.write(f"\x1b[2m{piece}\x1b[0m" if dim else piece)
        stream.flush()

    def text(piece: str) -> None:
        if piece and state["reasoning"] and not state["text"]:
            (sys.stdout.write("\n\n") if tty else sys.stderr.write("\n"))
        state["text"] = state["text"] or bool(piece)
        _write_text(piece)

    return text, reasoning


def _no_text(text: str) -> None:
    """--json: nothing is streamed; the text comes whole in the object at the end."""
