"""Adapter version changes shared by the admin API and the dashboard: register an uploaded
artifact, and move a version through shadow, promote, rollback and retire. Each change checks what
the registry cannot (a stale version never serves), refreshes the resolver's snapshot at once, and
writes an ``adapter.status`` event."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO, TypeVar

from sqlalchemy.orm import Session

from gateway.artifacts import take_upload
from gateway.engine_pool import EnginePool
from gateway.errors import Conflict, NotFound
from gateway.registry import versions
from gateway.registry.db import Database
from gateway.registry.tables import AdapterRow
from gateway.resolver import AdapterResolver
from store.kv_store import KVStore

T = TypeVar("T")
UPLOAD_LIMIT = 1 << 30
ACTIONS: dict[str, Callable[..., AdapterRow]] = {
    "shadow": versions.set_shadow,
    "promote": versions.promote,
    "rollback": versions.rollback,
    "retire": versions.retire,
}


async def in_session(db: Database, fn: Callable[[Session], T]) -> T:
    """``fn`` in one registry transaction, on a worker thread."""

    def work() -> T:
        with db.session() as session:
            return fn(session)

    return await asyncio.to_thread(work)


def is_stale(row: AdapterRow, pool: EnginePool) -> bool:
    """Fitted for weights the engines no longer run."""
    return not {row.sender_fingerprint, row.receiver_fingerprint} <= pool.fingerprints


async def change_status(
    *, action: str, adapter_id: int, actor: str, db: Database, pool: EnginePool, resolver: AdapterResolver,
    store: KVStore,
) -> AdapterRow:  # fmt: skip
    """Apply ``action`` (one of ``ACTIONS``) to a version; returns the row the action reports (for a
    rollback, the version restored). Raises NotFound, or Conflict for a change the state forbids."""
    if action not in ACTIONS:
        raise NotFound(f"no adapter action {action!r}; actions: {', '.join(ACTIONS)}")
    change = ACTIONS[action]
    before = await in_session(db, lambda s: versions.get_adapter(session=s, adapter_id=adapter_id))
    if action == "promote" and is_stale(before, pool):
        raise Conflict(f"adapter {adapter_id} is stale: fitted for models the engines no longer run")
    row = await in_session(db, lambda s: change(session=s, adapter_id=adapter_id, actor=actor))
    resolver.invalidate()
    fields = {"adapter": row.id, "version": row.version, "action": action, "from": before.status, "to": row.status,
              "actor": actor}  # fmt: skip
    await asyncio.to_thread(store.events.emit_quietly, "adapter.status", time.time(), **fields)
    return row


async def register_upload(
    *, db: Database, adapters_dir: Path, manifest: BinaryIO, weights: BinaryIO, version: str | None, actor: str
) -> AdapterRow:
    """Verify an uploaded artifact, move it into place and register it as a ``candidate``."""
    adapter, folder, sha = await asyncio.to_thread(take_upload, adapters_dir, manifest, weights, UPLOAD_LIMIT)
    m = adapter.manifest
    return await in_session(db, lambda s: versions.create_adapter(
        session=s, sender_name=m.sender.name, receiver_name=m.receiver.name, sender_fingerprint=m.sender.fingerprint,
        receiver_fingerprint=m.receiver.fingerprint, version=version or m.version, method=m.method,
        artifact_path=str(folder), sha256=sha, metrics=m.metrics, actor=actor,
    ))  # fmt: skip
