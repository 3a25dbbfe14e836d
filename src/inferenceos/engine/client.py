"""`EngineClient`: the one interface every layer above the engine uses.

It is `engine.base.EngineBase`, whose abstract members (generate, chat_prompt, tokenize,
embed, stats, media, state export / import, ...) both `engine.engine.Engine` (the model
in a worker process) and `engine.local.LocalEngine` (in the caller's process) implement:
every engine is an EngineBase, so the interface is written once. The registry holds
loaded models as EngineClients, the server and the Python API call them. What only the
worker engine has (sleep / wake / resize, migrate, worker_alive, memory_buffers) stays
off this interface: callers that use it look for it (`getattr`), as the registry does,
since test fakes and LocalEngine lack it.

The contract, beyond the types: thread-safe; `generate` returns at once and its
Generation streams TokenEvents (closing it early, or setting its `CancelEvent`, frees the
slot; a stream waiting for its next token wakes for either at once); after `close()`
every call raises WorkerDiedError.
"""

from __future__ import annotations

from inferenceos.engine.base import EngineBase as EngineClient

__all__ = ["EngineClient"]
