"""Probes (no auth) and the Prometheus scrape."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from gateway.deps import DbDep, MetricsDep, PoolDep, ServicesDep, StoreDep
from gateway.errors import RegistryError
from store.errors import StoreError

router = APIRouter(tags=["operations"])


@router.get("/health/live")
async def live() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/health/ready", response_model=None)
async def ready(pool: PoolDep, store: StoreDep, db: DbDep, services: ServicesDep) -> JSONResponse:
    checks: dict[str, str] = {"engines": ", ".join(p.name for p in pool) or "none loaded"}
    ok = bool(checks["engines"] != "none loaded")
    try:
        await asyncio.to_thread(store.ping)
        checks["redis"] = "ok"
    except StoreError as exc:
        checks["redis"], ok = f"unavailable: {exc}", False
    connecting = services.registry_connect is not None and not services.registry_connect.done()
    try:
        await asyncio.to_thread(db.ping)
        checks["database"] = "connecting: migrations pending" if connecting else "ok"
        ok = ok and not connecting
    except RegistryError as exc:
        checks["database"], ok = f"unavailable: {exc}", False
    return JSONResponse({"status": "ready" if ok else "not ready", "checks": checks}, status_code=200 if ok else 503)


@router.get("/metrics", response_class=Response, responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}})
async def metrics(m: MetricsDep) -> Response:
    return Response(await asyncio.to_thread(m.render), media_type=CONTENT_TYPE_LATEST)
