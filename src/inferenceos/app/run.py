"""One prompt through one model in this process, streamed: what `inferenceos run` does.

`run_prompt` conducts it: resolve the model, read the media files and their projector,
ask the planner (with the request its caller builds from its options), load, generate
on the scheduler's one decode path, and record the run in telemetry. What there is to
show goes out through the caller's callbacks (the plan, each piece of text), so the CLI
only parses and renders. Ctrl-C while generating ends the run as `interrupted`, with
its metrics and record; before the model is loaded it propagates.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inferenceos.errors import UsageError

if TYPE_CHECKING:  # gguf, numpy, jinja2 and Pillow load only when a run starts
    from inferenceos.engine.generation import GenerationMetrics
    from inferenceos.engine.sampling import SamplingParams
    from inferenceos.engine.session import LoadedModel
    from inferenceos.media.item import MediaItem
    from inferenceos.model.projector import ProjectorFacts
    from inferenceos.model.spec import ModelSpec
    from inferenceos.plan.entry import LoadRequest
    from inferenceos.plan.plan import Plan

DEFAULT_CTX = 4096  # the context a model that states none is planned for


@dataclass(frozen=True)
class PromptShape:
    """What the prompt is wrapped in: the system message, `raw` (no chat template), the
    llama.cpp built-in template asked for, and the media files shown to the model."""

    system: str | None = None
    raw: bool = False
    template: str | None = None
    images: tuple[Path, ...] = ()
    audios: tuple[Path, ...] = ()


@dataclass(frozen=True)
class RunResult:
    """A finished run: the pieces generated, its metrics (stop reason `interrupted`
    when Ctrl-C ended it) and whether it was interrupted."""

    pieces: tuple[str, ...]
    metrics: GenerationMetrics
    interrupted: bool


def plan_for(path: Path, req: LoadRequest) -> Plan:
    """How the planner would load the model at `path` here now."""
    from inferenceos.plan.devices import local_machine
    from inferenceos.plan.here import plan_here
    from inferenceos.plan.model_facts import load_model_facts

    return plan_here(load_model_facts(path), local_machine(), req).plan


def run_prompt(
    model: str, path: Path, text: str, shape: PromptShape, sampling: SamplingParams, *,
    request: Callable[..., LoadRequest], flash_attn: Callable[[bool], bool | None],
    kv_policy: str, mmproj: str | None, verbose: bool,
    on_plan: Callable[[Plan], None], on_text: Callable[[str], None],
) -> RunResult:
    """Generate once for `text` with the model at `path`, which `model` (as the user
    wrote it: the projector is looked for by it) resolved to (see the module contract).

    `request(need_tokens=, mmproj=, image_tokens=)` is the caller's LoadRequest for
    what this prompt needs; `flash_attn(reads_attention)` its flash attention choice
    (it may refuse one that the KV policy cannot run with); `mmproj` the projector asked
    for. Errors come in the order `run` has always given them: the model, the media,
    the request, the KV policy, flash attention, the plan."""
    from inferenceos.engine.llama.lib import log
    from inferenceos.media.files import with_markers
    from inferenceos.model.spec import load_spec

    spec = load_spec(path)
    log().echo = verbose
    items, projector, n_media = _media_inputs(model, shape, mmproj)
    text = with_markers(text, len(items))
    need = min(len(text.encode()) + n_media + sampling.max_tokens + 64,
               spec.context_length or DEFAULT_CTX)
    req = request(need_tokens=need, mmproj=projector, image_tokens=n_media)
    req = replace(req, lora=tuple(p for p, _ in sampling.lora))  # priced by the plan
    probe = _policy_probe(spec, kv_policy)
    # H2O reads attention, which exists only without flash attention
    req = replace(req, flash_attn=flash_attn(probe is not None))
    plan = plan_for(spec.path, req)
    on_plan(plan)
    return _generate(spec, plan, text, shape, sampling, kv_policy, probe,
                     projector.path if projector else None, items, on_text)


def _generate(spec: ModelSpec, plan: Plan, text: str, shape: PromptShape,
              sampling: SamplingParams, kv_policy: str, probe: Any, projector: Path | None,
              items: list[MediaItem], on_text: Callable[[str], None]) -> RunResult:
    """Load as planned, generate, record; Ctrl-C while generating ends it (see
    RunResult)."""
    from inferenceos.app.run_telemetry import record_run
    from inferenceos.engine.scheduler import generate_one
    from inferenceos.engine.session import LoadedModel

    with LoadedModel(spec.path, plan.params(),
                     eval_callback=probe.callback if probe else None) as lm, \
            _encoder(lm, projector) as encoder:
        prompt_text = _prompt_text(spec, lm, text, shape)
        # the one decode path (the scheduler's), whatever the options: run and serve
        # stop, count and time a generation alike. With the threads it was given: the
        # telemetry row below records them as the ones that decoded.
        events = generate_one(lm, prompt_text, sampling, plan.engine_draft, kv_policy, probe,
                              media=encoder, items=items, adaptive_threads=False)
        pieces: list[str] = []
        interrupted = False
        try:
            for event in events:
                pieces.append(event.text)
                on_text(event.text)
        except KeyboardInterrupt:
            interrupted = True
        m = lm.metrics
        if interrupted:  # also when the stop came before the generator had begun
            m.stop_reason = "interrupted"
        record_run(lm, m)
    return RunResult(tuple(pieces), m, interrupted)


def _prompt_text(spec: ModelSpec, model: LoadedModel, prompt: str, shape: PromptShape) -> str:
    """The prompt as the model reads it: as is with `raw`, else through the chat
    template (the model's, or the built-in one asked for) with the system message."""
    if shape.raw:
        return prompt
    from inferenceos.engine.chat_template import ChatMessage, render_chat

    messages = [ChatMessage("system", shape.system)] if shape.system else []
    messages.append(ChatMessage("user", prompt))
    text, _ = render_chat(
        spec.chat_template,
        messages,
        bos_token=model.token_text(model.bos_token),
        eos_token=model.token_text(model.eos_token),
        builtin=shape.template,
    )
    return text


def _media_inputs(model: str, shape: PromptShape, mmproj: str | None,
                  ) -> tuple[list[MediaItem], ProjectorFacts | None, int]:
    """(the checked media files, the facts of the projector to see them with (read once:
    the planner takes them as they are), the context cells the images take); no media:
    ([], None, 0) and no projector is loaded. UsageError when there is media and no
    projector."""
    if not shape.images and not shape.audios:
        return [], None, 0
    from inferenceos.api import resolve_projector
    from inferenceos.media.files import read_media_file
    from inferenceos.model.projector import image_tokens, load_projector

    items = [read_media_file(p, "image") for p in shape.images]
    items += [read_media_file(p, "audio") for p in shape.audios]
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
    from inferenceos.engine.kv.attention_probe import AttentionProbe
    from inferenceos.engine.kv.policies import load_policy

    if not getattr(load_policy(kv_policy), "needs_attention", False):
        return None
    return AttentionProbe(layer.index for layer in spec.layers if not layer.is_swa)
