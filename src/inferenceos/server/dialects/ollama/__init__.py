"""Ollama's dialect under /api: generation (generate, chat, embed) and model management
(tags, show, pull, ps, ...): schemas and routes (docs/api.md)."""
