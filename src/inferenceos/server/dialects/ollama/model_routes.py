"""Ollama-compatible model management under /api: list (`/tags`), describe (`/show`),
what is loaded (`/ps`), and the registry's pull, delete, copy, and presets: `/create`
(a Modelfile's settings as a name, registry/presets.py) with `/blobs/:digest` (the
files a create refers to, digest-checked).

Same contract as the generation routes (server/dialects/ollama/routes.py): errors are
`{"error": "..."}`, durations nanoseconds, times RFC 3339, and `/pull` streams NDJSON
progress. The bodies follow Ollama's API (server/dialects/ollama/schema.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Body, Request, Response

from inferenceos.errors import InferenceOSError
from inferenceos.registry.catalog import ResolvedModel
from inferenceos.registry.leases import ResidentModel
from inferenceos.registry.presets import Preset
from inferenceos.server.dialects.ollama.schema import (
    ERRORS,
    CopyRequest,
    NameRequest,
    PsResponse,
    PullRequest,
    ShowRequest,
    ShowResponse,
    StatusResponse,
    TagsResponse,
)
from inferenceos.server.errors import APIError, Dialect, route_class
from inferenceos.server.generation import call_in_thread
from inferenceos.server.sse import ndjson_response
from inferenceos.server.state import state_of
from inferenceos.server.tool_calls import detect_format
from inferenceos.units import iso_time

# the OpenAPI description of a streamed answer (server/dialects/ollama/routes.py has its
# own: one line of schema is not worth a shared module, and route modules do not import each other)
_NDJSON = {"application/x-ndjson": {"schema": {"type": "string"}}}
_FOREVER = "2318-01-01T00:00:00.000000Z"  # Ollama's "never expires"

# declared as ollama_routes.router is: same prefix, tag and error dialect
router = APIRouter(prefix="/api", tags=["ollama"], responses=ERRORS,
                   route_class=route_class(Dialect.OLLAMA))


def _size_label(parameters: int) -> str:
    return f"{parameters / 1e9:.1f}B" if parameters >= 1e9 else f"{parameters / 1e6:.2f}M"


def _details(m: ResolvedModel) -> dict[str, Any]:
    # a model with a projector lists "clip" too, as Ollama does (clients read it as vision)
    families = [m.architecture, *(["clip"] if m.mmproj is not None else [])]
    return {"parent_model": "", "format": "gguf", "family": m.architecture,
            "families": families, "parameter_size": _size_label(m.parameters),
            "quantization_level": m.file_type}


@router.get("/tags", response_model=TagsResponse)
async def tags(request: Request) -> Any:
    """Every model a request may name."""
    models = await call_in_thread(state_of(request).catalog.names)
    return {"models": [{"name": m.name, "model": m.name, "modified_at": iso_time(m.modified_at),
                        "size": m.size, "digest": m.digest, "details": _details(m)}
                       for m in models]}


@router.post("/show", response_model=ShowResponse)
async def show(body: ShowRequest, request: Request) -> Any:
    """Details of one model: template, architecture facts, capabilities."""
    state = state_of(request)

    def work() -> dict[str, Any]:
        from inferenceos.model.spec import load_spec

        m = state.catalog.resolve(body.target())
        try:
            spec = load_spec(m.path)
        except InferenceOSError as exc:  # its message starts with the path: not for clients
            raise type(exc)(str(exc).replace(str(m.path), f"model '{m.name}'")) from None
        arch = spec.architecture
        info = {"general.architecture": arch, "general.parameter_count": spec.parameters,
                "general.file_type": spec.file_type, f"{arch}.context_length": spec.context_length,
                f"{arch}.embedding_length": spec.embedding_length,
                f"{arch}.block_count": spec.block_count}
        projector = _projector_info(m.mmproj)
        preset = Preset.from_json(m.preset) if m.preset else None
        return {"modelfile": preset.modelfile() if preset else f"FROM {m.name}\n",
                "parameters": preset.parameters_text() if preset else "",
                "template": (preset and preset.template) or spec.chat_template or "",
                "system": preset.system if preset else None, "details": _details(m),
                "model_info": info, "projector_info": projector,
                "capabilities": _all_capabilities(m.path, spec.chat_template, projector),
                "modified_at": iso_time(m.modified_at)}
    return await call_in_thread(work)


def _projector_info(path: Path | None) -> dict[str, Any] | None:
    """The projector's metadata (Ollama's `projector_info`); None without a usable one."""
    from inferenceos.model.projector_files import projector_info

    if path is None:
        return None
    try:
        return projector_info(path)
    except InferenceOSError:  # gone or damaged since it was resolved: text only
        return None


def _media(projector: dict[str, Any] | None) -> list[str]:
    """"vision" (Ollama's word) and "audio" for what the projector's encoders take."""
    if projector is None:
        return []
    audio = projector.get("clip.has_audio_encoder") is True
    vision = projector.get("clip.has_vision_encoder", not audio) is True
    return [c for c, on in (("vision", vision), ("audio", audio)) if on]


def _capabilities(template: str | None) -> list[str]:
    """What Ollama lists: "tools" when the chat template renders tools."""
    tools = ["tools"] if detect_format(template) is not None else []
    return ["completion", "embedding", *tools]


def _all_capabilities(path: Path, template: str | None,
                      projector: dict[str, Any] | None) -> list[str]:
    """Ollama's order: completion (and embedding), tools, "insert" for a model with FIM
    tokens (its `suffix` is served: model/fim.py), the media ones, "thinking" for a
    template with a reasoning section (`think` is served: server/reasoning.py)."""
    from inferenceos.model.fim import has_fim
    from inferenceos.server.reasoning import reasoning_of

    insert = ["insert"] if has_fim(path) else []
    thinking = ["thinking"] if reasoning_of(template) is not None else []
    return [*_capabilities(template), *insert, *_media(projector), *thinking]


def _ps_entry(lm: ResidentModel, now: float) -> dict[str, Any]:
    exp = lm.expires_wall(now)
    if lm.pinned:
        exp = None
    return {"name": lm.model.name, "model": lm.model.name, "size": lm.memory_bytes,
            "digest": lm.model.digest, "details": _details(lm.model),
            "expires_at": _FOREVER if exp is None else iso_time(exp),
            "size_vram": lm.vram_bytes, "context_length": lm.n_ctx, "state": lm.tier,
            "pinned": lm.pinned, "slots": lm.slots, "memory_by_device": lm.charge,
            "reason": lm.reason, "kv_cache_ram": lm.kv_cache_ram}


@router.get("/ps", response_model=PsResponse)
async def ps(request: Request) -> Any:
    """Models loaded now, their memory and when they will be unloaded."""
    now = time.monotonic()
    return {"models": [_ps_entry(lm, now) for lm in state_of(request).manager.loaded()]}


@router.post("/pull", response_model=StatusResponse,
             responses={200: {"content": _NDJSON, "description": "Status, or NDJSON progress"}})
async def pull(body: PullRequest, request: Request) -> Any:
    """Register a model by name: `hf.co/ORG/REPO[:QUANT]` (or `.../FILE.gguf`) from the
    Hugging Face Hub, streaming byte progress (`total` / `completed`) as Ollama does, or
    the built-in model."""
    from inferenceos.registry import hub

    state = state_of(request)
    name = body.target()
    if not name:
        raise APIError(400, "model is required")
    store = state.catalog.store
    if hub.is_hub_name(name):
        hub.parse_hub_ref(name)  # a bad name fails before the stream starts
    else:
        store.pull_check(name)
    if not body.stream:
        await call_in_thread(lambda: hub.pull(store, name))
        return {"status": "success"}

    def job(cancel: threading.Event) -> Iterator[dict[str, Any]]:
        if hub.is_hub_name(name):  # a client that leaves stops the download (kept to resume)
            for event in hub.pull_events(store, name, cancel=cancel):
                yield event.to_ollama()
            return
        messages: list[str] = []
        yield {"status": "pulling manifest"}
        store.pull(name, progress=messages.append)
        for m in messages:
            yield {"status": m}

    from inferenceos.server.bridge import ThreadStream

    async def lines() -> AsyncIterator[dict[str, Any]]:
        stream = ThreadStream(job, name="pull")
        try:
            async for item in stream:
                yield item
        finally:
            await stream.aclose()

    return ndjson_response(lines())


@router.delete("/delete", responses={200: {"description": "Deleted"}})
async def delete(body: NameRequest, request: Request) -> Response:
    """Remove a model from the registry (unloading it first)."""
    state = state_of(request)

    def work() -> None:
        name = body.target()
        if state.catalog.is_alias(name):
            raise APIError(400, f"'{name}' is a file served directly; it cannot be deleted")
        entry = state.catalog.store.get(name)
        if any(lm.model.name == entry.name for lm in state.manager.loaded()):
            state.manager.unload(entry.name)
        state.catalog.store.remove(entry.name)
    await call_in_thread(work)
    return Response(status_code=200)


@router.post("/copy", responses={200: {"description": "Copied"}})
async def copy(body: CopyRequest, request: Request) -> Response:
    """Give a registered model a second name."""
    store = state_of(request).catalog.store
    await call_in_thread(lambda: store.copy(body.source, body.destination))
    return Response(status_code=200)


# -- presets: /create and /blobs -----------------------------------------------------------


def _create_modelfile(body: dict[str, Any]) -> Any:
    """A create body → a parsed Modelfile: the legacy `modelfile` text, or the current
    JSON form ({model, from, files, adapters, template, system, parameters,
    messages}); blob references are `@sha256:` digests. APIError 400 for a bad one."""
    from inferenceos.registry.presets import Modelfile, json_parameters, parse_modelfile

    if body.get("quantize"):
        raise APIError(400, "quantize is not supported: create from a quantized GGUF")
    text = body.get("modelfile")
    mf = parse_modelfile(text) if isinstance(text, str) and text.strip() else Modelfile()
    files, adapters = body.get("files") or {}, body.get("adapters") or {}
    if not isinstance(files, dict) or not isinstance(adapters, dict):
        raise APIError(400, "files and adapters must map file names to sha256 digests")
    ggufs = [d for f, d in files.items() if str(f).lower().endswith(".gguf")]
    if len(ggufs) > 1:
        raise APIError(400, "files: one GGUF model file per create")
    base = body.get("from") or (f"@{ggufs[0]}" if ggufs else None)
    if base is not None:
        mf.from_ = str(base)
    mf.adapters += [f"@{d}" for d in adapters.values()]
    for key in ("system", "template"):
        if isinstance(body.get(key), str):
            setattr(mf, key, body[key])
    mf.parameters.update(json_parameters(body.get("parameters")))
    msgs = body.get("messages") or []
    if not isinstance(msgs, list) or not all(isinstance(m, dict) for m in msgs):
        raise APIError(400, "messages must be a list of {role, content}")
    mf.messages += [(str(m.get("role", "")), str(m.get("content", ""))) for m in msgs]
    if not mf.from_:
        raise APIError(400, "from is required (a model name, or a GGUF in files)")
    return mf


@router.post("/create", response_model=StatusResponse,
             responses={200: {"content": _NDJSON, "description": "Status, or NDJSON status"}})
async def create(request: Request, body: dict[str, Any] = Body(...)) -> Any:  # noqa: B008
    """Create a preset named `model` (legacy: `name`) from another model or an uploaded
    GGUF, with a system prompt, template, parameters, adapters and messages."""
    from inferenceos.registry.presets import create_preset

    state = state_of(request)
    name = body.get("model") or body.get("name")
    if not isinstance(name, str) or not name.strip():
        raise APIError(400, "model is required")
    mf = _create_modelfile(body)
    catalog = state.catalog

    def served(ref: str) -> tuple[Path, str] | None:
        if not catalog.is_alias(ref):
            return None
        m = catalog.resolve(ref)
        return m.path, m.digest

    await call_in_thread(lambda: create_preset(catalog.store, name, mf, served=served))
    if body.get("stream") is False:
        return {"status": "success"}

    async def lines() -> AsyncIterator[dict[str, Any]]:
        for status in ("using existing layers", "writing manifest", "success"):
            yield {"status": status}

    return ndjson_response(lines())


@router.head("/blobs/{digest}", responses={200: {"description": "The store has it"}})
async def has_blob(digest: str, request: Request) -> Response:
    """200 when the store holds a blob of this `sha256:<hex>` digest, else 404."""
    path = state_of(request).catalog.store.blob_path(digest)
    return Response(status_code=200 if path.is_file() else 404)


@router.post("/blobs/{digest}", status_code=201,
             responses={201: {"description": "Stored"}, 400: {"description": "Mismatch"}})
async def put_blob(digest: str, request: Request) -> Response:
    """Store the body as the blob `digest` (sha256-checked while it arrives; 400 and
    nothing stored when the bytes have another digest)."""
    from inferenceos.registry.presets import store_blob_bytes

    store = state_of(request).catalog.store
    store.blob_path(digest)  # a malformed digest: 400 before the body is read
    data = await request.body()
    await call_in_thread(lambda: store_blob_bytes(store.blobs, digest, [data]))
    return Response(status_code=201)
