"""The Redis index: page chains to handles, handle metadata, LRU bookkeeping.

Every multi-key change is atomic: a WATCH/MULTI transaction where a read decides what to write
(register), a Lua script where existence must be checked and acted on in one step (lookup, touch,
retier, remove). Every key gets a TTL when written and again when its handle is hit. The scripts
address handle keys they derive from a prefix, so this needs a standalone Redis (or Sentinel),
not Redis Cluster.
"""

from __future__ import annotations

from typing import Any

import redis

from store.connection import redis_errors
from store.handle import HandleMeta, TierName
from store.redis_keys import Keys

# KEYS: page keys, shortest prefix first. ARGV: handle key prefix.
# Returns {pages, handle id, flat metadata} for the longest page naming a live handle, else {0}.
# Members whose handle expired or was removed are dropped on the way.
_LOOKUP = """
for i = #KEYS, 1, -1 do
  for _, h in ipairs(redis.call('SMEMBERS', KEYS[i])) do
    local meta = redis.call('HGETALL', ARGV[1] .. h)
    if #meta > 0 then return {i, h, meta} end
    redis.call('SREM', KEYS[i], h)
  end
end
return {0}
"""

# KEYS: handle key, lru key, then its page keys. ARGV: handle id, now, ttl.
_TOUCH = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HINCRBY', KEYS[1], 'hits', 1)
redis.call('HSET', KEYS[1], 'last_access', ARGV[2])
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
for i = 1, #KEYS do redis.call('EXPIRE', KEYS[i], ARGV[3]) end
return 1
"""

# KEYS: handle key. ARGV: tier, location, checksum.
_RETIER = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'tier', ARGV[1], 'location', ARGV[2], 'checksum', ARGV[3])
return 1
"""

# KEYS: handle key, lru key. ARGV: handle id, page key prefix (ends with the scope and ':').
# The page list is read inside the script so nothing can register in between.
_REMOVE = """
redis.call('ZREM', KEYS[2], ARGV[1])
local scope = redis.call('HGET', KEYS[1], 'scope')
if not scope then return 0 end
local pages = redis.call('HGET', KEYS[1], 'pages') or ''
for h in string.gmatch(pages, '%S+') do redis.call('SREM', ARGV[2] .. scope .. ':' .. h, ARGV[1]) end
redis.call('DEL', KEYS[1])
return 1
"""


class Index:
    """Handle bookkeeping for one node. Methods raise ``StoreUnavailable`` or ``IndexFailure``."""

    def __init__(self, client: redis.Redis, keys: Keys, ttl_s: int) -> None:
        self.client = client
        self.keys = keys
        self.ttl_s = ttl_s
        self._lookup = client.register_script(_LOOKUP)
        self._touch = client.register_script(_TOUCH)
        self._retier = client.register_script(_RETIER)
        self._remove = client.register_script(_REMOVE)

    def ping(self) -> None:
        with redis_errors("ping"):
            self.client.ping()

    def exists(self, handle_id: str) -> bool:
        with redis_errors("exists"):
            return bool(self.client.exists(self.keys.handle(handle_id)))

    def register(self, meta: HandleMeta, event: dict[str, str] | None = None, events_maxlen: int = 0) -> bool:
        """Write a new handle, its page memberships and its LRU entry (and ``event``) in one
        transaction. False when the handle exists already: someone stored the same value first."""
        hkey = self.keys.handle(meta.handle_id)
        with redis_errors("register"), self.client.pipeline(transaction=True) as pipe:
            try:
                pipe.watch(hkey)
                if pipe.exists(hkey):
                    return False
                pipe.multi()
                pipe.hset(hkey, mapping=meta.to_redis())  # type: ignore[arg-type]  # redis-py's mapping type is invariant
                pipe.expire(hkey, self.ttl_s)
                for h in meta.pages:
                    pkey = self.keys.page(meta.scope, h)
                    pipe.sadd(pkey, meta.handle_id)
                    pipe.expire(pkey, self.ttl_s)
                pipe.zadd(self.keys.lru, {meta.handle_id: meta.last_access})
                pipe.expire(self.keys.lru, self.ttl_s)
                if event is not None:
                    pipe.xadd(self.keys.events, event, maxlen=events_maxlen, approximate=True)  # type: ignore[arg-type]
                    pipe.expire(self.keys.events, self.ttl_s)
                pipe.execute()
            except redis.exceptions.WatchError:
                return False
        return True

    def lookup(self, scope: str, pages: list[str]) -> tuple[int, HandleMeta] | None:
        """The longest page of ``pages`` (a query's chain) that a live handle covers."""
        if not pages:
            return None
        with redis_errors("lookup"):
            out: list[Any] = self._lookup(
                keys=[self.keys.page(scope, h) for h in pages], args=[self.keys.handle_prefix]
            )
        if out[0] == 0:
            return None
        n, handle_id, flat = int(out[0]), out[1].decode(), out[2]
        return n, HandleMeta.from_redis(handle_id, dict(zip(flat[::2], flat[1::2], strict=True)))

    def touch(self, meta: HandleMeta, now: float, event: dict[str, str] | None = None, events_maxlen: int = 0) -> bool:
        """Count a hit: hits, last access, LRU score, fresh TTLs on the handle and its pages, and
        ``event``, in one transaction. False when the handle is gone."""
        keys = [self.keys.handle(meta.handle_id), self.keys.lru] + [self.keys.page(meta.scope, h) for h in meta.pages]
        with redis_errors("touch"), self.client.pipeline(transaction=True) as pipe:
            self._touch(keys=keys, args=[meta.handle_id, repr(now), self.ttl_s], client=pipe)
            if event is not None:
                pipe.xadd(self.keys.events, event, maxlen=events_maxlen, approximate=True)  # type: ignore[arg-type]
                pipe.expire(self.keys.events, self.ttl_s)
            return bool(pipe.execute()[0])

    def retier(self, handle_id: str, tier: TierName, location: str, checksum: str) -> bool:
        """Record a move between tiers. False when the handle is gone (the mover drops its copy)."""
        with redis_errors("retier"):
            return bool(self._retier(keys=[self.keys.handle(handle_id)], args=[tier, location, checksum]))

    def remove(self, handle_id: str) -> bool:
        """Drop a handle, its page memberships and its LRU entry. False when it was not there."""
        args = [handle_id, self.keys.page_prefix]
        with redis_errors("remove"):
            return bool(self._remove(keys=[self.keys.handle(handle_id), self.keys.lru], args=args))

    def get(self, handle_id: str) -> HandleMeta | None:
        with redis_errors("get"):
            raw = self.client.hgetall(self.keys.handle(handle_id))
        return HandleMeta.from_redis(handle_id, raw) if raw else None  # type: ignore[arg-type]

    def last_access(self, handle_ids: list[str]) -> list[float | None]:
        """LRU scores, None for a handle the index no longer has (an orphan payload)."""
        if not handle_ids:
            return []
        with redis_errors("last_access"):
            scores: list[float | None] = self.client.zmscore(self.keys.lru, handle_ids)
        return scores

    def handles(self, batch: int = 500) -> list[HandleMeta]:
        """Every handle of this node, read through the LRU set (never a key scan)."""
        out: list[HandleMeta] = []
        with redis_errors("handles"):
            ids = [h.decode() for h in self.client.zrange(self.keys.lru, 0, -1)]  # type: ignore[union-attr]
            for start in range(0, len(ids), batch):
                chunk = ids[start : start + batch]
                with self.client.pipeline(transaction=False) as pipe:
                    for h in chunk:
                        pipe.hgetall(self.keys.handle(h))
                    raws = pipe.execute()
                for h, raw in zip(chunk, raws, strict=True):
                    if raw and b"tier" in raw:
                        out.append(HandleMeta.from_redis(h, raw))
                    else:  # expired, or a partial hash (seen after an append-only-log replay): drop it
                        self.client.delete(self.keys.handle(h))
                        self.client.zrem(self.keys.lru, h)
        return out

    def set_usage(self, usage: dict[str, int]) -> None:
        with redis_errors("usage"), self.client.pipeline(transaction=True) as pipe:
            pipe.hset(self.keys.usage, mapping=usage)  # type: ignore[arg-type]  # invariant mapping key type
            pipe.expire(self.keys.usage, self.ttl_s)
            pipe.execute()
