"""The dashboard's read-only pages and feeds (open, like ``/metrics``; admin actions are in
``actions.py``).

GET /dashboard                     overview: per-route traffic, speedup and drift, tier memory, alerts
GET /dashboard/adapters            versions per ordered pair, fidelity, drift, every replica's fit jobs, audit
GET /dashboard/live                the live event feed
GET /dashboard/events              Server-Sent Events (``?after=<stream id>`` or Last-Event-ID)
GET /dashboard/fits/{id}           one fit job, with live progress
GET /dashboard/fits/{id}/progress  its progress as JSON
"""

from __future__ import annotations

import asyncio
import re
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import HTMLResponse, StreamingResponse

from dashboard import feed
from dashboard.adapters_view import Drift, active_drift, audit_rows, pair_views
from dashboard.charts import Series, bar_chart, line_chart
from dashboard.errors import PageError
from dashboard.routes_view import PATHS, route_stats, totals, with_drift
from dashboard.web import DashboardDep, SessionDep, render
from gateway.deps import ServicesDep
from gateway.errors import GatewayError, RegistryError
from gateway.lifecycle import in_session
from gateway.request_log import RequestRecord
from store.errors import StoreError

router = APIRouter(prefix="/dashboard", tags=["dashboard"], include_in_schema=False)
STREAM_ID = re.compile(r"^\d{1,20}-\d{1,20}$")
BACKLOG = 50
AUDIT_ROWS = 20
JOB_ROWS = 20


@router.get("", response_class=HTMLResponse)
async def overview(request: Request, services: ServicesDep, dash: DashboardDep, session: SessionDep) -> HTMLResponse:
    records: list[RequestRecord] = []
    drift: dict[tuple[str, str], Drift] = {}
    shadow = services.settings.shadow
    registry_ok = True
    try:
        records = await asyncio.to_thread(services.requests.recent, dash.settings.requests)
        drift = await in_session(services.db, lambda s: active_drift(session=s, pool=services.pool,
                                                                      window=shadow.window))  # fmt: skip
    except RegistryError:
        registry_ok = False
    routes = with_drift(route_stats(records), drift, shadow)
    speedups = [(r.label, s) for r in routes if (s := r.speedup) is not None]
    speed_chart = bar_chart(speedups, title="Speedup per route: median TTFT native / transfer",
                            fmt=lambda v: f"{v:.2f}x", reference=1.0, empty="no transferred requests yet")  # fmt: skip
    usage = await asyncio.to_thread(services.store.usage)
    series = [Series(tier, points) for tier, points in dash.history.percent_series().items()]
    memory_chart = line_chart(series, title="Tier memory used, percent of budget", fmt=lambda v: f"{v:.3g}%",
                              threshold=services.store.config.high_water * 100, threshold_label="high water",
                              empty="no samples yet")  # fmt: skip
    return await render(
        request, "overview.html", services=services, dash=dash, session=session, routes=routes, paths=PATHS,
        totals=totals(routes), speed_chart=speed_chart, usage=usage, memory_chart=memory_chart,
        registry_ok=registry_ok, window=dash.settings.requests, samples=len(dash.history),
        interval=dash.settings.sample_interval_s, shadow=shadow, node=services.store.config.node,
    )  # fmt: skip


@router.get("/adapters", response_class=HTMLResponse)
async def adapters(request: Request, services: ServicesDep, dash: DashboardDep, session: SessionDep) -> HTMLResponse:
    shadow = services.settings.shadow
    try:
        pairs = await in_session(services.db, lambda s: pair_views(
            session=s, pool=services.pool, window=shadow.window, threshold=shadow.drift_kl_threshold))  # fmt: skip
        audit = await in_session(services.db, lambda s: audit_rows(session=s, limit=AUDIT_ROWS))
        jobs = await asyncio.to_thread(services.jobs.list, limit=JOB_ROWS)
    except GatewayError as exc:
        raise PageError(exc.status, str(exc)) from exc
    return await render(
        request, "adapters.html", services=services, dash=dash, session=session, pairs=pairs, audit=audit,
        jobs=jobs, shadow=shadow, replica=services.jobs.replica,
    )  # fmt: skip


@router.get("/live", response_class=HTMLResponse)
async def live(request: Request, services: ServicesDep, dash: DashboardDep, session: SessionDep) -> HTMLResponse:
    try:
        events = await asyncio.to_thread(feed.recent_events, services.store.events, BACKLOG)
    except StoreError:
        events = []
    items = [feed.describe(e) for e in events]
    return await render(request, "live.html", services=services, dash=dash, session=session, items=items)


@router.get("/events")
async def events(
    services: ServicesDep, dash: DashboardDep, after: Annotated[str | None, Query(max_length=50)] = None,
    last_event_id: Annotated[str | None, Header(max_length=50)] = None,
) -> StreamingResponse:  # fmt: skip
    """New events as SSE: after the browser's Last-Event-ID on a reconnect, else after ``after``,
    else from now on."""
    cursor = last_event_id or after
    if cursor is not None and not STREAM_ID.match(cursor):
        raise PageError(400, "after must be an event stream id like 1700000000000-0")
    if cursor is None:
        try:
            cursor = await asyncio.to_thread(feed.last_id, services.store.events)
        except StoreError as exc:
            raise PageError(503, f"the event stream is unavailable: {exc}") from exc
    s = dash.settings
    body = feed.stream(services.store.events, cursor, poll_s=s.poll_s, stream_s=s.stream_s)
    return StreamingResponse(body, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


@router.get("/fits/{job_id}", response_class=HTMLResponse)
async def fit_job(
    request: Request, job_id: str, services: ServicesDep, dash: DashboardDep, session: SessionDep
) -> HTMLResponse:
    try:
        job = await asyncio.to_thread(services.jobs.get, job_id)
    except GatewayError as exc:
        raise PageError(exc.status, str(exc)) from exc
    return await render(request, "fit_job.html", services=services, dash=dash, session=session, job=job.view(),
                        stale_after_s=services.jobs.stale_after_s)  # fmt: skip


@router.get("/fits/{job_id}/progress")
async def fit_progress(job_id: str, services: ServicesDep) -> dict[str, Any]:
    try:
        return (await asyncio.to_thread(services.jobs.get, job_id)).view()
    except GatewayError as exc:
        raise PageError(exc.status, str(exc)) from exc
