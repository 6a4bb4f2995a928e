"""The KV store for one node: find, load and save KV values by prefix.

    store = KVStore(StoreConfig(data_dir=...))            # embedded Redis unless redis_url is set
    scope = store.scope(fingerprint, tenant_salt)
    if (match := store.lookup(scope, token_ids)) is not None:
        with store.checkout(match) as past:              # pinned while in use
            ...                                          # past covers token_ids[:match.tokens]
    store.put(scope, kv)                                 # after the turn: index it for the next hop
    store.close()

Contract:
- Methods block and are thread-safe (one lock around tier state); call them off the event loop.
- Any method may raise ``StoreUnavailable`` (Redis down; it fails within about two connect
  timeouts). ``load`` and ``checkout`` raise ``PayloadMissing``/``PayloadCorrupt`` for a payload
  that cannot be returned, after removing its handle from the index. Callers turn every
  ``StoreError`` into native prefill.
- A Redis down at start fails the constructor, unless ``wait_for_redis`` is set and the Redis is a
  configured one (the embedded server must always start): then ``lookup``, ``put`` and ``ping``
  raise ``StoreUnavailable`` until it answers, and the first of them that reaches it runs the
  start's reconciliation before anything else.
- ``put`` never raises for lack of room or a failing disk: it returns outcome "skipped", an
  ``oom.alert`` is emitted, and the request goes on without caching.
- One ``KVStore`` per node and data directory: payloads live in this process (CPU), in the
  engines (device) and under ``data_dir/ssd``. The store holds the node's lease in Redis while it
  is open (``store/lease.py``); a second live store on the same node and Redis fails to start
  with ``NodeInUse``.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from threading import RLock
from typing import NamedTuple

from heterofold.kv import KVCache
from store.config import StoreConfig
from store.connection import connect
from store.cpu_tier import CpuTier
from store.device_cache import DeviceCache
from store.device_tier import DeviceTier
from store.errors import (
    BadRequest,
    PayloadCorrupt,
    PayloadError,
    PayloadMissing,
    StoreError,
    StoreUnavailable,
    TierUnavailable,
)
from store.events import EventLog
from store.handle import HandleMeta, Match, PutResult
from store.identity import Scope
from store.index import Index
from store.keys import Keys
from store.lease import NodeLease
from store.payload import Payload
from store.placer import Placer
from store.redis_server import EmbeddedRedis
from store.ssd_tier import SsdTier
from store.tier import Tier

log = logging.getLogger(__name__)


class TierUsage(NamedTuple):
    tier: str
    used: int
    budget: int
    entries: int


class KVStore:
    def __init__(
        self, config: StoreConfig, devices: Sequence[DeviceCache] = (), clock: Callable[[], float] = time.time, *,
        wait_for_redis: bool = False,
    ) -> None:  # fmt: skip
        self.config = config
        self.clock = clock
        self._lock = RLock()
        self._pins: Counter[str] = Counter()
        self._reconciled = False
        self._late = False  # started without Redis: say so when it answers
        keys = Keys(config.key_prefix, config.node)  # validated before a server is started
        self._embedded = EmbeddedRedis(config.data_dir).start() if config.redis_url is None else None
        self.redis_url = self._embedded.url if self._embedded else str(config.redis_url)
        self.client = connect(self.redis_url, config.connect_timeout_s, config.socket_timeout_s)
        self.index = Index(self.client, keys, config.ttl_s)
        self.events = EventLog(self.client, keys.events, config.node, config.events_maxlen, config.ttl_s)
        self.lease = NodeLease(self.client, keys.owner, config.node, config.node_lease_s)
        try:
            tiers: list[Tier] = [DeviceTier(d, config.device_budget) for d in devices]
            self.cpu = CpuTier(config.cpu_budget)
            tiers.append(self.cpu)
            self.ssd: SsdTier | None = None
            try:
                self.ssd = SsdTier(config.data_dir / "ssd", config.ssd_budget, config.ssd_fsync)
                tiers.append(self.ssd)
            except TierUnavailable as exc:
                self.events.emit_quietly("oom.alert", clock(), reason="tier_unavailable", tier="ssd", detail=str(exc))
            self.tiers = tiers
            self.placer = Placer(tiers, self.index, self.events, self.is_pinned, clock, config.high_water)
            try:
                self._connect()
            except StoreUnavailable as exc:
                if not wait_for_redis or self._embedded is not None:
                    raise
                log.warning("Redis unreachable at start; the store answers StoreUnavailable until it does: %s", exc)
                self._late = True
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        self.lease.release()
        self.client.close()
        if self._embedded is not None:
            self._embedded.stop()

    def __enter__(self) -> KVStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def ping(self) -> None:
        """Raise ``StoreUnavailable`` unless Redis answers; the first answer after a start without
        Redis also runs the start's reconciliation."""
        if self._reconciled:
            self.index.ping()
        else:
            self._connect()

    def scope(self, fingerprint: str, tenant_salt: str = "") -> Scope:
        return Scope(fingerprint, tenant_salt, self.config.page_size)

    def lookup(self, scope: Scope, token_ids: Sequence[int]) -> Match | None:
        """The longest cached page-aligned prefix of ``token_ids`` in ``scope``, or None."""
        self._connect()
        found = self.index.lookup(scope.key, scope.pages(token_ids))
        return None if found is None else Match(found[0] * scope.page_size, found[1])

    def put(self, scope: Scope, kv: KVCache) -> PutResult:
        """Store ``kv`` and index it at every full-page boundary it can be cut at."""
        if kv.fingerprint != scope.fingerprint:
            raise BadRequest("the value was made by another model than the scope's")
        ids = kv.token_ids.tolist()
        handle_id = scope.identity(ids).handle_id
        ps = scope.page_size
        chain = scope.pages(ids)
        cuts = [i for i in range(1, len(chain) + 1) if kv.can_truncate(i * ps)]  # pages a lookup may end at
        pages = tuple(chain[i - 1] for i in cuts)
        indexed = cuts[-1] * ps if cuts else 0
        if not pages:
            return PutResult(handle_id, "skipped", None, 0, "no full-page boundary the value can be cut at")
        with self._lock:
            self._connect()
            if self.index.exists(handle_id):
                return PutResult(handle_id, "exists", None, indexed, "")
            for tier in self.tiers:
                tier.delete(handle_id)  # a payload the index lost (a Redis restart without its data)
            payload = Payload(kv)
            placed = self.placer.place(handle_id, payload, self.placer.chain(payload), alert_no_space=True)
            if placed is None:
                return PutResult(handle_id, "skipped", None, 0, "no tier has room, even after eviction")
            tier, stored = placed
            now = self.clock()
            meta = HandleMeta(
                handle_id, scope.key, kv.fingerprint, kv.num_tokens, stored.nbytes, tier.name,
                stored.location, stored.checksum, now, now, 0, pages,
            )  # fmt: skip
            event = self.events.entry(
                "kv.stored", now, handle=handle_id, fingerprint=kv.fingerprint, tokens=kv.num_tokens,
                bytes=stored.nbytes, tier=tier.name,
            )  # fmt: skip
            try:
                registered = self.index.register(meta, event, self.config.events_maxlen)
            except StoreError:
                tier.delete(handle_id)  # never leave a payload the index does not name
                raise
            if not registered:
                tier.delete(handle_id)
                return PutResult(handle_id, "exists", None, indexed, "")
            self._publish_usage()
            return PutResult(handle_id, "stored", tier.name, indexed, "")

    def load(self, match: Match, promote: bool = True) -> KVCache:
        """The value for the matched prefix. A hit is counted, and with ``promote`` the payload
        moves to the fastest tier with room. The value is never mutated by the store."""
        with self._lock:
            meta, tier = self._locate(match.meta)
            try:
                if tier is None:
                    raise PayloadMissing(f"no tier on this node holds {meta.handle_id} ({meta.location})")
                payload = tier.get(meta.handle_id, meta.checksum)
            except PayloadError as exc:
                self.index.remove(meta.handle_id)
                reason = "corrupt" if isinstance(exc, PayloadCorrupt) else "missing"
                self.events.emit("kv.evicted", self.clock(), handle=meta.handle_id, tier=meta.tier, reason=reason)
                self._publish_usage()
                raise
            now = self.clock()
            event = self.events.entry(
                "kv.hit", now, handle=meta.handle_id, fingerprint=meta.fingerprint, tokens=match.tokens, tier=tier.name
            )
            self.index.touch(meta, now, event, self.config.events_maxlen)
            if promote:
                self._promote(meta.handle_id, tier, payload)
        kv = payload.kv
        return kv if match.tokens == kv.num_tokens else kv.truncate(match.tokens)

    @contextmanager
    def checkout(self, match: Match) -> Iterator[KVCache]:
        """``load`` with the handle pinned while the block runs; promotion waits until it ends so
        that a hit never pays for moving other values out of the way."""
        self.pin(match.meta.handle_id)
        try:
            yield self.load(match, promote=False)
        finally:
            self.unpin(match.meta.handle_id)
        with self._lock:
            meta, tier = self._locate(match.meta)
            if tier is not None:
                with suppress(PayloadError):  # promotion is best effort; the next load reports the payload
                    self._promote(meta.handle_id, tier, tier.get(meta.handle_id, meta.checksum))

    def pin(self, handle_id: str) -> None:
        """Keep a handle where it is (never demoted or evicted) until as many ``unpin`` calls."""
        with self._lock:
            self._pins[handle_id] += 1

    def unpin(self, handle_id: str) -> None:
        with self._lock:
            self._pins[handle_id] -= 1
            if self._pins[handle_id] <= 0:
                del self._pins[handle_id]

    def is_pinned(self, handle_id: str) -> bool:
        return self._pins[handle_id] > 0

    def prefill_saved(self, scope: Scope, tokens: int, **fields: object) -> None:
        """Record prefill the caller skipped thanks to a hit (for the dashboard's savings)."""
        self.events.emit("prefill.saved", self.clock(), fingerprint=scope.fingerprint, tokens=tokens, **fields)

    def check_engines(self) -> None:
        """Raise an ``oom.alert`` for each engine that has started reporting memory pressure since
        the last check (call it periodically; placement notices pressure too)."""
        with self._lock:
            for tier in self.tiers:
                if isinstance(tier, DeviceTier):
                    engine = f"engine {tier.cache.fingerprint[:16]}"
                    self.placer.engine_pressure(tier, tier.cache.memory().pressure, engine)

    def usage(self) -> list[TierUsage]:
        with self._lock:
            return [TierUsage(t.name, t.used, t.budget, len(t.entries())) for t in self.tiers]

    def _locate(self, meta: HandleMeta) -> tuple[HandleMeta, Tier | None]:
        """The handle's current metadata and the tier holding it: a match's metadata may predate
        a demotion or promotion, so it is read again when its tier does not hold the handle."""
        tier = self._tier_of(meta)
        if tier is not None and meta.handle_id in tier:
            return meta, tier
        fresh = self.index.get(meta.handle_id)
        if fresh is None:
            return meta, None
        tier = self._tier_of(fresh)
        return fresh, tier if tier is not None and fresh.handle_id in tier else None

    def _tier_of(self, meta: HandleMeta) -> Tier | None:
        for tier in self.tiers:
            if tier.name == meta.tier and (not isinstance(tier, DeviceTier) or tier.location == meta.location):
                return tier
        return None

    def _promote(self, handle_id: str, tier: Tier, payload: Payload) -> None:
        chain = self.placer.chain(payload)
        higher = chain[: chain.index(tier)] if tier in chain else []
        placed = self.placer.place(handle_id, payload, higher, alert_no_space=False) if higher else None
        if placed is None:
            return
        new_tier, stored = placed
        if self.index.retier(handle_id, new_tier.name, stored.location, stored.checksum):
            tier.delete(handle_id)
            self.events.emit("kv.promoted", self.clock(), handle=handle_id, tier=new_tier.name, **{"from": tier.name})
        else:
            new_tier.delete(handle_id)
        self._publish_usage()

    def _connect(self) -> None:
        """Reconcile once, the first time Redis answers. Raises ``StoreUnavailable`` until then."""
        if self._reconciled:
            return
        with self._lock:  # no put may place a payload while orphans are being deleted
            if not self._reconciled:
                self.index.ping()
                self.lease.acquire()  # another live process on this node would lose its index here
                self._reconcile()
                self._reconciled = True
                if self._late:
                    log.warning("Redis reachable: the store is connected")

    def _reconcile(self) -> None:
        """At start: drop handles whose payload this node no longer holds (memory tiers of an
        earlier process, a lost file) and payloads no handle names (a crash before indexing)."""
        valid: set[tuple[str, str]] = set()
        for meta in self.index.handles():
            tier = self._tier_of(meta)
            if tier is not None and meta.handle_id in tier:
                valid.add((tier.name, meta.handle_id))
            else:
                self.index.remove(meta.handle_id)
        for tier in self.tiers:
            for handle_id in tier.entries():
                if (tier.name, handle_id) not in valid:
                    tier.delete(handle_id)
        self._publish_usage()

    def _publish_usage(self) -> None:
        self.index.set_usage({t.name: t.used for t in self.tiers})
