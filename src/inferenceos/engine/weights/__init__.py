"""Weights that do not all fit: where a GGUF's tensors lie, which of them stay
resident (most reads per byte first), streaming the rest ahead of the layer that needs
it, and the residency figures the worker reports (`WeightStats`).

It may import `engine.llama`, `engine.kv` and `engine.session` (for the loaded model's
type), never the scheduler or the worker.
"""
