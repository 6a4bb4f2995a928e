"""The event stream the dashboard reads: one Redis stream for every node.

Kinds and their fields (all values are strings; ``ts`` is unix seconds, ``node`` the writer):
    kv.stored      handle, fingerprint, tokens, bytes, tier
    kv.hit         handle, fingerprint, tokens (matched), tier
    kv.promoted    handle, tier (new), from
    kv.demoted     handle, tier (new), from
    kv.evicted     handle, tier, reason ("budget", "corrupt", "missing", "orphan")
    prefill.saved  fingerprint, tokens, and whatever the caller adds (e.g. ms)
    oom.alert      reason ("no_space", "high_water", "engine_pressure", "tier_unavailable"), tier, detail
Written by the gateway:
    transfer.fallback  stage ("prefix", "transfer", "engine"), reason (an error class), role, detail
    engine.failure     engine, role, reason ("timeout" or an error class), detail
    adapter.status     adapter, version, action, from, to, actor; an automatic promotion adds reason,
                       replaced, samples, answer_kl, baseline_kl, wins (``gateway/shadow.py``)
    adapter.drift      adapter, version, samples, first_token_kl, top1_agreement, threshold
    fit.failed         sender, receiver (engine names), method, attempts, error (its class and message)
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from typing import Any, NamedTuple

import redis

from store.connection import redis_errors
from store.errors import StoreUnavailable

log = logging.getLogger(__name__)

KINDS = (
    "kv.stored", "kv.hit", "kv.promoted", "kv.demoted", "kv.evicted", "prefill.saved", "oom.alert",
    "transfer.fallback", "engine.failure", "adapter.status", "adapter.drift", "fit.failed",
)  # fmt: skip
BACKLOG = 1000  # events kept in memory while Redis is down, written when it answers again


class Event(NamedTuple):
    id: str  # the stream entry id, the cursor for the next read
    kind: str
    fields: dict[str, str]


class EventLog:
    def __init__(self, client: redis.Redis, key: str, node: str, maxlen: int, ttl_s: int) -> None:
        self.client = client
        self.key = key
        self.node = node
        self.maxlen = maxlen
        self.ttl_s = ttl_s
        self._backlog: deque[dict[str, str]] = deque(maxlen=BACKLOG)  # oldest dropped first when full
        self._lock = threading.Lock()

    def entry(self, kind: str, now: float, **fields: object) -> dict[str, str]:
        """The stream entry for an event, for writers that add it inside their own transaction."""
        if kind not in KINDS:
            raise ValueError(f"unknown event kind {kind!r}")
        return {"kind": kind, "ts": repr(now), "node": self.node, **{k: str(v) for k, v in fields.items()}}

    def emit(self, kind: str, now: float, **fields: object) -> None:
        """Append an event, after any that ``emit_quietly`` kept while Redis was down. Raises
        ``StoreUnavailable`` when Redis is down."""
        entry = self.entry(kind, now, **fields)
        with self._lock:
            self._write([*self._backlog, entry])

    def flush(self) -> None:
        """Write the events kept while Redis was down, if any. Raises ``StoreUnavailable``."""
        with self._lock:
            if self._backlog:
                self._write(list(self._backlog))

    def _write(self, entries: list[dict[str, str]]) -> None:
        with redis_errors("event"), self.client.pipeline(transaction=True) as pipe:
            for e in entries:
                pipe.xadd(self.key, e, maxlen=self.maxlen, approximate=True)  # type: ignore[arg-type]
            pipe.expire(self.key, self.ttl_s)
            pipe.execute()
        self._backlog.clear()

    def emit_quietly(self, kind: str, now: float, **fields: object) -> None:
        """Append an event where failing to record it must not fail the operation: while Redis is
        down it is logged and kept in memory (the last ``BACKLOG``), and written with the next
        event once Redis answers again."""
        try:
            self.emit(kind, now, **fields)
        except StoreUnavailable as exc:
            log.warning("event %s kept until Redis answers (%s): %s", kind, exc, fields)
            with self._lock:
                self._backlog.append(self.entry(kind, now, **fields))

    def last_id(self) -> str:
        """The newest entry's id (``"0-0"`` for an empty stream): a cursor for the events after now.
        Raises ``StoreUnavailable`` when Redis is down."""
        rows: Any
        with redis_errors("read events"):
            rows = self.client.xrevrange(self.key, count=1)
        return str(rows[0][0].decode()) if rows else "0-0"

    def read(self, after: str = "0-0", count: int = 100, block_ms: int | None = None) -> list[Event]:
        """Events after stream id ``after``, oldest first; ``block_ms`` waits for new ones."""
        rows: Any
        with redis_errors("read events"):
            if block_ms is None:
                rows = self.client.xrange(self.key, min=f"({after}", count=count)
            else:
                streams: Any = self.client.xread({self.key: after}, count=count, block=block_ms)
                rows = streams[0][1] if streams else []
        out = []
        for entry_id, raw in rows:
            fields = {k.decode(): v.decode() for k, v in raw.items()}
            out.append(Event(entry_id.decode(), fields.pop("kind", ""), fields))
        return out
