"""llama.cpp itself: loading the shared library, its parameter structs built from a
plan's `LlamaParams`, reusable batches, backend devices, the GGUF header of a loaded
model, and what llama.cpp's load log says it allocated.

Owns every direct ctypes call that sets llama.cpp up. It imports no other engine module:
everything else in the engine builds on it.
"""
