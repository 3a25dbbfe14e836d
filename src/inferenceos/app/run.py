"""One prompt through one model in this process, streamed: what `inferenceos run` does.

`run_prompt` conducts it: resolve the model, read the media files and their projector,
ask the planner (with the request its caller builds from its options), load, generate
on the scheduler's one decode path, and record the run in telemetry. What there is to
show goes out through the caller's callbacks (the plan, each piece of text), so the CLI
only parses and renders. Ctrl-C while generating ends the run as `interrupted`, with
its metrics and record; before the model is loaded it propagates.

A model whose chat template has a reasoning section (`<think>`, engine/reasoning.py)
has its reply split: reasoning goes to `on_reasoning`, the answer to `on_text`.
`PromptShape.reasoning_budget`: -1 unrestricted; 0 turns thinking off the way the
template allows (`enable_thinking` false, else an empty `<think></think>`); N > 0 closes
the section after N tokens of reasoning, by stopping and continuing from the prompt,
the reply and the forced `</think>` (as the server's budget does).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inferenceos.errors import UsageError

if TYPE_CHECKING:  # gguf, numpy, jinja2 and Pillow load only when a run starts
    from inferenceos.engine.generation import GenerationMetrics, TokenEvent
    from inferenceos.engine.reasoning import Reasoning
    from inferenceos.engine.sampling import SamplingParams
    from inferenceos.engine.session import LoadedModel
    from inferenceos.media.item import MediaItem
    from inferenceos.model.projector import ProjectorFacts
    from inferenceos.model.spec import ModelSpec
    from inferenceos.plan.entry import LoadRequest
    from inferenceos.plan.plan import Plan

DEFAULT_CTX = 4096  # the context a model that states none is planned for
_Events = Iterator["TokenEvent"]  # one generation's token events (generate_one's)


@dataclass(frozen=True)
class PromptShape:
    """What the prompt is wrapped in: the system message, `raw` (no chat template), the
    llama.cpp built-in template asked for, and the media files shown to the model."""

    system: str | None = None
    raw: bool = False
    template: str | None = None
    images: tuple[Path, ...] = ()
    audios: tuple[Path, ...] = ()
    reasoning_budget: int = -1  # see the module doc


@dataclass(frozen=True)
class RunResult:
    """A finished run: the pieces generated (the whole reply, reasoning included), its
    metrics (stop reason `interrupted` when Ctrl-C ended it), whether it was
    interrupted, and the reply split into `reasoning` and `text` (the answer; the whole
    reply when the template has no reasoning section)."""

    pieces: tuple[str, ...]
    metrics: GenerationMetrics
    interrupted: bool
    reasoning: str = ""
    text: str = ""


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
    on_reasoning: Callable[[str], None] | None = None,
) -> RunResult:
    """Generate once for `text` with the model at `path`, which `model` (as the user
    wrote it: the projector is looked for by it) resolved to (see the module contract).

    `request(need_tokens=, mmproj=, image_tokens=)` is the caller's LoadRequest for
    what this prompt needs; `flash_attn(reads_attention)` its flash attention choice
    (it may refuse one that the KV policy cannot run with); `mmproj` the projector asked
    for. Errors come in the order `run` has always given them: the model, the media,
    the request, the KV policy, flash attention, the plan. `on_reasoning` gets the
    reasoning pieces (None: they are dropped from what is shown)."""
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
    show = _Show(on_text, on_reasoning or (lambda _piece: None))
    return _generate(spec, plan, text, shape, sampling, kv_policy, probe,
                     projector.path if projector else None, items, show)


@dataclass
class _Show:
    """Where a reply's pieces go: the answer's to `text`, the reasoning's to
    `reasoning` (split by a ThinkingSplit when the template has a section)."""

    text: Callable[[str], None]
    reasoning: Callable[[str], None]
    split: Any = None  # engine.reasoning.ThinkingSplit, or None: all of it is text

    def feed(self, piece: str, last: bool = False) -> None:
        if self.split is None:
            self.text(piece)
            return
        thought, text = self.split.finish() if last else self.split.feed(piece)
        if thought:
            self.reasoning(thought)
        if text:
            self.text(text)


def _generate(spec: ModelSpec, plan: Plan, text: str, shape: PromptShape,
              sampling: SamplingParams, kv_policy: str, probe: Any, projector: Path | None,
              items: list[MediaItem], show: _Show) -> RunResult:
    """Load as planned, generate, record; Ctrl-C while generating ends it (see
    RunResult)."""
    from inferenceos.app.run_telemetry import record_run
    from inferenceos.engine.reasoning import ThinkingSplit
    from inferenceos.engine.session import LoadedModel

    with LoadedModel(spec.path, plan.params(),
                     eval_callback=probe.callback if probe else None) as lm, \
            _encoder(lm, projector) as encoder:
        prompt_text, reasoning = _prompt_text(spec, lm, text, shape)
        show.split = ThinkingSplit(reasoning) if reasoning is not None else None
        # the one decode path (the scheduler's), whatever the options: run and serve
        # stop, count and time a generation alike. With the threads it was given: the
        # telemetry row below records them as the ones that decoded.
        def one(prompt: str | list[int], sp: SamplingParams) -> _Events:
            from inferenceos.engine.scheduler import generate_one

            return generate_one(lm, prompt, sp, plan.engine_draft, kv_policy, probe,
                                media=encoder if isinstance(prompt, str) else None,
                                items=items if isinstance(prompt, str) else (),
                                adaptive_threads=False)

        budget = shape.reasoning_budget if reasoning is not None else -1
        events = _budgeted(lm, one, prompt_text, sampling, reasoning, budget, bool(items))
        pieces: list[str] = []
        interrupted = False
        try:
            for event in events:
                pieces.append(event.text)
                show.feed(event.text)
            show.feed("", last=True)
        except KeyboardInterrupt:
            interrupted = True
        m = lm.metrics
        if interrupted:  # also when the stop came before the generator had begun
            m.stop_reason = "interrupted"
        record_run(lm, m)
    split = show.split
    return RunResult(tuple(pieces), m, interrupted, split.thinking if split else "",
                     split.text if split else "".join(pieces))


def _budgeted(lm: LoadedModel, one: Callable[[str | list[int], SamplingParams], _Events],
              prompt: str, sampling: SamplingParams, reasoning: Reasoning | None,
              budget: int, media: bool) -> Iterator[TokenEvent]:
    """The reply's events; with a reasoning `budget` N > 0, a section still open after N
    tokens is closed by force (the forced text as one event, token -1) and the reply
    continues from the prompt, the reply so far and that text (token ids; the text with
    `media`, which has no id form). `lm.metrics` ends as one generation's."""
    from inferenceos.engine.generation import TokenEvent
    from inferenceos.engine.reasoning import BudgetWatch, forced_text, merged_metrics

    events = one(prompt, sampling)
    if reasoning is None or budget <= 0:
        yield from events
        return
    watch, out = BudgetWatch(reasoning, budget), []
    for ev in events:
        if ev.token >= 0:
            out.append(ev.token)
        yield ev
        if watch.feed(ev):
            getattr(events, "close", lambda: None)()  # the first part ends here
            first, forced = lm.metrics, forced_text("")
            ids = lm.tokenize(forced, add_special=False)
            left = max(sampling.max_tokens - len(out) - len(ids), 0)
            rest = replace(sampling, max_tokens=left)
            cont = one(prompt + watch.text + forced, rest) if media else one(
                lm.tokenize(prompt) + out + ids, rest)
            yield TokenEvent(-1, forced)
            n = len(out) + len(ids)
            for ev2 in cont:
                n += ev2.token >= 0
                yield ev2
            lm.metrics = merged_metrics(first, lm.metrics, n)
            return


def _prompt_text(spec: ModelSpec, model: LoadedModel, prompt: str, shape: PromptShape
                 ) -> tuple[str, Reasoning | None]:
    """The prompt as the model reads it, and the reasoning its reply has (None: no
    reasoning section): as is with `raw`, else through the chat template (the model's,
    or the built-in one asked for) with the system message, thinking off for a
    reasoning budget of 0 (engine/reasoning.apply_thinking)."""
    if shape.raw:
        return prompt, None
    from inferenceos.engine.chat_template import ChatMessage, render_chat
    from inferenceos.engine.reasoning import apply_thinking

    messages = [ChatMessage("system", shape.system)] if shape.system else []
    messages.append(ChatMessage("user", prompt))
    off = shape.reasoning_budget == 0
    text, _ = render_chat(
        spec.chat_template,
        messages,
        bos_token=model.token_text(model.bos_token),
        eos_token=model.token_text(model.eos_token),
        builtin=shape.template,
        kwargs={"enable_thinking": False} if off else None,
    )
    return apply_thinking(None if shape.template else spec.chat_template, text, off)


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
