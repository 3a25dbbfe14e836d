"""`inferenceos run [MODEL] --prompt TEXT`: one prompt, streamed, then a metrics footer."""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from inferenceos import interrupt
from inferenceos.cli.cluster_opts import GpuCapOpt, RamCapOpt, RpcOpt
from inferenceos.cli.console import err, print_json
from inferenceos.cli.gen_opts import (
    AudioOpt,
    BatchOpt,
    IgnoreEosOpt,
    ImageOpt,
    JsonOpt,
    LoadOptions,
    MaxTokensOpt,
    MinPOpt,
    PromptOpt,
    RawOpt,
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
from inferenceos.engine.generation import GenerationMetrics
from inferenceos.engine.llama_lib import log
from inferenceos.engine.session import LoadedModel
from inferenceos.errors import UsageError

if TYPE_CHECKING:  # gguf, numpy, jinja2 and Pillow load only when the command runs
    from inferenceos.media.item import MediaItem
    from inferenceos.model.projector import ProjectorFacts
    from inferenceos.model.spec import ModelSpec
    from inferenceos.plan.entry import LoadRequest
    from inferenceos.plan.plan import Plan

DEFAULT_CTX = 4096


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
    from inferenceos.plan.devices import local_machine
    from inferenceos.plan.here import plan_here
    from inferenceos.plan.model_facts import load_model_facts

    plan = plan_here(load_model_facts(path), local_machine(), req).plan
    err.print(plan.summary(), style="dim", markup=False)
    for change in plan.changes:
        err.print(f"  {change}", style="dim", markup=False)
    return plan


def _prompt_text(
    spec: ModelSpec,
    model: LoadedModel,
    prompt: str,
    system: str | None,
    raw: bool,
    template: str | None,
) -> str:
    if raw:
        return prompt
    from inferenceos.engine.chat_template import ChatMessage, render_chat

    messages = [ChatMessage("system", system)] if system else []
    messages.append(ChatMessage("user", prompt))
    text, _ = render_chat(
        spec.chat_template,
        messages,
        bos_token=model.token_text(model.bos_token),
        eos_token=model.token_text(model.eos_token),
        builtin=template,
    )
    return text


def _media_inputs(model: str, images: list[Path] | None, audios: list[Path] | None,
                  mmproj: str | None) -> tuple[list[MediaItem], ProjectorFacts | None, int]:
    """(the checked media files, the facts of the projector to see them with (read once:
    the planner takes them as they are), the context cells the images take); no media:
    ([], None, 0) and no projector is loaded. UsageError when there is media and no
    projector."""
    if not images and not audios:
        return [], None, 0
    from inferenceos.api import resolve_projector
    from inferenceos.media.files import read_media_file
    from inferenceos.model.projector import image_tokens, load_projector

    items = [read_media_file(p, "image") for p in images or ()]
    items += [read_media_file(p, "audio") for p in audios or ()]
    projector = resolve_projector(model, mmproj)
    if projector is None:
        raise UsageError(f"{model or 'the built-in model'} has no multimodal projector to "
                         "see or hear with: give one with --mmproj FILE")
    facts = load_projector(projector)
    n_media = sum(image_tokens(facts, it.nx, it.ny) for it in items if it.kind == "image")
    return items, facts, n_media


def _encoder(lm: LoadedModel, projector: Path | None) -> Any:
    """A MediaEncoder on `lm` for `projector` (a context manager), or a null one."""
    from inferenceos.engine.media_encoder import open_encoder

    encoder = open_encoder(lm, projector, use_gpu=lm.settings.n_gpu_layers > 0)
    return contextlib.nullcontext(None) if encoder is None else encoder


def _policy_probe(spec: ModelSpec, kv_policy: str) -> Any:
    """The attention probe H2O reads (on the full-attention layers), or None."""
    from inferenceos.engine.attention_probe import AttentionProbe
    from inferenceos.engine.kv_policies import load_policy

    if not getattr(load_policy(kv_policy), "needs_attention", False):
        return None
    return AttentionProbe(layer.index for layer in spec.layers if not layer.is_swa)


def footer(m: GenerationMetrics) -> str:
    """The one-line summary printed after a streamed answer."""
    return (
        f"load {m.load_s:.2f}s · prompt {m.prompt_tokens} tok at {m.prompt_tps:.1f} t/s · "
        f"TTFT {m.ttft_s * 1000:.0f} ms · generated {m.completion_tokens} tok at "
        f"{m.decode_tps:.1f} t/s · stop: {m.stop_reason}"
    ) + (f" · draft {m.draft}: {m.acceptance_rate:.0%} accepted, "
         f"{m.tokens_per_step:.2f} tok/step" if m.draft else "")


@dataclass(frozen=True)
class PromptShape:
    """What `run` wraps the prompt in: the system message, --raw (no chat template), the
    built-in template asked for, and the media files it shows the model."""

    system: str | None = None
    raw: bool = False
    template: str | None = None
    images: tuple[Path, ...] = ()
    audios: tuple[Path, ...] = ()


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
    audio: AudioOpt = None, mmproj: MmprojOpt = None,
) -> None:
    """Generate a completion for one prompt, streaming tokens as they come.

    Without a prompt at a terminal, chat interactively instead (as `ollama run` does).
    Ctrl-C stops it at any moment: exit 130, with the footer once the model is loaded
    (`stop: interrupted`), one line before."""
    interrupt.install()
    sampling = SamplingOptions(temperature, top_k, top_p, min_p, seed, max_tokens,
                               tuple(stop or ()), ignore_eos)
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
    shape = PromptShape(system, raw, template, tuple(image or ()), tuple(audio or ()))
    pieces, m, interrupted = _generate(model, text, shape, sampling, load, batch=batch,
                                       as_json=as_json, verbose=verbose)
    if as_json:
        print_json({"text": "".join(pieces), "metrics": m.to_json()})
    else:
        sys.stdout.write("\n")
        sys.stdout.flush()
        err.print(footer(m), style="dim")
    if interrupted:
        raise typer.Exit(130)


def _generate(model: str, text: str, shape: PromptShape, sampling: SamplingOptions,
              load: LoadOptions, *, batch: int, as_json: bool,
              verbose: bool) -> tuple[list[str], GenerationMetrics, bool]:
    """Resolve, plan, load and generate once, streaming the text to stdout unless
    `as_json`; the run is recorded (telemetry). Returns (the pieces generated, the
    metrics, whether Ctrl-C stopped it: then the metrics' stop reason is
    `interrupted`). Ctrl-C before the model is loaded propagates."""
    params = sampling.params()
    from inferenceos.engine.scheduler import generate_one
    from inferenceos.media.files import with_markers
    from inferenceos.model.spec import load_spec

    spec = load_spec(resolve_model(model))
    log().echo = verbose
    items, projector, n_media = _media_inputs(model, list(shape.images) or None,
                                              list(shape.audios) or None, load.mmproj)
    text = with_markers(text, len(items))
    need = min(len(text.encode()) + n_media + sampling.max_tokens + 64,
               spec.context_length or DEFAULT_CTX)
    req = load.request(n_batch=batch, need_tokens=need, mmproj=projector,
                       image_tokens=n_media)
    probe = _policy_probe(spec, load.kv_policy)
    # H2O reads attention, which exists only without flash attention
    req = replace(req, flash_attn=flash_attn_choice(load.flash_attn, probe is not None))
    plan = _plan_here(spec.path, req)
    with LoadedModel(spec.path, plan.params(),
                     eval_callback=probe.callback if probe else None) as lm, \
            _encoder(lm, projector.path if projector else None) as encoder:
        prompt_text = _prompt_text(spec, lm, text, shape.system, shape.raw, shape.template)
        # the one decode path (the scheduler's), whatever the options: run and serve
        # stop, count and time a generation alike. With the threads it was given: the
        # telemetry row below records them as the ones that decoded.
        events = generate_one(lm, prompt_text, params, plan.engine_draft, load.kv_policy,
                              probe, media=encoder, items=items, adaptive_threads=False)
        pieces: list[str] = []
        interrupted = False
        try:
            for event in events:
                pieces.append(event.text)
                if not as_json and event.text:
                    sys.stdout.write(event.text)
                    sys.stdout.flush()
        except KeyboardInterrupt:
            interrupted = True
        m = lm.metrics
        if interrupted:  # also when the stop came before the generator had begun
            m.stop_reason = "interrupted"
        from inferenceos.cli.run_telemetry import record_run

        record_run(lm, m)
    return pieces, m, interrupted
