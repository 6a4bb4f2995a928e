"""The FastAPI app: routers, error handlers, middleware, and the lifespan that builds the services."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from dashboard import mount as dashboard
from dashboard.state import Dashboard
from gateway.engine_pool import EnginePool
from gateway.errors import ERROR_RESPONSES, install_error_handlers
from gateway.middleware import BodyLimit, RequestId
from gateway.routes import admin, chat, health, models
from gateway.services import Services, build_services
from gateway.settings import Settings


def create_app(settings: Settings, *, pool: EnginePool | None = None, own_pool: bool = True) -> FastAPI:
    """``pool``: engines already loaded (tests, benchmarks); closed with the app only if ``own_pool``."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        services: Services = await build_services(settings, pool=pool)
        app.state.services = services
        app.state.dashboard = Dashboard.start(services) if settings.dashboard.enabled else None
        try:
            yield
        finally:
            if app.state.dashboard is not None:
                await app.state.dashboard.aclose()
            if not own_pool and pool is not None:
                services.pool = EnginePool({})  # leave the shared engines running
            await services.aclose()

    app = FastAPI(title="HeteroFold Gateway", version="0.1.0", lifespan=lifespan)
    install_error_handlers(app)
    for router in (chat.router, models.router, admin.router, health.router):
        app.include_router(router, responses=ERROR_RESPONSES)
    if settings.dashboard.enabled:
        dashboard.install(app)
    app.add_middleware(BodyLimit, limit=settings.limits.max_body_bytes)
    app.add_middleware(RequestId)
    return app
