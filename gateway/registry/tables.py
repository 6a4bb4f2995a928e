"""Storage shapes of the registry. Alembic revisions create these tables; this module only maps them.

An adapter version belongs to one ordered pair (sender fingerprint, receiver fingerprint) and has a
status: ``candidate`` (fitted or uploaded), ``shadow`` (evaluated on live traffic, never served),
``active`` (served; at most one per pair, enforced by a partial unique index) or ``retired``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, ClassVar, Literal

from sqlalchemy import JSON, Boolean, DateTime, Float, ForeignKey, Index, Integer, String, Text, text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

Status = Literal["candidate", "shadow", "active", "retired"]
STATUSES: tuple[Status, ...] = ("candidate", "shadow", "active", "retired")


def utcnow() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    type_annotation_map: ClassVar[dict[Any, Any]] = {dict[str, Any]: JSON, datetime: DateTime(timezone=True)}


class ModelRow(Base):
    __tablename__ = "models"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    family: Mapped[str] = mapped_column(String(50))
    fingerprint: Mapped[str] = mapped_column(String(64), unique=True)
    registered_at: Mapped[datetime] = mapped_column(default=utcnow)


class AdapterRow(Base):
    __tablename__ = "adapter_versions"
    __table_args__ = (
        Index("uq_adapter_versions_pair_version", "sender_fingerprint", "receiver_fingerprint", "version", unique=True),
        Index(
            "uq_adapter_versions_one_active",
            "sender_fingerprint",
            "receiver_fingerprint",
            unique=True,
            sqlite_where=text("status = 'active'"),
            postgresql_where=text("status = 'active'"),
        ),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    sender_name: Mapped[str] = mapped_column(String(200))
    receiver_name: Mapped[str] = mapped_column(String(200))
    sender_fingerprint: Mapped[str] = mapped_column(String(64))
    receiver_fingerprint: Mapped[str] = mapped_column(String(64))
    version: Mapped[str] = mapped_column(String(200))
    method: Mapped[str] = mapped_column(String(50))
    status: Mapped[str] = mapped_column(String(20), default="candidate")
    artifact_path: Mapped[str] = mapped_column(Text)
    sha256: Mapped[str] = mapped_column(String(64))
    metrics: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)
    promoted_at: Mapped[datetime | None] = mapped_column(default=None)


class AuditRow(Base):
    __tablename__ = "audit_log"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    adapter_id: Mapped[int] = mapped_column(ForeignKey("adapter_versions.id"))
    action: Mapped[str] = mapped_column(String(30))  # register, shadow, promote, demote, rollback, retire
    from_status: Mapped[str | None] = mapped_column(String(20))
    to_status: Mapped[str] = mapped_column(String(20))
    actor: Mapped[str] = mapped_column(String(50))  # admin, auto (drift), bootstrap
    detail: Mapped[dict[str, Any]] = mapped_column(default=dict)
    at: Mapped[datetime] = mapped_column(default=utcnow)


class FitJobRow(Base):
    """One fit job, the source of truth for every replica (``gateway/jobs.py``). The replica that
    runs it writes its progress and touches ``updated_at`` every few seconds while it is queued or
    running; any replica may set ``cancel_requested``."""

    __tablename__ = "fit_jobs"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    sender_name: Mapped[str] = mapped_column(String(200))
    receiver_name: Mapped[str] = mapped_column(String(200))
    method: Mapped[str] = mapped_column(String(50))
    replica: Mapped[str] = mapped_column(String(200), default="")  # host:pid of the gateway that runs it
    version: Mapped[str] = mapped_column(String(200), default="")
    docs: Mapped[int] = mapped_column(Integer, default=0)
    max_tokens: Mapped[int] = mapped_column(Integer, default=0)
    activate: Mapped[bool] = mapped_column(Boolean, default=False)
    shadow: Mapped[bool] = mapped_column(Boolean, default=False)  # the version goes to shadow (migration 0009)
    status: Mapped[str] = mapped_column(String(20), default="queued")  # queued, running, done, failed, cancelled
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    stage: Mapped[str] = mapped_column(String(50), default="")
    done: Mapped[int] = mapped_column(Integer, default=0)
    total: Mapped[int] = mapped_column(Integer, default=0)
    attempts: Mapped[int] = mapped_column(Integer, default=0)  # fits started, retries included
    error: Mapped[str | None] = mapped_column(Text, default=None)
    adapter_id: Mapped[int | None] = mapped_column(ForeignKey("adapter_versions.id"), default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)  # the runner's heartbeat


class ShadowSampleRow(Base):
    __tablename__ = "shadow_samples"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    adapter_id: Mapped[int] = mapped_column(ForeignKey("adapter_versions.id"), index=True)
    first_token_kl: Mapped[float] = mapped_column(Float)
    top1_agreement: Mapped[float] = mapped_column(Float)
    at: Mapped[datetime] = mapped_column(default=utcnow)
    # paired (migration 0009): mean per-token KL over the answer, and that of the version that served
    # the same request on the same path (``baseline_id``); none for an unpaired sample
    answer_kl: Mapped[float | None] = mapped_column(Float, nullable=True, default=None)
    baseline_id: Mapped[int | None] = mapped_column(Integer, nullable=True, default=None)
    baseline_kl: Mapped[float | None] = mapped_column(Float, nullable=True, default=None)


class RequestRow(Base):
    """One answered chat request: the route it took and what it cost (the dashboard's per-route view)."""

    __tablename__ = "request_log"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    at: Mapped[datetime] = mapped_column(default=utcnow, index=True)
    role: Mapped[str] = mapped_column(String(200))
    sender: Mapped[str | None] = mapped_column(String(200), default=None)  # engine of the turn before, if known
    receiver: Mapped[str] = mapped_column(String(200))  # the role's engine
    path: Mapped[str] = mapped_column(String(20))  # native, prefix, transfer
    prompt_tokens: Mapped[int] = mapped_column(Integer)
    cached_tokens: Mapped[int] = mapped_column(Integer)
    transferred_tokens: Mapped[int] = mapped_column(Integer)
    ttft_ms: Mapped[float] = mapped_column(Float)
    transfer_ms: Mapped[float] = mapped_column(Float)
    prefill_ms_saved: Mapped[float] = mapped_column(Float)
    adapter_version: Mapped[str | None] = mapped_column(String(200), default=None)
