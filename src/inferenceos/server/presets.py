"""What a model name brings to every request, on every dialect: a preset's system
prompt, messages, parameters and adapters (registry/presets.py), and the LoRA
adapters the server was started with (`serve MODEL --lora FILE[:SCALE]`, for MODEL).

`with_preset(state, req)` runs once per generation, before the prompt is rendered
(generation.py's job): the dialects need not know presets exist.

- System prompt and MESSAGEs: a chat's messages start with the preset's SYSTEM unless
  the request has a system message of its own, then the preset's messages. A raw text
  prompt (llama-server `/completion`, Ollama `raw`) is left as sent.
- Parameters replace the values a request left at their defaults (a request's own
  value wins, as in Ollama); `num_ctx` is a load override unless the request set one.
- Adapters: the request's LoRA set is the preset's adapters (blobs in the store),
  then the request's own choice (llama-server's per-request `lora`) or the server's
  adapters (`LoraTable`) where it names none.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

from inferenceos.engine.chat_template import ChatMessage
from inferenceos.engine.lora import LoraSet, lora_set
from inferenceos.engine.sampling import SamplingParams
from inferenceos.registry.names import canonical
from inferenceos.registry.presets import Preset
from inferenceos.server.options import UNLIMITED, ollama_options

_DEFAULTS = SamplingParams()
_LOCK = threading.Lock()


class LoraTable:
    """llama-server's adapter list: the `--lora` files of the server's default model,
    each with an id (its position) and a global scale POST /lora-adapters changes."""

    def __init__(self, model: str, adapters: tuple[tuple[str, float], ...]) -> None:
        self.model = canonical(model) if model else ""
        self._adapters: list[tuple[str, float]] = [(p, float(s)) for p, s in adapters]
        self._lock = threading.Lock()

    def listing(self) -> list[dict[str, Any]]:
        """GET /lora-adapters: [{id, path, scale}]."""
        with self._lock:
            return [{"id": i, "path": p, "scale": s} for i, (p, s) in enumerate(self._adapters)]

    def serves(self, name: str) -> bool:
        """Whether the model called `name` is the one these adapters are for."""
        return bool(name) and canonical(name) == self.model

    def __len__(self) -> int:
        return len(self._adapters)

    def set_scales(self, scales: dict[int, float], reset: bool) -> None:
        """Apply {id: scale}; with `reset` (a request's list), ids not named get 0."""
        with self._lock:
            self._adapters = [(p, scales.get(i, 0.0 if reset else s))
                              for i, (p, s) in enumerate(self._adapters)]

    def resolve(self, scales: dict[int, float] | None) -> LoraSet:
        """The set for one request: its own {id: scale} (ids it omits at 0, as
        llama-server's per-request `lora`), or the global scales (None)."""
        with self._lock:
            pairs = [(p, (scales.get(i, 0.0) if scales is not None else s))
                     for i, (p, s) in enumerate(self._adapters)]
        return lora_set(pairs)


def lora_table(state: Any) -> LoraTable:
    """The server's LoraTable (made on first use from its settings' `lora`)."""
    table = getattr(state, "_lora_table", None)
    if table is None:
        with _LOCK:
            table = getattr(state, "_lora_table", None)
            if table is None:
                s = state.settings
                table = LoraTable(s.default_model, tuple(getattr(s, "lora", ()) or ()))
                state._lora_table = table
    return table


def preset_sampling(sampling: SamplingParams, preset: Preset) -> tuple[SamplingParams,
                                                                        dict[str, Any]]:
    """`sampling` with the preset's parameters where it kept the defaults, and the
    preset's load overrides (num_ctx)."""
    theirs, load = ollama_options(preset.parameters)
    changes: dict[str, Any] = {}
    for f in dataclasses.fields(SamplingParams):
        mine, default = getattr(theirs, f.name), getattr(_DEFAULTS, f.name)
        if mine == default:  # the preset does not set it
            continue
        ours = getattr(sampling, f.name)
        unset = ours == default or (f.name == "max_tokens" and ours >= UNLIMITED)
        if unset:
            changes[f.name] = mine
    return dataclasses.replace(sampling, **changes), load


def _messages(msgs: tuple[ChatMessage, ...], preset: Preset) -> tuple[ChatMessage, ...]:
    own_system = any(m.role == "system" for m in msgs)
    head = [ChatMessage("system", preset.system)] if preset.system and not own_system else []
    head += [ChatMessage(role, content) for role, content in preset.messages]
    if not head:
        return msgs
    if own_system and msgs[0].role == "system":  # the request's system prompt stays first
        return (msgs[0], *head, *msgs[1:])
    return (*head, *msgs)


def with_preset(state: Any, req: Any) -> Any:
    """`req` (a GenRequest) with its model's preset and LoRA adapters applied (see the
    module docstring); `req` itself for a plain model without adapters."""
    model = state.catalog.resolve(req.model)
    table = lora_table(state)
    own = getattr(req, "lora", None)  # llama-server's per-request {id: scale}
    lora: LoraSet = ()
    if len(table) and table.serves(model.name):
        lora = table.resolve(own)
    if model.preset is None:
        if not lora:
            return req
        return dataclasses.replace(req, sampling=dataclasses.replace(req.sampling, lora=lora))
    preset = Preset.from_json(model.preset)
    store = state.catalog.store
    lora = lora_set([*((store.blob_path(d), s) for d, s in preset.adapters), *lora])
    sampling, load = preset_sampling(req.sampling, preset)
    overrides = {**load, **(req.overrides or {})}
    changes: dict[str, Any] = {"sampling": dataclasses.replace(sampling, lora=lora),
                               "overrides": overrides or None}
    if req.messages is not None:
        changes["messages"] = _messages(tuple(req.messages), preset)
    return dataclasses.replace(req, **changes)
