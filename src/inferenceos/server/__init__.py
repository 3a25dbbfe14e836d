"""The HTTP API: OpenAI- and Ollama-compatible routes over the model manager.

`create_app(settings, catalog, manager)` builds the FastAPI app; `runner.serve(...)`
runs it under uvicorn with a graceful shutdown. See docs/api.md.
"""
