"""Shadow samples over time, per adapter version (the dashboard's drift chart)."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from gateway.registry.tables import ShadowSampleRow


def shadow_history(*, session: Session, adapter_ids: Sequence[int], per_version: int) -> list[ShadowSampleRow]:
    """The last ``per_version`` samples of each version in ``adapter_ids``, oldest first."""
    out: list[ShadowSampleRow] = []
    for adapter_id in adapter_ids:
        query = (
            select(ShadowSampleRow)
            .where(ShadowSampleRow.adapter_id == adapter_id)
            .order_by(ShadowSampleRow.id.desc())
            .limit(per_version)
        )
        out.extend(reversed(session.scalars(query).all()))
    return out
