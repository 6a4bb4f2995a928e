"""The request log, as keyword-only functions over a session: one row per answered chat request."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from gateway.registry.tables import RequestRow


def record_request(*, session: Session, **fields: Any) -> RequestRow:
    row = RequestRow(**fields)
    session.add(row)
    session.flush()
    return row


def recent_requests(*, session: Session, limit: int) -> Sequence[RequestRow]:
    """The newest ``limit`` rows, newest first."""
    return session.scalars(select(RequestRow).order_by(RequestRow.id.desc()).limit(limit)).all()


def prune_requests(*, session: Session, keep_after_id: int) -> None:
    """Drop rows up to and including ``keep_after_id`` (the log keeps a bounded tail)."""
    session.execute(delete(RequestRow).where(RequestRow.id <= keep_after_id))
