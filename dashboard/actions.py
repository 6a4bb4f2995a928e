"""The dashboard's admin actions: sign-in, and every change to adapter versions. Each change is a
confirmation page (GET, shows what will happen) and then a POST carrying the session's CSRF token;
all of it needs an admin session (403 otherwise). The upload form confirms with a required box.

GET  /dashboard/login                      POST /dashboard/login       (the admin key)
POST /dashboard/logout
GET  /dashboard/adapters/{id}/{action}     POST (same)                 shadow, promote, rollback, retire
GET  /dashboard/upload                     POST /dashboard/upload      manifest + weights
GET  /dashboard/fits/new -> GET /dashboard/fits/confirm -> POST /dashboard/fits -> /dashboard/fits/{id}
POST /dashboard/fits/{id}/cancel                                       the job page's Cancel button
"""

from __future__ import annotations

import asyncio
from typing import Annotated
from urllib.parse import quote

from fastapi import APIRouter, File, Form, Path, Query, Request, UploadFile
from fastapi.responses import HTMLResponse, RedirectResponse
from pydantic import BaseModel, Field

from dashboard.errors import PageError
from dashboard.sessions import COOKIE
from dashboard.web import AdminSessionDep, DashboardDep, SessionDep, check_csrf, render
from gateway.deps import ServicesDep
from gateway.errors import AuthError, GatewayError
from gateway.lifecycle import ACTIONS, change_status, in_session, register_upload
from gateway.registry import versions

router = APIRouter(prefix="/dashboard", tags=["dashboard"], include_in_schema=False)
ACTOR = "dashboard"
EXPLAIN = {
    "shadow": "evaluate it on a sampled share of live traffic, never serving it",
    "promote": "serve it for this pair; the pair's active version goes back to candidate",
    "rollback": "re-activate the version it replaced; this one goes back to candidate",
    "retire": "never serve or evaluate it again (it stays in the registry and the audit log)",
}
Csrf = Annotated[str, Form(max_length=200)]
AdapterId = Annotated[int, Path(ge=1, le=2**31 - 1)]  # SQL integer ids; a larger one would fail in the database


def _see(path: str, notice: str) -> RedirectResponse:
    return RedirectResponse(f"{path}?notice={quote(notice)}", status_code=303)


def _safe_next(target: str) -> str:
    return target if target.startswith("/dashboard") and not target.startswith("//") else "/dashboard"


@router.get("/login", response_class=HTMLResponse)
async def login_form(
    request: Request, services: ServicesDep, dash: DashboardDep, session: SessionDep,
    next: Annotated[str, Query(max_length=500)] = "/dashboard",
) -> HTMLResponse:  # fmt: skip
    return await render(request, "login.html", services=services, dash=dash, session=session, next=_safe_next(next),
                        error="")  # fmt: skip


@router.post("/login", response_model=None)
async def login(
    request: Request, services: ServicesDep, dash: DashboardDep, key: Annotated[str, Form(max_length=500)],
    next: Annotated[str, Form(max_length=500)] = "/dashboard",
) -> HTMLResponse | RedirectResponse:  # fmt: skip
    if not dash.sessions.enabled:
        raise PageError(403, "Admin actions are off: the gateway has no admin key (auth.admin_key).")
    try:
        services.keys.admin(f"Bearer {key}")
    except AuthError:
        return await render(request, "login.html", services=services, dash=dash, session=None, next=_safe_next(next),
                            error="That is not the admin key.", status=403)  # fmt: skip
    response = RedirectResponse(_safe_next(next), status_code=303)
    response.set_cookie(COOKIE, dash.sessions.issue(), max_age=dash.settings.session_ttl_s, path="/dashboard",
                        httponly=True, samesite="strict", secure=request.url.scheme == "https")  # fmt: skip
    return response


@router.post("/logout")
async def logout(dash: DashboardDep, session: AdminSessionDep, csrf: Csrf) -> RedirectResponse:
    check_csrf(dash, session, csrf)
    response = _see("/dashboard", "Signed out.")
    response.delete_cookie(COOKIE, path="/dashboard")
    return response


def _action(action: str) -> str:
    if action not in ACTIONS:
        raise PageError(404, f"no adapter action {action!r}; actions: {', '.join(ACTIONS)}")
    return action


@router.get("/adapters/{adapter_id}/{action}", response_class=HTMLResponse)
async def confirm_change(
    request: Request, adapter_id: AdapterId, action: str, services: ServicesDep, dash: DashboardDep,
    session: AdminSessionDep,
) -> HTMLResponse:  # fmt: skip
    try:
        row = await in_session(services.db, lambda s: versions.get_adapter(session=s, adapter_id=adapter_id))
    except GatewayError as exc:
        raise PageError(exc.status, str(exc)) from exc
    return await render(request, "confirm.html", services=services, dash=dash, session=session, row=row,
                        action=_action(action), explain=EXPLAIN[action])  # fmt: skip


@router.post("/adapters/{adapter_id}/{action}")
async def change(
    adapter_id: AdapterId, action: str, services: ServicesDep, dash: DashboardDep, session: AdminSessionDep, csrf: Csrf
) -> RedirectResponse:
    check_csrf(dash, session, csrf)
    try:
        row = await change_status(action=_action(action), adapter_id=adapter_id, actor=ACTOR, db=services.db,
                                  pool=services.pool, resolver=services.resolver, store=services.store)  # fmt: skip
    except GatewayError as exc:
        raise PageError(exc.status, str(exc)) from exc
    done = f"{action}: version {row.version} (id {row.id}) is now {row.status}."
    return _see("/dashboard/adapters", done)


@router.get("/upload", response_class=HTMLResponse)
async def upload_form(
    request: Request, services: ServicesDep, dash: DashboardDep, session: AdminSessionDep
) -> HTMLResponse:
    return await render(request, "upload.html", services=services, dash=dash, session=session)


@router.post("/upload")
async def upload(
    services: ServicesDep, dash: DashboardDep, session: AdminSessionDep, csrf: Csrf,
    manifest: Annotated[UploadFile, File()], weights: Annotated[UploadFile, File()],
    version: Annotated[str, Form(max_length=200)] = "", confirm: Annotated[str, Form(max_length=10)] = "",
) -> RedirectResponse:  # fmt: skip
    check_csrf(dash, session, csrf)
    if confirm != "yes":
        raise PageError(400, "Tick the confirmation box to register the artifact.")
    try:
        row = await register_upload(db=services.db, adapters_dir=services.settings.adapters_dir,
                                    manifest=manifest.file, weights=weights.file, version=version.strip() or None,
                                    actor=ACTOR)  # fmt: skip
    except GatewayError as exc:
        raise PageError(exc.status, str(exc)) from exc
    return _see("/dashboard/adapters", f"Registered version {row.version} (id {row.id}) as a candidate.")


class FitForm(BaseModel):
    sender: str = Field(min_length=1, max_length=200)
    receiver: str = Field(min_length=1, max_length=200)
    method: str = Field("kv-ridge", pattern="^(heterofold|kv-ridge|distilled)$")
    docs: int = Field(8, ge=2, le=64)
    max_tokens: int = Field(512, ge=64, le=4096)
    version: str = Field("", max_length=200)


class FitStart(FitForm):
    csrf: str = Field(max_length=200)


@router.get("/fits/new", response_class=HTMLResponse)
async def fit_form(
    request: Request, services: ServicesDep, dash: DashboardDep, session: AdminSessionDep
) -> HTMLResponse:
    engines = [p.name for p in services.pool]
    return await render(request, "fit_new.html", services=services, dash=dash, session=session, engines=engines)


@router.get("/fits/confirm", response_class=HTMLResponse)
async def fit_confirm(
    request: Request, form: Annotated[FitForm, Query()], services: ServicesDep, dash: DashboardDep,
    session: AdminSessionDep,
) -> HTMLResponse:  # fmt: skip
    engines = {p.name for p in services.pool}
    for name in (form.sender, form.receiver):
        if name not in engines:
            raise PageError(400, f"no engine {name!r}; engines: {', '.join(sorted(engines))}")
    if form.sender == form.receiver:
        raise PageError(400, "sender and receiver must be different engines")
    return await render(request, "fit_confirm.html", services=services, dash=dash, session=session, form=form)


@router.post("/fits")
async def fit_start(
    services: ServicesDep, dash: DashboardDep, session: AdminSessionDep, form: Annotated[FitStart, Form()]
) -> RedirectResponse:
    check_csrf(dash, session, form.csrf)
    try:
        job = services.jobs.start(sender=form.sender, receiver=form.receiver, method=form.method, docs=form.docs,
                                  max_tokens=form.max_tokens, version=form.version.strip() or None)  # fmt: skip
    except GatewayError as exc:
        raise PageError(exc.status, str(exc)) from exc
    return RedirectResponse(f"/dashboard/fits/{job.id}", status_code=303)


@router.post("/fits/{job_id}/cancel")
async def fit_cancel(
    job_id: str, services: ServicesDep, dash: DashboardDep, session: AdminSessionDep, csrf: Csrf
) -> RedirectResponse:
    check_csrf(dash, session, csrf)
    try:
        job = await asyncio.to_thread(services.jobs.cancel, job_id)
    except GatewayError as exc:
        raise PageError(exc.status, str(exc)) from exc
    if job.status == "cancelled":  # queued, or stale: nothing runs it
        done = f"Cancelled: {job.error}." if job.error else "Cancelled before it started."
    else:
        done = f"Cancel requested: replica {job.replica} stops the fit at its next progress step."
    return _see(f"/dashboard/fits/{quote(job_id)}", done)
