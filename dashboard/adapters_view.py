"""The adapters page's data: versions grouped by ordered pair, with their fidelity metrics from
fitting, shadow drift (the mean over the shadow window and the samples over time), and the actions
each status allows; and the drift of the active version per engine pair (the overview's routes)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from markupsafe import Markup
from sqlalchemy.orm import Session

from dashboard.charts import Series, line_chart
from gateway.engine_pool import EnginePool
from gateway.lifecycle import is_stale
from gateway.registry import versions
from gateway.registry.drift import shadow_history
from gateway.registry.tables import AdapterRow, AuditRow

SAMPLES_PER_VERSION = 200
ALLOWED = {
    "candidate": ("shadow", "promote", "retire"),
    "shadow": ("promote", "retire"),
    "active": ("rollback", "retire"),
    "retired": (),
}


@dataclass(frozen=True)
class Drift:
    """One version's shadow drift over the last ``window`` samples; the means are None without samples."""

    adapter_id: int
    version: str
    samples: int
    mean_kl: float | None
    mean_top1: float | None


@dataclass(frozen=True)
class VersionView:
    row: AdapterRow
    stale: bool
    fidelity: dict[str, str]  # scalar metrics from fitting, formatted
    samples: int
    mean_kl: float | None
    mean_top1: float | None
    actions: tuple[str, ...]
    paired: versions.Pairs | None = None  # a shadow version against the active one, on the same requests


@dataclass(frozen=True)
class PairView:
    key: str  # an HTML id
    sender: str
    receiver: str
    versions: list[VersionView]
    drift_chart: Markup


def fidelity(metrics: dict[str, Any]) -> dict[str, str]:
    """The scalar entries of a version's metrics (per-layer lists are left to the API)."""
    out = {}
    for name, value in sorted(metrics.items()):
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        out[name] = f"{value:.4g}"
    return out


def actions_for(row: AdapterRow, stale: bool) -> tuple[str, ...]:
    allowed = ALLOWED.get(row.status, ())
    return tuple(a for a in allowed if not (stale and a == "promote"))


def version_drift(*, session: Session, row: AdapterRow, window: int) -> Drift:
    n, kl, top1 = versions.drift(session=session, adapter_id=row.id, window=window)
    return Drift(row.id, row.version, n, kl if n else None, top1 if n else None)


def active_drift(*, session: Session, pool: EnginePool, window: int) -> dict[tuple[str, str], Drift]:
    """(sender engine, receiver engine) -> the drift of the active version for their fingerprints,
    for every ordered pair of ``pool``'s engines that has one."""
    rows = versions.serving(session=session, statuses=("active",))
    drift = {(r.sender_fingerprint, r.receiver_fingerprint): version_drift(session=session, row=r, window=window)
             for r in rows}  # fmt: skip
    out = {}
    for sender in pool:
        for receiver in pool:
            d = drift.get((sender.engine.spec.fingerprint, receiver.engine.spec.fingerprint))
            if d is not None:
                out[(sender.name, receiver.name)] = d
    return out


def pair_views(*, session: Session, pool: EnginePool, window: int, threshold: float) -> list[PairView]:
    rows = versions.list_adapters(session=session)
    history = shadow_history(session=session, adapter_ids=[r.id for r in rows], per_version=SAMPLES_PER_VERSION)
    by_version: dict[int, list[tuple[float, float]]] = {}
    for s in history:
        by_version.setdefault(s.adapter_id, []).append((s.at.timestamp(), s.first_token_kl))
    pairs: dict[tuple[str, str], list[AdapterRow]] = {}
    for r in rows:
        pairs.setdefault((r.sender_fingerprint, r.receiver_fingerprint), []).append(r)
    out = []
    for i, members in enumerate(pairs.values()):
        views = []
        active = next((r for r in members if r.status == "active"), None)
        for r in members:
            d = version_drift(session=session, row=r, window=window)
            stale = is_stale(r, pool)
            paired = (versions.pairs(session=session, adapter_id=r.id, baseline_id=active.id, window=window)
                      if active is not None and r.status == "shadow" else None)  # fmt: skip
            views.append(VersionView(r, stale, fidelity(r.metrics), d.samples, d.mean_kl, d.mean_top1,
                                     actions_for(r, stale), paired))  # fmt: skip
        series = [Series(f"{r.version} (id {r.id})", by_version.get(r.id, [])) for r in members]
        first = members[0]
        chart = line_chart(
            series, title=f"first-token KL vs native, {first.sender_name} -> {first.receiver_name}",
            fmt=lambda v: f"{v:.3g}", threshold=threshold, threshold_label="drift threshold",
            empty="no shadow samples yet",
        )  # fmt: skip
        out.append(PairView(f"pair-{i}", first.sender_name, first.receiver_name, views, chart))
    return out


def audit_rows(*, session: Session, limit: int) -> Sequence[AuditRow]:
    return versions.audit_log(session=session, limit=limit)
