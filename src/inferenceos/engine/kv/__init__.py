"""The KV cache: which slot holds which tokens (prefix reuse), what a policy sees of a
sequence and what it evicts (sinks, H2O, with the attention probe), usage statistics,
exporting a slot's state, and the tiered store of prefix states in RAM and on disk.

It may import `engine.llama` and `engine.plugins` (policies are plugins), nothing else
of the engine: the scheduler drives it, never the other way round.
"""
