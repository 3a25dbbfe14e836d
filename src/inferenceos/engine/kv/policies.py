"""KV cache policies: what to do when a sequence has filled its share of the cache.

A policy is a class with a `name` and `make_room(view) -> bool`. The scheduler calls
`make_room` when a generating sequence needs one more cell than its slot holds; the
policy may drop cells through the view (returning True: generation goes on) or decline
(False: the sequence ends with "length").

Policies are found through the Python entry-point group `inferenceos.kv_policies`
(`name = "module:Class"`); InferenceOS registers its own there too, so a plugin
package is discovered exactly like the built-ins. `inferenceos plugins` lists them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from inferenceos.engine import plugins
from inferenceos.model.spec import ModelSpec

ENTRY_POINT_GROUP = "inferenceos.kv_policies"


class SequenceView(Protocol):
    """What a policy may see and do to one sequence's cache."""

    @property
    def n_past(self) -> int:
        """Cells the sequence occupies (positions 0..n_past-1)."""
        ...

    def remove(self, p0: int, p1: int) -> None:
        """Drop positions [p0, p1) and shift later positions down to close the gap."""
        ...

    def attention_scores(self) -> np.ndarray | None:
        """Accumulated attention per position (None unless the policy needs_attention)."""
        ...


class KVPolicy(Protocol):
    name: str
    # True: the engine must watch attention (flash attention off); plugins may omit it
    needs_attention: bool

    def make_room(self, seq: SequenceView) -> bool: ...


@dataclass
class NoEviction:
    """Never evict: a full sequence ends ("length"), as plain llama.cpp does."""

    name: str = "none"
    needs_attention: bool = False

    def make_room(self, seq: SequenceView) -> bool:
        return False


@dataclass
class StreamingLLM:
    """StreamingLLM (Xiao et al. 2023): keep `n_sink` first tokens and the recent half.

    Attention sinks — the first few tokens that absorb attention mass — stay; the older
    half of the rest is dropped and the newer half shifted down, so generation continues
    indefinitely in constant memory.
    """

    name: str = "streaming"
    needs_attention: bool = False
    n_sink: int = 4

    def make_room(self, seq: SequenceView) -> bool:
        n_discard = (seq.n_past - self.n_sink) // 2
        if n_discard <= 0:
            return False
        seq.remove(self.n_sink, self.n_sink + n_discard)
        return True


@dataclass
class HeavyHitterOracle:
    """H2O (Zhang et al. 2023): keep the tokens that received the most attention.

    When the sequence is full, `evict_fraction` of it is dropped at once (amortising the
    position shifts); of what stays, `recent_fraction` is the most recent tokens and the
    rest the heavy hitters — the older tokens with the largest accumulated attention.
    Needs the attention probabilities, which llama.cpp computes only with flash
    attention off; so H2O and a quantized V cache (which requires flash attention)
    exclude each other.
    """

    name: str = "h2o"
    needs_attention: bool = True
    recent_fraction: float = 0.5
    evict_fraction: float = 0.25

    def make_room(self, seq: SequenceView) -> bool:
        scores = seq.attention_scores()
        n = seq.n_past
        if scores is None or len(scores) != n or n < 4:
            return False
        keep = n - max(1, int(n * self.evict_fraction))
        n_recent = max(1, int(keep * self.recent_fraction))
        older = n - n_recent
        heavy = np.argsort(-scores[:older], kind="stable")[: keep - n_recent]
        evict = np.setdiff1d(np.arange(older), heavy)
        for p0, p1 in reversed(_runs(evict)):  # from the end: earlier positions stay valid
            seq.remove(p0, p1)
        return True


def _runs(positions: np.ndarray) -> list[tuple[int, int]]:
    """Sorted positions → maximal [start, end) runs."""
    runs: list[tuple[int, int]] = []
    for p in positions.tolist():
        if runs and runs[-1][1] == p:
            runs[-1] = (runs[-1][0], p + 1)
        else:
            runs.append((p, p + 1))
    return runs


def available_policies() -> dict[str, str]:
    """Installed policy names → 'module:Class' (from the entry-point group)."""
    return plugins.registered(ENTRY_POINT_GROUP)


def load_policy(name: str, **options: Any) -> KVPolicy:
    """Instantiate the policy registered as `name`; UsageError when none is."""
    builtin = {"none": NoEviction, "streaming": StreamingLLM, "h2o": HeavyHitterOracle}
    cls = plugins.find(ENTRY_POINT_GROUP, name, builtin, "KV policy")
    policy: KVPolicy = cls(**options)
    return policy


def policy_options(spec: ModelSpec) -> dict[str, dict[str, Any]]:
    """KV policy options suited to the model: on models whose layers are mostly
    sliding-window, H2O keeps 90 % recent tokens (measured with benchmarks/kv_policies.py
    on Gemma 3: perplexity 9.05 against 9.55 with the paper's even split, 9.13 for
    StreamingLLM)."""
    layers = spec.layers
    if layers and sum(layer.is_swa for layer in layers) * 2 > len(layers):
        return {"h2o": {"recent_fraction": 0.9}}
    return {}
