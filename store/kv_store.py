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
  engines (device) and under ``data_dir/ssd``; ``store/node_tiers.py`` keeps them (tiers, pins,
  promotion, reconciliation), this module indexes them. The store holds the node's lease in
  Redis while it is open (``store/lease.py``); a second live store on the same node and Redis
  fails to start with ``NodeInUse``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from threading import RLock

from heterofold.kv import KVCache
from store.config import StoreConfig
from store.connection import connect
from store.device_cache import DeviceCache
from store.errors import BadRequest, PayloadCorrupt, PayloadError, PayloadMissing, StoreError, StoreUnavailable
from store.events import EventLog
from store.handle import HandleMeta, Match, PutResult
from store.identity import Scope
from store.index import Index
from store.lease import NodeLease
from store.node_tiers import NodeTiers, TierUsage
from store.payload import Payload
from store.redis_keys import Keys
from store.redis_server import EmbeddedRedis

log = logging.getLogger(__name__)


class KVStore:
    def __init__(
        self, config: StoreConfig, devices: Sequence[DeviceCache] = (), clock: Callable[[], float] = time.time, *,
        wait_for_redis: bool = False,
    ) -> None:  # fmt: skip
        self.config = config
        self.clock = clock
        self._lock = RLock()
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
            self.tiers = NodeTiers(config, devices, self.index, self.events, clock)
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
            placed = self.tiers.place_new(handle_id, Payload(kv))
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
            self.tiers.publish_usage()
            return PutResult(handle_id, "stored", tier.name, indexed, "")

    def load(self, match: Match, promote: bool = True) -> KVCache:
        """The value for the matched prefix. A hit is counted, and with ``promote`` the payload
        moves to the fastest tier with room. The value is never mutated by the store."""
        with self._lock:
            meta, tier = self.tiers.locate(match.meta)
            try:
                if tier is None:
                    raise PayloadMissing(f"no tier on this node holds {meta.handle_id} ({meta.location})")
                payload = tier.get(meta.handle_id, meta.checksum)
            except PayloadError as exc:
                self.index.remove(meta.handle_id)
                reason = "corrupt" if isinstance(exc, PayloadCorrupt) else "missing"
                self.events.emit("kv.evicted", self.clock(), handle=meta.handle_id, tier=meta.tier, reason=reason)
                self.tiers.publish_usage()
                raise
            now = self.clock()
            event = self.events.entry(
                "kv.hit", now, handle=meta.handle_id, fingerprint=meta.fingerprint, tokens=match.tokens, tier=tier.name
            )
            self.index.touch(meta, now, event, self.config.events_maxlen)
            if promote:
                self.tiers.promote(meta.handle_id, tier, payload)
        kv = payload.kv
        return kv if match.tokens == kv.num_tokens else kv.truncate(match.tokens)

    @contextmanager
    def checkout(self, match: Match) -> Iterator[KVCache]:
        """``load`` with the handle pinned while the block runs; promotion waits until it ends so
        that a hit never pays for moving other values out of the way."""
        self.tiers.pin(match.meta.handle_id)
        try:
            yield self.load(match, promote=False)
        finally:
            self.tiers.unpin(match.meta.handle_id)
        with self._lock:
            meta, tier = self.tiers.locate(match.meta)
            if tier is not None:
                with suppress(PayloadError):  # promotion is best effort; the next load reports the payload
                    self.tiers.promote(meta.handle_id, tier, tier.get(meta.handle_id, meta.checksum))

    def prefill_saved(self, scope: Scope, tokens: int, **fields: object) -> None:
        """Record prefill the caller skipped thanks to a hit (for the dashboard's savings)."""
        self.events.emit("prefill.saved", self.clock(), fingerprint=scope.fingerprint, tokens=tokens, **fields)

    def check_engines(self) -> None:
        """An ``oom.alert`` for each engine that started reporting memory pressure since the last
        check (call it periodically; placement notices pressure too)."""
        with self._lock:
            self.tiers.check_engines()

    def usage(self) -> list[TierUsage]:
        with self._lock:
            return self.tiers.usage()

    def _connect(self) -> None:
        """Reconcile once, the first time Redis answers. Raises ``StoreUnavailable`` until then."""
        if self._reconciled:
            return
        with self._lock:  # no put may place a payload while orphans are being deleted
            if not self._reconciled:
                self.index.ping()
                self.lease.acquire()  # another live process on this node would lose its index here
                self.tiers.reconcile()
                self._reconciled = True
                if self._late:
                    log.warning("Redis reachable: the store is connected")
