"""Speculative decoding inside the continuous-batching step: the drafters (`ngram`,
`self`, a draft model), what each drafting sequence drafts and which tokens verification
accepts, verification row shapes, and the n-gram replay that prices drafting.

It may import `engine.llama`, `engine.kv` and the engine's per-sequence core (`session`,
`sampling`, `running`, `plugins`); the scheduler imports it, so it never imports the
scheduler, the faces (`engine`, `local`, `client`) or `worker/`.
"""
