"""Mounting the dashboard on the gateway's app: its routers, its static files, and the error page."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

from dashboard import actions, pages
from dashboard.errors import PageError
from dashboard.web import HERE, error_page


def install(app: FastAPI) -> None:
    """Serve the dashboard under ``/dashboard``. The lifespan must set ``app.state.dashboard``
    (``Dashboard.start``); until it does, the pages answer 404."""

    async def handle(request: Request, exc: Exception) -> HTMLResponse:
        status = exc.status if isinstance(exc, PageError) else 500
        return error_page(request, status, str(exc))

    app.add_exception_handler(PageError, handle)
    app.include_router(actions.router)  # before pages: /fits/new must not be read as a job id
    app.include_router(pages.router)
    app.mount("/dashboard/static", StaticFiles(directory=HERE / "static"), name="dashboard-static")
