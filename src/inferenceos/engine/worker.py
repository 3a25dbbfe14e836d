"""The worker process: one loaded model, a scheduler, and a message loop.

A crash or abort inside llama.cpp kills this process, never the caller's. Messages are
tuples over a multiprocessing Pipe.

Parent → worker:
    ("generate", req_id, prompt text or token ids, SamplingParams, kv policy or None)
    ("stats", req_id)
    ("tokenize", req_id, text, add_special)
    ("embed", req_id, [text, ...])
    ("cancel", req_id)
    ("shutdown",)
Worker → parent (each message is a list of events, one per scheduler step):
    (req_id, "token", (token_id, text[, TokenLogprob, top TokenLogprobs]))
    (req_id, "done", metrics dict)
    (req_id, "error", (exception class name, message)) · (req_id, "result", value)
The first message is [(0, "ready", info dict)] or [(0, "error", message)].
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from inferenceos.engine.session import LoadedModel, LoadSettings
from inferenceos.errors import InferenceOSError
from inferenceos.model.spec import ModelSpec, load_spec


@dataclass(frozen=True)
class WorkerConfig:
    """What the worker needs to start (picklable)."""

    path: Path
    settings: LoadSettings
    n_slots: int = 4
    token_budget: int = 512
    kv_policy: str = "none"
    slot_policy: str = "lru"
    max_queue: int = 64


def _info(lm: LoadedModel, n_slots: int) -> dict[str, Any]:
    return {
        "pid": os.getpid(),
        "n_ctx": lm.n_ctx,
        "n_ctx_slot": lm.n_ctx // n_slots,
        "load_s": lm.load_s,
        "bos_text": lm.token_text(lm.bos_token),
        "eos_text": lm.token_text(lm.eos_token),
    }


def _handle(msg: tuple[Any, ...], lm: LoadedModel, sched: Any) -> list[Any] | None:
    """Apply one parent message; returns events to send, or None to shut down."""
    from inferenceos.engine.scheduler import Request

    kind = msg[0]
    if kind == "shutdown":
        return None
    req_id = msg[1]
    try:
        if kind == "generate":
            prompt = msg[2]
            tokens = lm.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
            policy = msg[4] if len(msg) > 4 else None
            sched.submit(Request(req_id, tokens, msg[3], kv_policy=policy))
            return []
        if kind == "stats":
            return [(req_id, "result", sched.stats())]
        if kind == "cancel":
            return list(sched.cancel(req_id))
        if kind == "tokenize":
            return [(req_id, "result", lm.tokenize(msg[2], add_special=msg[3]))]
        if kind == "embed":
            return [(req_id, "result", lm.embed_many(list(msg[2])))]
    except InferenceOSError as exc:
        return [(req_id, "error", (type(exc).__name__, str(exc)))]
    except Exception as exc:  # a bug must cost one request, not every client's
        return [(req_id, "error", ("GenerationError", f"internal error: {exc!r}"))]
    return [(req_id, "error", ("UsageError", f"unknown request kind {kind!r}"))]


def policy_options(spec: ModelSpec) -> dict[str, dict[str, Any]]:
    """KV policy options suited to the model: on models whose layers are mostly
    sliding-window, H2O keeps 90 % recent tokens (measured with benchmarks/kv_policies.py
    on Gemma 3: perplexity 9.05 against 9.55 with the paper's even split, 9.13 for
    StreamingLLM)."""
    layers = spec.layers
    if layers and sum(layer.is_swa for layer in layers) * 2 > len(layers):
        return {"h2o": {"recent_fraction": 0.9}}
    return {}


def _attention_setup(cfg: WorkerConfig, spec: ModelSpec) -> tuple[LoadSettings, Any]:
    """For policies that read attention (h2o): a probe on the full-attention layers,
    flash attention off (llama.cpp has no attention probabilities with it on) and one
    shared KV pool (the probe maps one attention row per token to cells of one pool)."""
    from dataclasses import replace

    from inferenceos.engine.attention_probe import AttentionProbe
    from inferenceos.engine.kv_policies import load_policy
    from inferenceos.errors import UsageError

    if not getattr(load_policy(cfg.kv_policy), "needs_attention", False):
        return cfg.settings, None
    if cfg.settings.flash_attn == 1 or cfg.settings.type_v != "f16":
        raise UsageError(
            f"the {cfg.kv_policy} policy reads attention probabilities, which need flash "
            "attention off; a quantized V cache needs it on: choose one"
        )
    probe = AttentionProbe(layer.index for layer in spec.layers if not layer.is_swa)
    return replace(cfg.settings, flash_attn=0, kv_unified=True), probe


def _step(sched: Any) -> list[Any]:
    """One scheduler step; an unexpected exception fails the running requests only."""
    try:
        return list(sched.step())
    except Exception as exc:
        return list(sched.fail_all(f"internal error in the scheduler: {exc!r}"))


def worker_main(conn: Connection, cfg: WorkerConfig) -> None:
    """Process entry point: load, report ready, then serve until shutdown or EOF."""
    from inferenceos.engine.scheduler import Scheduler

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    try:
        spec = load_spec(cfg.path)  # the header, once: for the probe and policy options
        settings, probe = _attention_setup(cfg, spec)
        lm = LoadedModel(cfg.path, settings, eval_callback=probe.callback if probe else None)
        sched = Scheduler(lm, cfg.n_slots, cfg.token_budget, cfg.kv_policy, cfg.slot_policy,
                          max_queue=cfg.max_queue, probe=probe,
                          policy_options=policy_options(spec))  # fmt: skip
    except InferenceOSError as exc:
        conn.send([(0, "error", (type(exc).__name__, str(exc)))])
        return
    conn.send([(0, "ready", _info(lm, cfg.n_slots))])
    try:
        while True:
            # block when idle; when busy, take what has arrived and go on stepping
            while conn.poll(0 if sched.has_work() else None):
                events = _handle(conn.recv(), lm, sched)
                if events is None:
                    return
                if events:
                    conn.send(events)
            if sched.has_work():
                events = _step(sched)
                if events:
                    conn.send(events)
    except (EOFError, BrokenPipeError):  # the parent went away
        return
    finally:
        sched.close()
        lm.close()
