"""The public Python API (`import inferenceos`), the layer `chat` and the CLI sit on.

    import inferenceos
    with inferenceos.load("gemma3-270m") as model:
        print(model.generate("The capital of France is", max_tokens=8).text)

Contract:
- `load(model, **options)` takes a registry name, a .gguf path, or "" for the built-in
  Gemma 3 270M; it asks the planner how to load it on this machine and returns a
  `Model` whose engine runs in this process (`isolated=True`: in a worker process,
  so that a crash inside llama.cpp cannot take the caller down).
- `Model.generate(prompt)` completes raw text, `Model.chat(messages)` goes through the
  model's chat template (a plain "User: / Assistant:" transcript when the model has
  none); both return a `Completion` (text + metrics), or with `stream=True` a
  `TextStream` that yields text pieces and holds the metrics once it ends.
- Sampling options are keyword arguments named as `SamplingParams`' fields
  (temperature, top_k, top_p, min_p, seed, max_tokens, stop, ...); an unknown one is
  a `UsageError`, never silently ignored.
- `pull(name)`, `list()` and `simulate(model)` are the registry and the planner.
- Every error a caller can act on is an `inferenceos.errors.InferenceOSError`.
"""

from __future__ import annotations

import builtins
import dataclasses
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, overload

from inferenceos.errors import ModelNotFoundError, UsageError

if TYPE_CHECKING:  # keep `import inferenceos` cheap: these load on first use
    from inferenceos.engine.chat_template import ChatMessage
    from inferenceos.engine.client import EngineClient
    from inferenceos.engine.engine import Generation
    from inferenceos.engine.generation import GenerationMetrics
    from inferenceos.engine.sampling import SamplingParams
    from inferenceos.media.item import MediaItem
    from inferenceos.model.spec import ModelSpec
    from inferenceos.plan.simulate import Prediction
    from inferenceos.registry.store import ModelEntry

__all__ = ["Completion", "Model", "TextStream", "list", "load", "pull", "resolve",
           "resolve_projector", "simulate"]

# Base models (no chat template) chat in this transcript form; a reply ends where the
# model starts the user's next line.
TRANSCRIPT_STOP = "\nUser:"


def resolve(model: str | Path = "") -> Path:
    """The .gguf file `model` means: "" (or "gemma3-270m" when not registered) → the
    built-in model, an existing path → itself, a packaged model's name (e.g.
    "qwen2.5-coder-0.5b-instruct", when not registered) → its assembled file, else a
    registry name.
    ModelNotFoundError when it is none of these."""
    if not str(model):
        from inferenceos.model.default_model import ensure_default_model

        return ensure_default_model()
    path = Path(model).expanduser()
    if path.is_file():
        return path
    if path.exists():  # a directory, or something else that is not a model file
        raise ModelNotFoundError(f"{path} is not a model file")
    if path.suffix == ".gguf" or str(model).startswith((".", "/", "~")):
        raise ModelNotFoundError(f"no such model file: {path}")
    from inferenceos.model.default_model import DEFAULT_MODEL_NAME, ensure_default_model
    from inferenceos.model.packaged_models import ensure_packaged_model
    from inferenceos.registry.names import InvalidNameError, canonical
    from inferenceos.registry.store import ModelStore

    store = ModelStore()
    try:
        entry = store.find(str(model))
    except InvalidNameError:
        raise ModelNotFoundError(f"no model file or registry name {str(model)!r}") from None
    if entry is None and canonical(str(model)) == canonical(DEFAULT_MODEL_NAME):
        return ensure_default_model()  # the built-in model needs no pull
    if entry is None and (packaged := _packaged_name(str(model))):
        return ensure_packaged_model(packaged)  # digest-checked; says what to install
    if entry is None:  # a typo gets the registered names closest to it
        raise ModelNotFoundError(store.not_found(str(model)) or (
            f"model '{model}' not found: pass a .gguf path, or `inferenceos pull` it first"))
    if not entry.path.is_file():
        store.get(entry.name)  # says whether the file was moved, deleted or is missing
    return entry.path


def _packaged_name(model: str) -> str | None:
    """The packaged model (model/packaged_models.py) `model` names, if any."""
    from inferenceos.model.packaged_models import PACKAGED_MODELS
    from inferenceos.registry.names import canonical

    key = canonical(model)
    return next((n for n in PACKAGED_MODELS if canonical(n) == key), None)


def resolve_projector(model: str | Path = "", mmproj: str | Path | None = None) -> Path | None:
    """The multimodal projector (mmproj GGUF) to load with `model`, or None.

    `mmproj` (what `--mmproj` says) wins: "none" → None; a file → itself, checked to be
    a projector (ModelNotFoundError when missing, UsageError when not a projector);
    None or "auto" → the model's own: for a registry name, the projector its entry
    records (pulled or imported with it; None when its file has gone missing, which
    `models show` reports), for a .gguf path the projector beside it
    (`model/projector_files.py` says which); the built-in model has none.
    Call it with the same `model` text as `resolve`.
    """
    from inferenceos.model.projector_files import NONE, check_projector, find_projector

    if mmproj is not None and str(mmproj).lower() not in ("", "auto"):
        return None if str(mmproj).lower() == NONE else check_projector(mmproj)
    if not str(model):
        return None
    path = Path(model).expanduser()
    if path.is_file():
        return find_projector(path)
    from inferenceos.registry.catalog import entry_projector
    from inferenceos.registry.names import InvalidNameError
    from inferenceos.registry.store import ModelStore

    try:
        entry = ModelStore().find(str(model))
    except InvalidNameError:
        return None  # `resolve` says what is wrong with the name
    return entry_projector(entry) if entry is not None else None


def sampling_params(options: Mapping[str, Any]) -> SamplingParams:
    """SamplingParams from keyword options; UsageError names an unknown or bad one."""
    from inferenceos.engine.sampling import SamplingParams

    fields = {f.name for f in dataclasses.fields(SamplingParams)}
    unknown = sorted(set(options) - fields)
    if unknown:
        raise UsageError(f"unknown sampling option(s) {', '.join(unknown)}; known: "
                         f"{', '.join(sorted(fields))}")
    opts = dict(options)
    if isinstance(opts.get("stop"), str):
        opts["stop"] = (opts["stop"],)
    elif opts.get("stop") is not None:
        opts["stop"] = tuple(opts["stop"])
    params = SamplingParams(**opts)
    params.validate()
    return params


@dataclass
class Completion:
    """A finished generation: its text and metrics (TTFT, t/s, token counts, stop reason)."""

    text: str
    metrics: GenerationMetrics

    @property
    def finish_reason(self) -> str:
        """eos, stop, length or interrupted."""
        return self.metrics.stop_reason

    def __str__(self) -> str:
        return self.text


class TextStream:
    """Text pieces as they are generated. `metrics` is complete once the stream ends;
    `close()` (or leaving a `with` block, or breaking out of a loop and dropping it)
    stops the generation."""

    def __init__(self, gen: Generation) -> None:
        self._gen = gen
        self._parts: builtins.list[str] = []

    def __iter__(self) -> Iterator[str]:
        for event in self._gen:
            if event.text:
                self._parts.append(event.text)
                yield event.text

    @property
    def metrics(self) -> GenerationMetrics:
        return self._gen.metrics

    @property
    def text(self) -> str:
        """The text produced so far."""
        return "".join(self._parts)

    def close(self) -> None:
        self._gen.close()

    def __enter__(self) -> TextStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _messages(messages: Sequence[Any],
              media: builtins.list[MediaItem] | None = None) -> builtins.list[ChatMessage]:
    """ChatMessages from dicts ({"role", "content"[, "images"]}) or ChatMessages. A
    dict's "images" (as Ollama's client takes them: file paths, raw bytes, base64 or
    data: URLs) are checked and decoded into `media` (when given; refused otherwise),
    each leaving a media marker before the message's text."""
    from inferenceos.engine.chat_template import ChatMessage

    out = []
    for m in messages:
        if isinstance(m, ChatMessage):
            out.append(m)
        elif isinstance(m, Mapping) and isinstance(m.get("role"), str):
            text = str(m.get("content") or "")
            if m.get("images"):
                if media is None:
                    raise UsageError("images go to chat(), with a model that has a projector")
                text = _images(m["images"], media) + text
            out.append(ChatMessage(m["role"], text))
        else:
            raise UsageError("a message is a dict with 'role' and 'content'")
    if not out:
        raise UsageError("chat needs at least one message")
    return out


def _images(images: Any, media: builtins.list[MediaItem]) -> str:
    """Decode `images` into `media`; the markers their places take in the text."""
    from inferenceos.media.files import read_media_file
    from inferenceos.media.image import decode_image
    from inferenceos.media.item import MEDIA_MARKER
    from inferenceos.media.source import media_bytes

    if isinstance(images, (str, bytes, Path)):
        images = [images]
    for img in images:
        if isinstance(img, bytes):
            media.append(decode_image(img))
        elif isinstance(img, Path) or (isinstance(img, str) and len(img) < 4096
                                       and Path(img).expanduser().is_file()):
            media.append(read_media_file(img, "image"))
        elif isinstance(img, str):
            media.append(decode_image(media_bytes(img).data))
        else:
            raise UsageError(f"an image is a path, bytes or base64 text, not {type(img).__name__}")
    return f"{MEDIA_MARKER}\n" * len(images)


def _template_kwargs(value: Mapping[str, Any] | None) -> dict[str, Any]:
    """`template_kwargs` checked: a mapping of string names (None: none);
    `enable_thinking`, when given, a bool. UsageError otherwise."""
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise UsageError("template_kwargs must be a mapping of variable names to values")
    if "enable_thinking" in value and not isinstance(value["enable_thinking"], bool):
        raise UsageError("template_kwargs enable_thinking must be true or false")
    return dict(value)


def transcript(messages: Sequence[ChatMessage]) -> str:
    """A base model's chat prompt: "System:/User:/Assistant:" lines, ending with
    "Assistant:" for the reply (stop it at TRANSCRIPT_STOP)."""
    names = {"system": "System", "user": "User", "assistant": "Assistant", "tool": "Tool"}
    lines = [f"{names.get(m.role, m.role.title())}: {m.content}" for m in messages]
    return "\n".join([*lines, "Assistant:"])


class Model:
    """A loaded model. Thread-safe; `close()` it (or use `with`) to free its memory."""

    def __init__(self, engine: EngineClient, name: str, path: Path) -> None:
        self._engine = engine
        self.name = name
        self.path = path
        self._lock = threading.Lock()

    @property
    def spec(self) -> ModelSpec:
        """What the GGUF header says (architecture, context length, chat template...)."""
        return self._engine.spec

    @property
    def n_ctx(self) -> int:
        """Tokens one conversation may hold (prompt + reply)."""
        return self._engine.n_ctx

    @property
    def has_chat_template(self) -> bool:
        return bool(self.spec.chat_template)

    @property
    def engine(self) -> EngineClient:
        """The engine underneath (LocalEngine or Engine), for what this API lacks."""
        return self._engine

    def tokenize(self, text: str, add_special: bool = True) -> builtins.list[int]:
        return builtins.list(self._engine.tokenize(text, add_special))

    def _run(self, prompt: str | builtins.list[int], stream: bool,
             options: Mapping[str, Any],
             media: Sequence[MediaItem] = ()) -> Completion | TextStream:
        from inferenceos import interrupt

        interrupt.reset()  # a new action: a Ctrl-C that stopped the last one is spent
        gen = self._engine.generate(prompt, sampling_params(options), media=media)
        if stream:
            return TextStream(gen)
        try:
            text = gen.text()
        finally:
            gen.close()
        return Completion(text, gen.metrics)

    @overload
    def generate(self, prompt: str | Sequence[int], *, stream: Literal[False] = False,
                 **options: Any) -> Completion: ...
    @overload
    def generate(self, prompt: str | Sequence[int], *, stream: Literal[True],
                 **options: Any) -> TextStream: ...

    def generate(self, prompt: str | Sequence[int], *, stream: bool = False,
                 images: Sequence[Any] = (), **options: Any) -> Completion | TextStream:
        """Complete `prompt` (text, sent as is, or token ids); see the module contract.
        `images` (paths, bytes or base64; the model needs a projector) go before the
        text unless it holds one media marker per image."""
        body = prompt if isinstance(prompt, str) else builtins.list(prompt)
        media: builtins.list[MediaItem] = []
        if images:
            from inferenceos.media.files import with_markers

            if not isinstance(body, str):
                raise UsageError("images go with a text prompt")
            _images(images, media)
            body = with_markers(body, len(media))
        return self._run(body, stream, options, media)

    def chat_prompt(self, messages: Sequence[Any], template: str | None = None,
                    media: builtins.list[MediaItem] | None = None,
                    template_kwargs: Mapping[str, Any] | None = None) -> str:
        """The prompt text `chat` would send for `messages` (their images decoded into
        `media` when given); `template_kwargs` as `chat` takes them."""
        msgs = _messages(messages, media)
        if not self.has_chat_template and template is None:
            return transcript(msgs)
        kwargs = _template_kwargs(template_kwargs)
        text: str = self._engine.chat_prompt(msgs, template=template, template_kwargs=kwargs)
        if kwargs.get("enable_thinking") is False:  # closed even where the template won't
            from inferenceos.engine.reasoning import apply_thinking

            text = apply_thinking(None if template else self.spec.chat_template, text,
                                  off=True)[0]
        return text

    @overload
    def chat(self, messages: Sequence[Any], *, stream: Literal[False] = False,
             template: str | None = None, template_kwargs: Mapping[str, Any] | None = None,
             **options: Any) -> Completion: ...
    @overload
    def chat(self, messages: Sequence[Any], *, stream: Literal[True],
             template: str | None = None, template_kwargs: Mapping[str, Any] | None = None,
             **options: Any) -> TextStream: ...

    def chat(self, messages: Sequence[Any], *, stream: bool = False,
             template: str | None = None, template_kwargs: Mapping[str, Any] | None = None,
             **options: Any) -> Completion | TextStream:
        """Reply to `messages` ([{"role": "user", "content": "..."}, ...]) through the
        chat template (`template`: one of llama.cpp's built-in ones by name).
        `template_kwargs`: variables for the model's Jinja template (llama-server's
        `chat_template_kwargs`), e.g. `{"enable_thinking": False}`, which also closes a
        reasoning section the template left open (engine/reasoning.apply_thinking).
        UsageError when it is not a mapping of names."""
        media: builtins.list[MediaItem] = []
        prompt = self.chat_prompt(messages, template, media, template_kwargs)
        if not self.has_chat_template and template is None:
            stop = options.get("stop") or ()
            stop = (stop,) if isinstance(stop, str) else tuple(stop)
            options = {**options, "stop": (*stop, TRANSCRIPT_STOP)}
        return self._run(prompt, stream, options, media)

    def embed(self, texts: str | Sequence[str]) -> builtins.list[builtins.list[float]]:
        """One mean-pooled, L2-normalised vector per text (a str is one text)."""
        items = [texts] if isinstance(texts, str) else builtins.list(texts)
        if not items:
            raise UsageError("embed needs at least one text")
        return builtins.list(self._engine.embed(items))

    def close(self) -> None:
        """Unload the model (idempotent)."""
        with self._lock:
            if self._engine is not None:
                self._engine.close()

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<inferenceos.Model {self.name!r} n_ctx={self.n_ctx}>"


def load_settings(path: Path, n_ctx: int = 0, threads: int = 0, batch: int = 0,
                  n_parallel: int = 1, need_tokens: int = 0, gpu_layers: int | None = None,
                  backend: str | None = None, mmproj: Path | None = None) -> Any:
    """The planner's llama parameters for `path` on this machine, per sequence (what
    the engines take); `n_ctx`, `threads`, `batch`: 0 = the plan's choice. The
    full-size sliding-window cache is kept: prefix reuse (follow-up turns, saved
    sessions) needs every cell of the history."""
    return _plan(path, n_ctx, threads, batch, n_parallel, need_tokens, gpu_layers, backend,
                 mmproj).params().per_sequence()


def _plan(path: Path, n_ctx: int = 0, threads: int = 0, batch: int = 0, n_parallel: int = 1,
          need_tokens: int = 0, gpu_layers: int | None = None, backend: str | None = None,
          mmproj: Path | None = None, draft: str | None = None) -> Any:
    """The plan `load_settings` and `load` take (`draft`: LoadRequest.draft)."""
    from inferenceos.plan.devices import local_machine
    from inferenceos.plan.entry import LoadRequest
    from inferenceos.plan.here import plan_here
    from inferenceos.plan.model_facts import load_model_facts

    req = LoadRequest(n_ctx=n_ctx, n_seq=n_parallel, threads=threads, n_batch=batch,
                      need_tokens=need_tokens, swa_full=True, gpu_layers=gpu_layers,
                      backend=backend, mmproj=mmproj, draft=draft)
    req.validate()
    return plan_here(load_model_facts(path), local_machine(), req).plan


def load(
    model: str | Path = "",
    *,
    n_ctx: int = 0,
    threads: int = 0,
    batch: int = 0,
    n_parallel: int = 1,
    kv_policy: str = "none",
    gpu_layers: int | None = None,
    backend: str | None = None,
    isolated: bool = False,
    settings: Any = None,
    verbose: bool = False,
    mmproj: str | Path | None = None,
    draft: str | None = None,
) -> Model:
    """Load `model` (registry name, .gguf path, or "" for the built-in model).

    `mmproj`: its multimodal projector (default: the one beside the file or recorded
    with the registry entry; "none": text only); with one, `chat` messages and
    `generate` take images.

    `n_ctx` (0: planned), `threads`, `batch`, `gpu_layers` (-1: all) and `backend`
    ("cpu", or a device such as "CUDA0") override the plan; `settings` (a
    LlamaParams) replaces it altogether. `n_parallel` sequences can generate at once.
    `verbose` shows llama.cpp's log on stderr. `draft`: speculative decoding's drafter
    (None: none; "auto": the plan chooses from this model's recorded runs, as `run`
    does by default; "ngram", "self" or a draft .gguf).
    """
    for label, value in (("n_ctx", n_ctx), ("threads", threads), ("batch", batch)):
        if value < 0:
            raise UsageError(f"{label} must be >= 0, got {value}")
    if n_parallel < 1:
        raise UsageError(f"n_parallel must be >= 1, got {n_parallel}")
    from inferenceos import interrupt
    from inferenceos.engine.llama.lib import log

    interrupt.install()  # a Ctrl-C in the caller stops a load or a prefill at once
    path = resolve(model)
    projector = resolve_projector(model, mmproj)
    log().echo = verbose
    if settings is None:
        plan = _plan(path, n_ctx, threads, batch, n_parallel, gpu_layers=gpu_layers,
                     backend=backend, mmproj=projector, draft=draft)
        chosen, drafter = plan.params().per_sequence(), plan.engine_draft
    else:  # the caller's parameters: nothing planned, a named drafter as asked
        chosen, drafter = settings, None if draft in (None, "auto", "none") else draft
    kw: dict[str, Any] = {"n_parallel": n_parallel, "kv_policy": kv_policy, "mmproj": projector,
                          "mmproj_gpu": chosen.n_gpu_layers > 0, "draft": drafter}
    if isolated:
        from inferenceos.engine.engine import Engine

        engine: EngineClient = Engine(path, chosen, **kw)
    else:
        from inferenceos.engine.local import LocalEngine

        engine = LocalEngine(path, chosen, **kw)
    name = path.stem if Path(str(model)).expanduser().is_file() else str(model)
    return Model(engine, name or "gemma3-270m", path)


def pull(name: str, *, progress: Any = None) -> ModelEntry:
    """Register a model, as `inferenceos pull` does: a local .gguf path is imported
    (after llama.cpp's own load check), `hf.co/ORG/REPO[:QUANT]` is downloaded from the
    Hugging Face Hub, `gemma3-270m` is the built-in model. `progress(event)` receives
    each `registry.hub.PullEvent` (status, digest, completed / total bytes). Returns
    the registry entry."""
    from inferenceos.registry import hub
    from inferenceos.registry.store import ModelStore

    store = ModelStore()
    path = Path(name).expanduser()
    if path.is_file():
        from inferenceos.registry.loadcheck import check_loadable

        def report(message: str) -> None:
            if progress is not None:
                progress(hub.PullEvent(message))

        return store.import_file(path, None, check=check_loadable, progress=report)
    return hub.pull(store, name, on_event=progress)


def list() -> builtins.list[ModelEntry]:  # shadows the builtin on purpose, as ollama.list()
    """Every registered model (name, digest, size, architecture, path...)."""
    from inferenceos.registry.store import ModelStore

    return ModelStore().list()


def simulate(
    model: str | Path = "",
    *,
    prompt_tokens: int = 512,
    output_tokens: int = 128,
    n_ctx: int = 0,
    cache_type: str = "f16",
    threads: int = 0,
) -> Prediction:
    """Predict memory, speed and the bottleneck of running `model` here, without
    loading it (metadata only). `.to_json()` gives the same figures as
    `inferenceos simulate --json`."""
    from inferenceos.plan.devices import local_machine
    from inferenceos.plan.simulate import Workload
    from inferenceos.plan.simulate import simulate as simulate_plan

    w = Workload(prompt_tokens=prompt_tokens, output_tokens=output_tokens, n_ctx=n_ctx or None)
    return simulate_plan(resolve(model), local_machine(), w, threads=threads,
                         type_k=cache_type, type_v=cache_type)
