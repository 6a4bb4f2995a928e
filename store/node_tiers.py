"""Where this node's payloads live: its tiers (fastest first), which handles are pinned, the tier
holding a handle, promotion, start-up reconciliation and usage.

    tiers = NodeTiers(config, devices, index, events, clock)   # device tiers, CPU, SSD if it opens
    placed = tiers.place_new(handle_id, payload)               # (tier, stored), or None: no room
    meta, tier = tiers.locate(meta)                            # tier None: this node lost it
    tiers.promote(handle_id, tier, payload)                    # best effort, after a hit

Not thread-safe except ``pin``/``unpin``/``is_pinned``: the ``KVStore`` serializes the other
calls under its lock. The index is read and written through the ``Index`` it is given; which
handles exist and which prefixes find them is the store's business, not this class's.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from threading import Lock
from typing import NamedTuple

from store.config import StoreConfig
from store.cpu_tier import CpuTier
from store.device_cache import DeviceCache
from store.device_tier import DeviceTier
from store.errors import TierUnavailable
from store.events import EventLog
from store.handle import HandleMeta
from store.index import Index
from store.payload import Payload
from store.placer import Placed, Placer
from store.ssd_tier import SsdTier
from store.tier import Tier


class TierUsage(NamedTuple):
    tier: str
    used: int
    budget: int
    entries: int


class NodeTiers:
    def __init__(
        self, config: StoreConfig, devices: Sequence[DeviceCache], index: Index, events: EventLog,
        clock: Callable[[], float],
    ) -> None:  # fmt: skip
        self.index = index
        self.events = events
        self.clock = clock
        self._pins: Counter[str] = Counter()
        self._pins_lock = Lock()
        tiers: list[Tier] = [DeviceTier(d, config.device_budget) for d in devices]
        self.cpu = CpuTier(config.cpu_budget)
        tiers.append(self.cpu)
        self.ssd: SsdTier | None = None
        try:
            self.ssd = SsdTier(config.data_dir / "ssd", config.ssd_budget, config.ssd_fsync)
            tiers.append(self.ssd)
        except TierUnavailable as exc:
            events.emit_quietly("oom.alert", clock(), reason="tier_unavailable", tier="ssd", detail=str(exc))
        self.tiers = tiers
        self.placer = Placer(tiers, index, events, self.is_pinned, clock, config.high_water)

    # pins: a pinned handle is never demoted or evicted
    def pin(self, handle_id: str) -> None:
        """Keep a handle where it is until as many ``unpin`` calls."""
        with self._pins_lock:
            self._pins[handle_id] += 1

    def unpin(self, handle_id: str) -> None:
        with self._pins_lock:
            self._pins[handle_id] -= 1
            if self._pins[handle_id] <= 0:
                del self._pins[handle_id]

    def is_pinned(self, handle_id: str) -> bool:
        return self._pins[handle_id] > 0

    # placement and lookup of payloads
    def place_new(self, handle_id: str, payload: Payload) -> Placed | None:
        """A new value into the fastest tier of its chain that can make room (evicting and demoting
        others); None, with an ``oom.alert``, when no tier can take it. A payload under the same id
        that the index lost (a Redis restart without its data) is dropped first."""
        for tier in self.tiers:
            tier.delete(handle_id)
        return self.placer.place(handle_id, payload, self.placer.chain(payload), alert_no_space=True)

    def locate(self, meta: HandleMeta) -> tuple[HandleMeta, Tier | None]:
        """The handle's current metadata and the tier holding it: a match's metadata may predate
        a demotion or promotion, so it is read again when its tier does not hold the handle."""
        tier = self.tier_of(meta)
        if tier is not None and meta.handle_id in tier:
            return meta, tier
        fresh = self.index.get(meta.handle_id)
        if fresh is None:
            return meta, None
        tier = self.tier_of(fresh)
        return fresh, tier if tier is not None and fresh.handle_id in tier else None

    def tier_of(self, meta: HandleMeta) -> Tier | None:
        for tier in self.tiers:
            if tier.name == meta.tier and (not isinstance(tier, DeviceTier) or tier.location == meta.location):
                return tier
        return None

    def promote(self, handle_id: str, tier: Tier, payload: Payload) -> None:
        """Move a payload to the fastest tier above ``tier`` with room (best effort: no alert)."""
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
        self.publish_usage()

    # upkeep
    def reconcile(self) -> None:
        """At start: drop handles whose payload this node no longer holds (memory tiers of an
        earlier process, a lost file) and payloads no handle names (a crash before indexing)."""
        valid: set[tuple[str, str]] = set()
        for meta in self.index.handles():
            tier = self.tier_of(meta)
            if tier is not None and meta.handle_id in tier:
                valid.add((tier.name, meta.handle_id))
            else:
                self.index.remove(meta.handle_id)
        for tier in self.tiers:
            for handle_id in tier.entries():
                if (tier.name, handle_id) not in valid:
                    tier.delete(handle_id)
        self.publish_usage()

    def check_engines(self) -> None:
        """Raise an ``oom.alert`` for each engine that has started reporting memory pressure since
        the last check (call it periodically; placement notices pressure too)."""
        for tier in self.tiers:
            if isinstance(tier, DeviceTier):
                engine = f"engine {tier.cache.fingerprint[:16]}"
                self.placer.engine_pressure(tier, tier.cache.memory().pressure, engine)

    def usage(self) -> list[TierUsage]:
        return [TierUsage(t.name, t.used, t.budget, len(t.entries())) for t in self.tiers]

    def publish_usage(self) -> None:
        """Each tier's bytes in Redis, for the dashboards of every replica."""
        self.index.set_usage({t.name: t.used for t in self.tiers})
