"""The live feed: store events described for people, and the Server-Sent Events stream of them.

Every event of the store's stream (``store/events.py`` lists the kinds) becomes a ``FeedItem``;
``prefill.saved`` with ``path=transfer`` is how a cross-model transfer shows up. Alerts
(``oom.alert``, ``adapter.drift``, ``engine.failure``, ``fit.failed``) have severity ``alert``; the
page shows a banner for OOM alerts.

The stream polls Redis (XRANGE after the last id sent, every ``poll_s``) instead of blocking in
XREAD: a blocked read would hold one of the event loop's few worker threads per open page. It
ends after ``stream_s`` so that a server can stop; the browser's EventSource reconnects with
``Last-Event-ID`` and misses nothing the stream still holds.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from store.connection import redis_errors
from store.errors import StoreError
from store.events import Event, EventLog

ALERT_KINDS = ("oom.alert", "adapter.drift", "engine.failure", "fit.failed")
KEEPALIVE_S = 10.0


@dataclass(frozen=True)
class FeedItem:
    id: str
    kind: str
    ts: float
    severity: str  # info, warn, alert
    title: str
    text: str

    def sse(self) -> bytes:
        data = json.dumps(asdict(self), separators=(",", ":"))
        return f"id: {self.id}\nevent: hf\ndata: {data}\n\n".encode()


def _bytes(value: str) -> str:
    try:
        n = float(value)
    except ValueError:
        return value
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return value


def describe(event: Event) -> FeedItem:
    f = event.fields
    g = f.get
    kind = event.kind
    severity, title, text = "info", kind, " ".join(f"{k}={v}" for k, v in f.items() if k not in ("ts", "node"))
    if kind == "prefill.saved":
        path = g("path", "")
        title = "transfer" if path == "transfer" else "prefix reuse" if path == "prefix" else "prefill saved"
        text = f"{g('role', '?')}: {g('tokens', '?')} prompt tokens not prefilled, {g('ms', '?')} ms saved"
    elif kind == "kv.stored":
        title, text = "KV stored", f"{g('tokens', '?')} tokens, {_bytes(g('bytes', '?'))} on {g('tier', '?')}"
    elif kind == "kv.hit":
        title, text = "KV hit", f"{g('tokens', '?')} tokens from {g('tier', '?')}"
    elif kind in ("kv.promoted", "kv.demoted"):
        title, text = f"KV {kind.split('.')[1]}", f"{g('from', '?')} -> {g('tier', '?')}"
    elif kind == "kv.evicted":
        severity, title = "warn", "eviction"
        text = f"from {g('tier', '?')} ({g('reason', '?')})"
    elif kind == "oom.alert":
        severity, title = "alert", "OOM alert"
        text = f"{g('reason', '?')} on {g('tier', '?')}: {g('detail', '')}"
    elif kind == "transfer.fallback":
        severity, title = "warn", "fallback to native prefill"
        text = f"{g('role', '?')} at {g('stage', '?')}: {g('reason', '?')}"
    elif kind == "engine.failure":
        severity, title = "alert", "engine failure"
        text = f"{g('engine', '?')} ({g('role', '?')}): {g('reason', '?')}"
    elif kind == "adapter.status":
        action = g("action", "")
        if action == "rollback":
            severity, title = "warn", "rollback"
            text = f"version {g('version', '?')} (id {g('adapter', '?')}) is active again, by {g('actor', '?')}"
        else:
            title = f"adapter {action}" if action else "adapter status"
            text = f"version {g('version', '?')} (id {g('adapter', '?')}): {g('from', '?')} -> {g('to', '?')}"
            text += f", by {g('actor', '?')}" + (f" ({g('reason', '')})" if g("reason", "") else "")
    elif kind == "adapter.drift":
        severity, title = "alert", "drift alert"
        text = (f"version {g('version', '?')}: mean first-token KL {g('first_token_kl', '?')} over "
                f"{g('samples', '?')} samples (threshold {g('threshold', '?')})")  # fmt: skip
    elif kind == "fit.failed":
        severity, title, n = "alert", "fit failed", g("attempts", "?")
        text = (f"{g('sender', '?')} -> {g('receiver', '?')} ({g('method', '?')}) failed after "
                f"{n} attempt{'' if n == '1' else 's'}: {g('error', '?')}")  # fmt: skip
    try:
        ts = float(g("ts", "0"))
    except ValueError:
        ts = 0.0
    return FeedItem(event.id, kind, ts, severity, title, text)


def recent_events(log: EventLog, count: int) -> list[Event]:
    """The newest ``count`` events, newest first. Raises ``StoreUnavailable``."""
    rows: Any
    with redis_errors("read events"):
        rows = log.client.xrevrange(log.key, count=count)
    out = []
    for entry_id, raw in rows:
        fields = {k.decode(): v.decode() for k, v in raw.items()}
        out.append(Event(entry_id.decode(), fields.pop("kind", ""), fields))
    return out


def active_alerts(events: Sequence[Event], now: float, window_s: float) -> list[FeedItem]:
    """Alerts of the last ``window_s`` seconds among ``events``, newest first."""
    items = [describe(e) for e in events if e.kind in ALERT_KINDS]
    return [i for i in items if now - i.ts <= window_s]


def last_id(log: EventLog) -> str:
    """The id of the newest event, or ``0-0`` for an empty stream."""
    newest = recent_events(log, 1)
    return newest[0].id if newest else "0-0"


async def stream(log: EventLog, after: str, *, poll_s: float, stream_s: float) -> AsyncIterator[bytes]:
    """SSE bytes: every event after stream id ``after``, as it arrives, for ``stream_s`` seconds."""
    yield b"retry: 1000\n\n"
    deadline = time.monotonic() + stream_s
    quiet_since = time.monotonic()
    while time.monotonic() < deadline:
        try:
            events = await asyncio.to_thread(log.read, after, 200)
        except StoreError:
            events = []
            yield b": store unavailable\n\n"
        for event in events:
            after = event.id
            yield describe(event).sse()
        if events:
            quiet_since = time.monotonic()
            continue
        if time.monotonic() - quiet_since > KEEPALIVE_S:
            quiet_since = time.monotonic()
            yield b": keepalive\n\n"
        await asyncio.sleep(poll_s)
