"""Server-side sessions: `/v1/sessions` (create, list, get, delete, resume, messages).

A session is a conversation the server keeps, with the KV state of its history saved
to disk after every turn (`llama_state_seq_get_data`). The next turn — later, or after
a server restart — restores that state into an idle slot (`llama_state_seq_set_data`)
before generating, so the model reads only the new message, not the whole history
again (the reply's `usage.cached_tokens` says how many tokens were reused).

    POST   /v1/sessions                 {model, system?, metadata?} → session
    GET    /v1/sessions                 → {"object": "list", "data": [session, ...]}
    GET    /v1/sessions/{id}            → session with its messages
    DELETE /v1/sessions/{id}            → {"id", "object": "session.deleted", "deleted"}
    POST   /v1/sessions/{id}/resume     → load the model, restore the saved KV state now
    POST   /v1/sessions/{id}/messages   {content, max_tokens?, temperature?, ..., stream?}
                                        → the reply (SSE `data:` deltas when streaming)

A state is only restored into the model file it came from (digest checked) and only
when the conversation's tokens still start with the ones it holds; otherwise the
history is simply prefilled again. Turns of one session are serialised.

Where the engine keeps the tiered KV cache (`serve`'s default, engine/kv/tiers.py), a
session is a thin layer over it: its folder holds the conversation only; each turn's
KV state is the cache's entry (stored at the turn's end, restored by any request whose
prompt starts with it, under the cache's budgets and eviction), and `resume` brings
that entry into an idle slot (`Engine.prefetch`). Without the cache, the session keeps
its own `state.bin`, exported after every turn and imported before the next.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

from fastapi import APIRouter, Request

from inferenceos.engine.chat_template import ChatMessage
from inferenceos.engine.kv.slots import shared_prefix
from inferenceos.errors import InferenceOSError
from inferenceos.paths import data_dir
from inferenceos.server.dialects.openai.schema import ERROR_RESPONSES, ErrorResponse
from inferenceos.server.dialects.responses.schema import SessionCreate, SessionMessage
from inferenceos.server.dialects.responses.session_store import (
    Session,
    SessionNotFoundError,
    SessionStore,
)
from inferenceos.server.errors import APIError, Dialect, route_class
from inferenceos.server.generation import (
    Done,
    GenRequest,
    call_in_thread,
    start_generation,
    until_disconnect,
)
from inferenceos.server.options import UNLIMITED, request_sampling, stops
from inferenceos.server.reply import Final, reply_events
from inferenceos.server.sse import sse_response
from inferenceos.server.state import ServerState, state_of

_CONFLICT: dict[int | str, dict[str, Any]] = {
    409: {"model": ErrorResponse, "description": "A turn of this session runs"}}
router = APIRouter(prefix="/v1", tags=["sessions"], responses={**ERROR_RESPONSES, **_CONFLICT},
                   route_class=route_class(Dialect.OPENAI))


def _store(request: Request) -> SessionStore:
    store = getattr(request.app.state, "sessions", None)
    if store is None:
        store = request.app.state.sessions = SessionStore(data_dir() / "sessions")
    return store


def _get(store: SessionStore, sid: str) -> Session:
    try:
        return store.get(sid)
    except SessionNotFoundError as exc:
        raise APIError(404, str(exc), "session_not_found") from None


@router.post("/sessions", status_code=201)
async def create_session(body: SessionCreate, request: Request) -> Any:
    """Start a session on a model (the server's default when none is named)."""
    state = state_of(request)
    name = state.model_name(body.model)
    resolved = await call_in_thread(lambda: state.catalog.resolve(name))
    s = await call_in_thread(
        lambda: _store(request).create(resolved.name, body.system or "", body.metadata))
    return s.public()


@router.get("/sessions")
async def list_sessions(request: Request) -> Any:
    """Every session, oldest first (without their messages)."""
    sessions = await call_in_thread(_store(request).list)
    return {"object": "list", "data": [s.public(with_messages=False) for s in sessions]}


@router.get("/sessions/{session_id}")
async def get_session(session_id: str, request: Request) -> Any:
    """One session with its messages."""
    return _get(_store(request), session_id).public()


@router.delete("/sessions/{session_id}")
async def delete_session(session_id: str, request: Request) -> Any:
    """Forget a session and its saved state."""
    store = _store(request)
    _get(store, session_id)  # 404 first: no lock is made for ids that name nothing
    with _turn(store, session_id):
        try:
            store.delete(session_id)
        except SessionNotFoundError as exc:
            raise APIError(404, str(exc), "session_not_found") from None
    store.forget(session_id)
    return {"id": session_id, "object": "session.deleted", "deleted": True}


@contextlib.contextmanager
def _turn(store: SessionStore, sid: str) -> Iterator[None]:
    """Hold the session's lock; 409 at once when a turn is in progress (the event
    loop must never wait on it)."""
    lock = store.lock(sid)
    if not lock.acquire(blocking=False):
        raise APIError(409, "this session is answering another message", "session_busy")
    try:
        yield
    finally:
        lock.release()


def _chat(s: Session, user: str | None = None) -> list[ChatMessage]:
    msgs = [ChatMessage("system", s.system)] if s.system else []
    msgs += [ChatMessage(m["role"], m["content"]) for m in s.messages]
    if user is not None:
        msgs.append(ChatMessage("user", user))
    return msgs


def _restore(state: ServerState, store: SessionStore, s: Session,
             tokens: list[int] | None) -> tuple[list[int], int | None]:
    """(the prompt's token ids, how many of them the restored state holds): load the
    model, render and tokenize the conversation, and put the saved state into an idle
    slot when it still matches (blocking: call in a thread). Without `tokens` the
    prompt is the history alone (resume). None: the tiered KV cache restores it when
    the prompt is admitted (its `cached_tokens` say how much)."""
    with state.manager.acquire(s.model) as lease:
        engine = lease.engine
        prompt = tokens if tokens is not None else engine.tokenize(
            engine.chat_prompt(_chat(s)) if s.messages or s.system else "")
        if engine.kv_tiers:  # the cache restores it (resume: now)
            return prompt, (engine.prefetch(prompt) if tokens is None and prompt else None)
        data = store.state(s)
        saved = s.state_tokens
        importer = getattr(engine, "import_state", None)
        shared = shared_prefix(saved, prompt)
        if (data is None or importer is None or s.model_digest != lease.loaded.model.digest
                or shared == 0):
            return prompt, 0
        try:  # the slot then holds `saved`; admission keeps the part the prompt shares
            return prompt, min(shared, int(importer(saved, data)))
        except InferenceOSError:  # refused (KV types changed, damaged file): prefill instead
            return prompt, 0


def _save_state(state: ServerState, store: SessionStore, s: Session,
                tokens: list[int]) -> None:
    """Export the KV cells holding `tokens` and write them with the session (with the
    tiered cache: the conversation only; the cache holds the state)."""
    with state.manager.acquire(s.model) as lease:
        if lease.engine.kv_tiers:
            s.state_tokens, s.model_digest = list(tokens), lease.loaded.model.digest
            store.save(s)
            store.drop_state(s)  # one written before the cache was on: stale now
            return
        exporter = getattr(lease.engine, "export_state", None)
        got = exporter(tokens) if exporter is not None else None
        digest = lease.loaded.model.digest
    if got is None:
        s.state_tokens, s.model_digest = [], ""
        store.save(s)
        return
    held, data = got
    s.state_tokens, s.model_digest = list(held), digest
    store.save(s, data)


@router.post("/sessions/{session_id}/resume")
async def resume_session(session_id: str, request: Request) -> Any:
    """Load the session's model and restore its saved KV state now, so that the next
    message starts at once."""
    state, store = state_of(request), _store(request)
    s = _get(store, session_id)
    t0 = time.perf_counter()
    with _turn(store, session_id):
        prompt, restored = await call_in_thread(lambda: _restore(state, store, s, None))
    return {"id": s.id, "object": "session.resumed", "restored_tokens": restored or 0,
            "history_tokens": len(prompt), "seconds": round(time.perf_counter() - t0, 4)}


@router.post("/sessions/{session_id}/messages")
async def session_message(session_id: str, body: SessionMessage, request: Request) -> Any:
    """The next user turn: restore the saved state, generate the reply, save the new
    state and the two messages. Streamed as SSE `data:` deltas when `stream` is true."""
    state, store = state_of(request), _store(request)
    s = _get(store, session_id)
    lock = store.lock(session_id)
    if not lock.acquire(blocking=False):
        raise APIError(409, "this session is answering another message", "session_busy")
    released = False

    def release() -> None:
        nonlocal released
        if not released:
            released = True
            lock.release()

    try:
        sampling = request_sampling(body, stop=stops(body.stop),
                                    max_tokens=body.max_tokens or UNLIMITED)

        def prepare() -> tuple[list[int], int | None]:
            with state.manager.acquire(s.model) as lease:
                text = lease.engine.chat_prompt(_chat(s, body.content))
                tokens = lease.engine.tokenize(text)
            return _restore(state, store, s, tokens)

        prompt, restored = await until_disconnect(request, call_in_thread(prepare))
        t0 = time.perf_counter()
        run = await until_disconnect(request, start_generation(
            state, GenRequest(s.model, sampling, tokens=tuple(prompt))))
    except BaseException:
        release()
        raise

    async def finish(text: str, done: Done) -> dict[str, Any]:
        s.messages += [{"role": "user", "content": body.content},
                       {"role": "assistant", "content": text}]
        ids = done.prompt_ids + done.output_ids
        await call_in_thread(lambda: _save_state(state, store, s, ids))
        g = done.metrics
        # over the tiered cache, what it restored is the request's cached prefix
        n_restored = g.cached_tokens if restored is None else restored
        return {"id": s.id, "object": "session.message", "model": s.model,
                "message": {"role": "assistant", "content": text},
                "finish_reason": "length" if g.stop_reason == "length" else "stop",
                "usage": {"prompt_tokens": g.prompt_tokens,
                          "completion_tokens": g.completion_tokens,
                          "total_tokens": g.prompt_tokens + g.completion_tokens,
                          "cached_tokens": g.cached_tokens},
                "timings": {"restored_tokens": n_restored, "ttft_s": round(g.ttft_s, 4),
                            "total_s": round(time.perf_counter() - t0, 4)}}

    if body.stream:
        async def events() -> AsyncIterator[dict[str, Any]]:
            parts: list[str] = []
            try:
                async with contextlib.aclosing(reply_events(run)) as replies:
                    async for d in replies:
                        if isinstance(d, Final):
                            yield await finish("".join(parts), d.done)
                        elif d.text:
                            parts.append(d.text)
                            yield {"id": s.id, "object": "session.delta", "delta": d.text}
            finally:
                release()

        async def cleanup() -> None:
            await run.close()
            release()

        return sse_response(events(), cleanup)

    try:
        async def whole() -> dict[str, Any]:
            text, done = await run.collect()
            return await finish(text, done)

        return await until_disconnect(request, whole())
    finally:
        with contextlib.suppress(Exception):
            await asyncio.shield(run.close())
        release()
