"""`EngineClient`: the one interface every layer above the engine uses.

Both `engine.engine.Engine` (the model in a worker process) and `engine.local.
LocalEngine` (in the caller's process) implement it; mypy checks that at the bottom of
each module. The registry holds loaded models as EngineClients, the server and the
Python API call them. What only the worker engine has (sleep / wake / resize, migrate,
worker_alive, memory_buffers) stays off this interface: callers that use it look for it
(`getattr`), as the registry does, since test fakes and LocalEngine lack it.

The contract, beyond the types: thread-safe; `generate` returns at once and its
Generation streams TokenEvents (closing it early, or setting its `CancelEvent`, frees the
slot; a stream waiting for its next token wakes for either at once); after `close()`
every call raises WorkerDiedError.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from inferenceos.engine.cancel import CancelEvent

if TYPE_CHECKING:
    from inferenceos.engine.base import Generation
    from inferenceos.engine.chat_template import ChatMessage
    from inferenceos.engine.messages import MediaSupport, StatsReport
    from inferenceos.engine.sampling import SamplingParams
    from inferenceos.media.item import MediaItem
    from inferenceos.model.spec import ModelSpec
    from inferenceos.plan.llama_params import LlamaParams


class EngineClient(Protocol):
    """A loaded model, as every caller above the engine sees it."""

    @property
    def spec(self) -> ModelSpec:
        """What the GGUF header says."""
        ...

    @property
    def n_ctx(self) -> int:
        """Context of one sequence."""
        ...

    @property
    def load_s(self) -> float: ...

    @property
    def settings(self) -> LlamaParams:
        """The llama parameters it was loaded with (n_ctx counts every slot's cells)."""
        ...

    @property
    def media_support(self) -> MediaSupport:
        """{"vision", "audio", "load_s"} when the model has a projector, else {}."""
        ...

    def media_tokens(self, item: MediaItem) -> int:
        """Context cells `item` takes in a prompt (UsageError without a projector)."""
        ...

    def chat_prompt(
        self,
        messages: Sequence[ChatMessage],
        template: str | None = None,
        tools: Sequence[dict[str, object]] | None = None,
        template_kwargs: Mapping[str, object] | None = None,
    ) -> str: ...

    def tokenize(self, text: str, add_special: bool = True) -> list[int]: ...

    def embed(self, texts: Sequence[str | list[int]]) -> list[list[float]]:
        """Mean-pooled, L2-normalised vectors, one per text (or token ids), in order."""
        ...

    def stats(self) -> StatsReport: ...

    def export_state(self, tokens: Sequence[int]) -> tuple[list[int], bytes] | None: ...

    def import_state(self, tokens: Sequence[int], data: bytes) -> int: ...

    @property
    def kv_tiers(self) -> bool:
        """Whether finished conversations go to the tiered KV cache (engine/kv/tiers.py)."""
        ...

    def prefetch(self, tokens: Sequence[int]) -> int: ...

    def generate(
        self,
        prompt: str | list[int],
        sampling: SamplingParams,
        cancel: CancelEvent | None = None,
        kv_policy: str | None = None,
        draft: str | None = None,
        media: Sequence[MediaItem] = (),
        progress: bool = False,
    ) -> Generation: ...

    def close(self) -> None: ...

    def __enter__(self) -> EngineClient: ...

    def __exit__(self, *exc: object) -> None: ...
