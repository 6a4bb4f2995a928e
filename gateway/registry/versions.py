"""Adapter versions and their lifecycle, as keyword-only functions over a session.

Every status change writes an audit row in the same transaction. ``promote`` demotes the pair's
active version to ``candidate`` and activates the new one in one transaction, with the pair's rows
locked (``SELECT ... FOR UPDATE`` on PostgreSQL; SQLite transactions begin IMMEDIATE, see
``db.py``); the partial unique index keeps it to one active version per pair whatever happens.
``rollback`` re-activates the version the current one replaced.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gateway.errors import Conflict, NotFound
from gateway.registry.tables import AdapterRow, AuditRow, ModelRow, ShadowSampleRow, Status, utcnow


def upsert_model(*, session: Session, name: str, family: str, fingerprint: str) -> ModelRow:
    row = session.scalar(select(ModelRow).where(ModelRow.fingerprint == fingerprint))
    if row is None:
        row = ModelRow(name=name, family=family, fingerprint=fingerprint)
        session.add(row)
        session.flush()
    return row


def list_models(*, session: Session) -> Sequence[ModelRow]:
    return session.scalars(select(ModelRow).order_by(ModelRow.id)).all()


def create_adapter(
    *,
    session: Session,
    sender_name: str,
    receiver_name: str,
    sender_fingerprint: str,
    receiver_fingerprint: str,
    version: str,
    method: str,
    artifact_path: str,
    sha256: str,
    metrics: dict[str, Any],
    actor: str,
) -> AdapterRow:
    taken = session.scalar(
        select(AdapterRow.id).where(
            AdapterRow.sender_fingerprint == sender_fingerprint,
            AdapterRow.receiver_fingerprint == receiver_fingerprint,
            AdapterRow.version == version,
        )
    )
    if taken is not None:
        raise Conflict(f"version {version!r} already exists for {sender_name} -> {receiver_name}", param="version")
    row = AdapterRow(
        sender_name=sender_name, receiver_name=receiver_name, sender_fingerprint=sender_fingerprint,
        receiver_fingerprint=receiver_fingerprint, version=version, method=method, status="candidate",
        artifact_path=artifact_path, sha256=sha256, metrics=metrics,
    )  # fmt: skip
    session.add(row)
    session.flush()
    _audit(session, row, "register", None, actor)
    return row


ROW_ID_MAX = 2**31 - 1  # integer ids


def list_adapters(*, session: Session) -> Sequence[AdapterRow]:
    return session.scalars(select(AdapterRow).order_by(AdapterRow.id)).all()


def get_adapter(*, session: Session, adapter_id: int, lock: bool = False) -> AdapterRow:
    if not 1 <= adapter_id <= ROW_ID_MAX:  # SQL would fail on it (SQLite: overflow; PostgreSQL: out of range)
        raise NotFound(f"no adapter version {adapter_id}")
    query = select(AdapterRow).where(AdapterRow.id == adapter_id)
    row = session.scalar(query.with_for_update() if lock else query)
    if row is None:
        raise NotFound(f"no adapter version {adapter_id}")
    return row


def serving(*, session: Session, statuses: tuple[Status, ...] = ("active", "shadow")) -> Sequence[AdapterRow]:
    """Versions the hot path may use: active ones (served) and shadow ones (evaluated only)."""
    return session.scalars(select(AdapterRow).where(AdapterRow.status.in_(statuses))).all()


def audit_log(*, session: Session, adapter_id: int | None = None, limit: int = 200) -> Sequence[AuditRow]:
    query = select(AuditRow).order_by(AuditRow.id.desc()).limit(limit)
    if adapter_id is not None:
        query = query.where(AuditRow.adapter_id == adapter_id)
    return session.scalars(query).all()


def _pair_rows(session: Session, row: AdapterRow) -> list[AdapterRow]:
    """Every version of ``row``'s pair, locked until the transaction ends."""
    query = select(AdapterRow).where(
        AdapterRow.sender_fingerprint == row.sender_fingerprint,
        AdapterRow.receiver_fingerprint == row.receiver_fingerprint,
    )
    return list(session.scalars(query.order_by(AdapterRow.id).with_for_update()).all())


def _audit(session: Session, row: AdapterRow, action: str, before: str | None, actor: str, **detail: Any) -> None:
    session.add(AuditRow(adapter_id=row.id, action=action, from_status=before, to_status=row.status, actor=actor,
                         detail=detail))  # fmt: skip


def _set(session: Session, row: AdapterRow, status: Status, action: str, actor: str, **detail: Any) -> None:
    before = row.status
    row.status = status
    if status == "active":
        row.promoted_at = utcnow()
    session.flush()  # one statement at a time, so the one-active index never sees two
    _audit(session, row, action, before, actor, **detail)


def set_shadow(*, session: Session, adapter_id: int, actor: str) -> AdapterRow:
    row = get_adapter(session=session, adapter_id=adapter_id, lock=True)
    if row.status not in ("candidate", "shadow"):
        raise Conflict(f"adapter {adapter_id} is {row.status}; only a candidate can go to shadow")
    if row.status == "candidate":
        _set(session, row, "shadow", "shadow", actor)
    return row


def promote(*, session: Session, adapter_id: int, actor: str, reason: str = "") -> AdapterRow:
    row = get_adapter(session=session, adapter_id=adapter_id)
    pair = _pair_rows(session, row)
    row = next(r for r in pair if r.id == adapter_id)
    if row.status == "active":
        return row
    if row.status == "retired":
        raise Conflict(f"adapter {adapter_id} is retired; register it again to serve it")
    previous = next((r for r in pair if r.status == "active"), None)
    if previous is not None:
        _set(session, previous, "candidate", "demote", actor, replaced_by=row.id)
    detail = {"reason": reason} if reason else {}
    _set(session, row, "active", "promote", actor, previous=previous.id if previous else None, **detail)
    return row


def _replaced(session: Session, row: AdapterRow) -> int | None:
    """The version ``row`` replaced when it was last promoted."""
    promoted = session.scalar(
        select(AuditRow).where(AuditRow.adapter_id == row.id, AuditRow.action == "promote").order_by(AuditRow.id.desc())
    )
    previous = (promoted.detail or {}).get("previous") if promoted else None
    return int(previous) if previous is not None else None


def rollback(*, session: Session, adapter_id: int, actor: str, reason: str = "") -> AdapterRow:
    """Re-activate the version ``adapter_id`` (the active one) replaced; returns it. Rollbacks
    walk back a stack: the restored version takes over what *it* had replaced, so v1 -> v2 -> v3
    rolls back to v2, then to v1."""
    row = get_adapter(session=session, adapter_id=adapter_id)
    pair = {r.id: r for r in _pair_rows(session, row)}
    row = pair[adapter_id]
    if row.status != "active":
        raise Conflict(f"adapter {adapter_id} is {row.status}; only the active version can be rolled back")
    replaced = _replaced(session, row)
    previous = pair.get(replaced) if replaced is not None else None
    if previous is None or previous.status == "retired":
        raise Conflict(f"adapter {adapter_id} replaced no version that can serve again")
    _set(session, row, "candidate", "rollback", actor, restored=previous.id, reason=reason)
    _set(session, previous, "active", "promote", actor, previous=_replaced(session, previous), rollback=row.id)
    return previous


def retire(*, session: Session, adapter_id: int, actor: str) -> AdapterRow:
    row = get_adapter(session=session, adapter_id=adapter_id)
    _pair_rows(session, row)
    if row.status != "retired":
        _set(session, row, "retired", "retire", actor)
    return row


def record_shadow(
    *, session: Session, adapter_id: int, kl: float, top1: float, answer_kl: float | None = None,
    baseline_id: int | None = None, baseline_kl: float | None = None,
) -> None:  # fmt: skip
    session.add(ShadowSampleRow(adapter_id=adapter_id, first_token_kl=kl, top1_agreement=top1, answer_kl=answer_kl,
                                baseline_id=baseline_id, baseline_kl=baseline_kl))  # fmt: skip


@dataclass(frozen=True)
class Pairs:
    """A shadow version against the version that served beside it, over the same requests."""

    samples: int
    kl: float  # mean per-token answer KL of the shadow version
    baseline_kl: float  # of the serving version, on the same requests and path
    wins: int  # requests where the shadow version's KL was the lower

    def view(self) -> dict[str, float | int]:
        return {"samples": self.samples, "answer_kl": round(self.kl, 4), "baseline_kl": round(self.baseline_kl, 4),
                "wins": self.wins}  # fmt: skip


def pairs(*, session: Session, adapter_id: int, baseline_id: int, window: int) -> Pairs:
    """The last ``window`` samples of ``adapter_id`` paired with ``baseline_id``."""
    recent = (
        select(ShadowSampleRow.answer_kl, ShadowSampleRow.baseline_kl)
        .where(ShadowSampleRow.adapter_id == adapter_id, ShadowSampleRow.baseline_id == baseline_id,
               ShadowSampleRow.answer_kl.is_not(None), ShadowSampleRow.baseline_kl.is_not(None))
        .order_by(ShadowSampleRow.id.desc())
        .limit(window)
    )  # fmt: skip
    rows = [(float(a or 0.0), float(b or 0.0)) for a, b in session.execute(recent).all()]  # neither is NULL here
    if not rows:
        return Pairs(0, 0.0, 0.0, 0)
    n = len(rows)
    return Pairs(n, sum(a for a, _ in rows) / n, sum(b for _, b in rows) / n, sum(a < b for a, b in rows))


def drift(*, session: Session, adapter_id: int, window: int) -> tuple[int, float, float]:
    """(samples, mean first-token KL, mean top-1 agreement) over the last ``window`` samples."""
    recent = (
        select(ShadowSampleRow.first_token_kl, ShadowSampleRow.top1_agreement)
        .where(ShadowSampleRow.adapter_id == adapter_id)
        .order_by(ShadowSampleRow.id.desc())
        .limit(window)
        .subquery()
    )
    n, kl, top1 = session.execute(
        select(func.count(), func.avg(recent.c.first_token_kl), func.avg(recent.c.top1_agreement))
    ).one()
    return int(n), float(kl or 0.0), float(top1 or 0.0)
