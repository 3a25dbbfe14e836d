"""The FastAPI app factory.

Middleware, outermost first: access log → Host check (loopback only) → CORS → API key
→ body limit → JSON bodies (curl -d without a Content-Type, as Ollama allows) → routes.
the Host check sits outside everything so a rebinding page learns nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator

from fastapi import APIRouter, FastAPI

from inferenceos.hardware import cpu_share
from inferenceos.registry.catalog import Catalog
from inferenceos.registry.manager import ModelManager
from inferenceos.server import ui_routes
from inferenceos.server.dialects.anthropic import routes as anthropic_routes
from inferenceos.server.dialects.llamacpp import routes as llamacpp_routes
from inferenceos.server.dialects.ollama import model_routes as ollama_model_routes
from inferenceos.server.dialects.ollama import routes as ollama_routes
from inferenceos.server.dialects.openai import routes as openai_routes
from inferenceos.server.dialects.responses import routes as responses_routes
from inferenceos.server.dialects.responses import sessions_routes
from inferenceos.server.errors import install_handlers
from inferenceos.server.header_case import CorsHeaderCase
from inferenceos.server.json_body import JsonBodies
from inferenceos.server.ops import budget_routes
from inferenceos.server.ops import routes as ops_routes
from inferenceos.server.ops.access_log import AccessLog
from inferenceos.server.security import ApiKeyAuth, BodyLimit, Cors, HostCheck, cors_options
from inferenceos.server.settings import ServerSettings
from inferenceos.server.state import ServerState
from inferenceos.version import __version__

# every route the app serves, in the order they match; each router declares the
# dialect of its errors (errors.route_class). Ollama's model routes follow its
# generation routes, where they sat when one module held both (same OpenAPI order)
ROUTERS: tuple[APIRouter, ...] = (
    ops_routes.router, openai_routes.router, ollama_routes.router, ollama_model_routes.router,
    openai_routes.bare_router,
    llamacpp_routes.router, responses_routes.router, anthropic_routes.router,
    sessions_routes.router, budget_routes.router, ui_routes.router,
)


def create_app(settings: ServerSettings, catalog: Catalog, manager: ModelManager) -> FastAPI:
    """An app serving `catalog`'s models through `manager`. The app owns the manager:
    its lifespan starts the keep-alive reaper and unloads every model at shutdown."""
    if not settings.version:
        settings = dataclasses.replace(settings, version=__version__)
    from inferenceos import logs

    logs.setup("server")
    state = ServerState(settings, catalog, manager)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        manager.start_reaper()
        cpu_share.lower_this_thread()  # the event loop: after the worker's threads
        try:
            yield
        finally:
            state.draining = True
            state.cancel_all()
            await asyncio.to_thread(manager.close)  # engines finish their last step

    app = FastAPI(title="InferenceOS", version=settings.version, lifespan=lifespan,
                  summary="OpenAI-, Ollama- and Anthropic-compatible API over llama.cpp")
    app.state.ios = state
    install_handlers(app, ROUTERS)
    for router in ROUTERS:
        app.include_router(router)
    budget_routes.attach(app, manager)  # the pressure reactor; it stops with the manager
    # add_middleware wraps: the last added is the outermost
    app.add_middleware(JsonBodies)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    if settings.api_key:
        app.add_middleware(ApiKeyAuth, key=settings.api_key)
    app.add_middleware(Cors, **cors_options(settings.cors_origins, settings.cors_allow_local))
    app.add_middleware(CorsHeaderCase)  # Access-Control-* names as llama-server sends them
    if settings.on_loopback:
        app.add_middleware(HostCheck, allowed=settings.allowed_hosts)
    app.add_middleware(AccessLog, counter=state.metrics.http)
    return app
