"""The admin API, behind the admin key: adapter versions and their lifecycle, fit jobs, audit.

GET  /admin/models                      models with fingerprints (current: loaded now)
GET  /admin/adapters                    every version, with ``stale`` (fitted for other weights)
POST /admin/adapters                    upload an artifact (multipart: manifest, weights)
POST /admin/adapters/{id}/shadow        evaluate on live traffic without serving
POST /admin/adapters/{id}/promote       serve it; the pair's active version is demoted atomically
POST /admin/adapters/{id}/rollback      re-activate the version it replaced
POST /admin/adapters/{id}/retire
GET  /admin/audit                       promotions, rollbacks, retirements
POST /admin/fits                        start a fit job: 202 with the job id
GET  /admin/fits                        the newest fit jobs of every replica (``?limit=``)
GET  /admin/fits/{job_id}               its progress, whichever replica runs it
POST /admin/fits/{job_id}/cancel        stop it (409 once it ended)
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, File, Form, Query, UploadFile
from fastapi import Path as PathParam
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from gateway.deps import AdminDep, DbDep, JobsDep, PoolDep, ResolverDep, SettingsDep, StoreDep
from gateway.engine_pool import EnginePool
from gateway.lifecycle import ACTIONS, change_status, in_session, is_stale, register_upload
from gateway.registry import versions
from gateway.registry.tables import AdapterRow

router = APIRouter(prefix="/admin", tags=["admin"], dependencies=[AdminDep])


class AdapterOut(BaseModel):
    id: int
    sender: str
    receiver: str
    sender_fingerprint: str
    receiver_fingerprint: str
    version: str
    method: str
    status: str
    stale: bool
    artifact_path: str
    sha256: str
    metrics: dict[str, Any]
    created_at: str
    updated_at: str
    promoted_at: str | None


class FitIn(BaseModel):
    sender: str  # engine names from the config
    receiver: str
    method: str = "kv-ridge"  # the bootstrap's first fit
    docs: int = Field(8, ge=2, le=64)
    max_tokens: int = Field(512, ge=64, le=4096)
    version: str | None = Field(None, min_length=1, max_length=200)


def _out(row: AdapterRow, pool: EnginePool) -> AdapterOut:
    return AdapterOut(
        id=row.id, sender=row.sender_name, receiver=row.receiver_name, sender_fingerprint=row.sender_fingerprint,
        receiver_fingerprint=row.receiver_fingerprint, version=row.version, method=row.method, status=row.status,
        stale=is_stale(row, pool), artifact_path=row.artifact_path, sha256=row.sha256, metrics=row.metrics,
        created_at=row.created_at.isoformat(),
        updated_at=row.updated_at.isoformat(), promoted_at=row.promoted_at.isoformat() if row.promoted_at else None,
    )  # fmt: skip


@router.get("/models")
async def models(db: DbDep, pool: PoolDep) -> list[dict[str, Any]]:
    rows = await in_session(db, lambda s: versions.list_models(session=s))
    current = pool.fingerprints
    return [{"name": r.name, "family": r.family, "fingerprint": r.fingerprint, "current": r.fingerprint in current}
            for r in rows]  # fmt: skip


@router.get("/adapters")
async def list_adapters(db: DbDep, pool: PoolDep) -> list[AdapterOut]:
    rows = await in_session(db, lambda s: versions.list_adapters(session=s))
    return [_out(r, pool) for r in rows]


@router.post("/adapters", status_code=201)
async def upload(
    db: DbDep, pool: PoolDep, settings: SettingsDep, manifest: Annotated[UploadFile, File()],
    weights: Annotated[UploadFile, File()], version: Annotated[str | None, Form(max_length=200)] = None,
) -> AdapterOut:  # fmt: skip
    row = await register_upload(db=db, adapters_dir=settings.adapters_dir, manifest=manifest.file,
                                weights=weights.file, version=version, actor="admin")  # fmt: skip
    return _out(row, pool)


AdapterId = Annotated[int, PathParam(ge=1, le=versions.ROW_ID_MAX)]


def _change(action: str) -> Callable[[int, DbDep, PoolDep, ResolverDep, StoreDep], Any]:
    async def handler(
        adapter_id: AdapterId, db: DbDep, pool: PoolDep, resolver: ResolverDep, store: StoreDep
    ) -> AdapterOut:
        row = await change_status(action=action, adapter_id=adapter_id, actor="admin", db=db, pool=pool,
                                  resolver=resolver, store=store)  # fmt: skip
        return _out(row, pool)

    return handler


for _action in ACTIONS:
    router.add_api_route(f"/adapters/{{adapter_id}}/{_action}", _change(_action), methods=["POST"])


@router.get("/audit")
async def audit(
    db: DbDep, adapter_id: Annotated[int | None, Query(ge=1, le=versions.ROW_ID_MAX)] = None
) -> list[dict[str, Any]]:
    rows = await in_session(db, lambda s: versions.audit_log(session=s, adapter_id=adapter_id))
    return [
        {"id": r.id, "adapter_id": r.adapter_id, "action": r.action, "from": r.from_status, "to": r.to_status,
         "actor": r.actor, "detail": r.detail, "at": r.at.isoformat()}
        for r in rows
    ]  # fmt: skip


@router.post("/fits", status_code=202)
async def start_fit(body: FitIn, jobs: JobsDep) -> JSONResponse:
    job = jobs.start(sender=body.sender, receiver=body.receiver, method=body.method, docs=body.docs,
                     max_tokens=body.max_tokens, version=body.version)  # fmt: skip
    return JSONResponse(job.view(), status_code=202, headers={"Location": f"/admin/fits/{job.id}"})


@router.get("/fits")
async def list_fits(jobs: JobsDep, limit: Annotated[int, Query(ge=1, le=500)] = 50) -> list[dict[str, Any]]:
    return [job.view() for job in await asyncio.to_thread(jobs.list, limit=limit)]


@router.get("/fits/{job_id}")
async def fit_progress(job_id: str, jobs: JobsDep) -> dict[str, Any]:
    return (await asyncio.to_thread(jobs.get, job_id)).view()


@router.post("/fits/{job_id}/cancel")
async def cancel_fit(job_id: str, jobs: JobsDep) -> dict[str, Any]:
    return (await asyncio.to_thread(jobs.cancel, job_id)).view()
