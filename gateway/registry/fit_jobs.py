"""Fit job rows as keyword-only functions over a session: the table every replica reads and writes.

A job is ``queued`` or ``running`` (active) until it ends ``done``, ``failed`` or ``cancelled``. The
replica that runs a job touches its ``updated_at`` every few seconds; an active job whose row is
older than ``stale_before`` is *stale*: its replica is gone. Rows are locked while they change
(``SELECT ... FOR UPDATE`` on PostgreSQL; SQLite transactions begin IMMEDIATE, see ``db.py``), so a
cancel, a heartbeat and a bootstrap claim of one job never interleave.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import CursorResult, and_, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from gateway.errors import Conflict, NotFound
from gateway.registry.tables import FitJobRow, utcnow

ACTIVE = ("queued", "running")
RECLAIMABLE = ("failed", "cancelled")  # a bootstrap may run these again; never a done one


def aware(at: datetime) -> datetime:
    """SQLite hands back naive datetimes; every time in the registry is UTC."""
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


def is_stale(row: FitJobRow, stale_before: datetime) -> bool:
    return row.status in ACTIVE and aware(row.updated_at) < stale_before


def get(*, session: Session, job_id: str, lock: bool = False) -> FitJobRow:
    query = select(FitJobRow).where(FitJobRow.id == job_id)
    row = session.scalar(query.with_for_update() if lock else query)
    if row is None:
        raise NotFound(f"no fit job {job_id}")
    return row


def recent(*, session: Session, limit: int) -> Sequence[FitJobRow]:
    """The newest ``limit`` jobs of every replica, newest first."""
    query = select(FitJobRow).order_by(FitJobRow.created_at.desc(), FitJobRow.id).limit(limit)
    return session.scalars(query).all()


def claim(*, session: Session, row: FitJobRow, stale_before: datetime) -> bool:
    """Insert ``row``, or take over the job of the same id when it failed, was cancelled or went
    stale (reset to ``queued`` with ``row``'s values). False when the id belongs to a live or done
    job: another replica has it. Atomic across replicas: the insert meets the primary key, the
    take-over is one conditional UPDATE that at most one transaction matches."""
    try:
        with session.begin_nested():
            session.add(row)
    except IntegrityError:
        now = utcnow()
        fresh: dict[str, Any] = {
            "sender_name": row.sender_name, "receiver_name": row.receiver_name, "method": row.method,
            "replica": row.replica, "version": row.version, "docs": row.docs, "max_tokens": row.max_tokens,
            "activate": row.activate, "shadow": row.shadow, "status": "queued", "cancel_requested": False,
            "stage": "", "done": 0, "total": 0, "attempts": 0, "error": None, "adapter_id": None, "created_at": now,
            "updated_at": now,
        }  # fmt: skip
        stale = and_(FitJobRow.status.in_(ACTIVE), FitJobRow.updated_at < stale_before)
        taken = update(FitJobRow).where(FitJobRow.id == row.id, or_(FitJobRow.status.in_(RECLAIMABLE), stale))
        result = session.execute(taken.values(**fresh), execution_options={"synchronize_session": False})
        assert isinstance(result, CursorResult)
        return result.rowcount == 1
    return True


def cancel(*, session: Session, job_id: str, stale_before: datetime) -> FitJobRow:
    """Ask for the job to stop: ``cancel_requested``, which its replica reads within a few seconds.
    A queued job, or a stale one (no replica left to read the flag), is ``cancelled`` at once.
    Raises NotFound, or Conflict for a job that already ended."""
    row = get(session=session, job_id=job_id, lock=True)
    if row.status not in ACTIVE:
        raise Conflict(f"fit job {job_id} is already {row.status}")
    row.cancel_requested = True
    if is_stale(row, stale_before):
        row.status, row.error = "cancelled", f"its replica {row.replica} stopped updating it"
    elif row.status == "queued":
        row.status = "cancelled"
    session.flush()
    return row
