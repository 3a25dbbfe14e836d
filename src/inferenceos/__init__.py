"""InferenceOS: a control plane over llama.cpp for running GGUF models locally."""

__version__ = "0.1.0"
