"""What every dashboard page shares: templates, typed dependencies, the admin session, the error
page, and the context of the layout (sign-in state, CSRF token, OOM banner, feed cursor)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.responses import HTMLResponse
from fastapi.templating import Jinja2Templates

from dashboard.errors import PageError
from dashboard.feed import FeedItem, active_alerts, recent_events
from dashboard.sessions import COOKIE, Session
from dashboard.state import Dashboard
from gateway.deps import ServicesDep
from store.errors import StoreError

HERE = Path(__file__).parent
TEMPLATES = Jinja2Templates(directory=HERE / "templates")
RECENT = 500  # events scanned for active alerts


def get_dashboard(request: Request) -> Dashboard:
    dash: Dashboard | None = getattr(request.app.state, "dashboard", None)
    if dash is None:
        raise PageError(404, "the dashboard is off (dashboard.enabled)")
    return dash


DashboardDep = Annotated[Dashboard, Depends(get_dashboard)]


def current_session(request: Request, dash: DashboardDep) -> Session | None:
    return dash.sessions.verify(request.cookies.get(COOKIE))


def require_session(session: Annotated[Session | None, Depends(current_session)], dash: DashboardDep) -> Session:
    if not dash.sessions.enabled:
        raise PageError(403, "Admin actions are off: the gateway has no admin key (auth.admin_key).")
    if session is None:
        raise PageError(403, "Sign in with the admin key to do this.")
    return session


SessionDep = Annotated[Session | None, Depends(current_session)]
AdminSessionDep = Annotated[Session, Depends(require_session)]


def check_csrf(dash: Dashboard, session: Session, token: str | None) -> None:
    if not dash.sessions.check_csrf(session, token):
        raise PageError(403, "The form's CSRF token is missing or wrong: reload the page and try again.")


async def alerts_and_cursor(services: ServicesDep, dash: Dashboard) -> tuple[list[FeedItem], str, bool]:
    """(active alerts, newest event id, whether the store answered)."""
    try:
        events = await asyncio.to_thread(recent_events, services.store.events, RECENT)
    except StoreError:
        return [], "0-0", False
    last = events[0].id if events else "0-0"
    return active_alerts(events, time.time(), dash.settings.alert_window_s), last, True


async def render(
    request: Request, name: str, *, services: ServicesDep, dash: Dashboard, session: Session | None,
    status: int = 200, **context: Any,
) -> HTMLResponse:  # fmt: skip
    alerts, last, store_ok = await alerts_and_cursor(services, dash)
    base = {
        "session": session,
        "csrf": dash.sessions.csrf(session) if session else "",
        "admin_enabled": dash.sessions.enabled,
        "alerts": alerts,
        "oom_alerts": [a for a in alerts if a.kind == "oom.alert"],
        "last_event_id": last,
        "store_ok": store_ok,
        "notice": request.query_params.get("notice", ""),
        "path": request.url.path,
        "alert_window_min": int(dash.settings.alert_window_s // 60),
    }
    return TEMPLATES.TemplateResponse(request, name, {**base, **context}, status_code=status)


def error_page(request: Request, status: int, message: str) -> HTMLResponse:
    """The error page without reading the store (it must answer when the store cannot)."""
    context = {"status": status, "message": message, "session": None, "csrf": "", "alerts": [], "oom_alerts": [],
               "last_event_id": "0-0", "store_ok": True, "notice": "", "path": request.url.path,
               "admin_enabled": True}  # fmt: skip
    return TEMPLATES.TemplateResponse(request, "error.html", context, status_code=status)
