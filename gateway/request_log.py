"""The request log: after each answered chat request (off the hot path), one row in the registry
with the route it took (role, sender engine, receiver engine), its path, TTFT and the prefill it
saved. The dashboard's per-route view reads it. The log keeps the newest ``keep`` rows; failing to
write one is logged, never raised into a request."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import asdict, dataclass

from gateway.errors import RegistryError
from gateway.registry import requests as repo
from gateway.registry.db import Database

log = logging.getLogger(__name__)
PRUNE_EVERY = 500  # rows between two prunes


@dataclass(frozen=True)
class RequestRecord:
    role: str
    sender: str | None  # the engine of the conversation's previous turn, when the hop planner read it
    receiver: str
    path: str
    prompt_tokens: int
    cached_tokens: int
    transferred_tokens: int
    ttft_ms: float
    transfer_ms: float
    prefill_ms_saved: float
    adapter_version: str | None


FIELDS = tuple(RequestRecord.__dataclass_fields__)


class RequestLog:
    def __init__(self, db: Database, *, keep: int = 50_000, prune_every: int = PRUNE_EVERY) -> None:
        if keep < 1 or prune_every < 1:
            raise ValueError("keep and prune_every must be positive")
        self.db = db
        self.keep = keep
        self.prune_every = prune_every

    async def record(self, record: RequestRecord) -> None:
        try:
            await asyncio.to_thread(self._write, record)
        except RegistryError as exc:
            log.warning("request not logged: %s", exc)

    def _write(self, record: RequestRecord) -> None:
        with self.db.session() as session:
            row = repo.record_request(session=session, **asdict(record))
            if row.id % self.prune_every == 0 and row.id > self.keep:
                repo.prune_requests(session=session, keep_after_id=row.id - self.keep)

    def recent(self, limit: int) -> list[RequestRecord]:
        """The newest ``limit`` records, newest first (blocking: call it off the event loop)."""
        with self.db.session() as session:
            rows = repo.recent_requests(session=session, limit=limit)
            return [RequestRecord(**{f: getattr(r, f) for f in FIELDS}) for r in rows]
