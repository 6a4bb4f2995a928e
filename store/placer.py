"""Placement: which tier a payload lands in, and the demotions and evictions that make room.

Tiers are ordered fastest first (device, CPU, SSD); a payload's chain is the tiers that accept it.
Room in a tier is made one victim at a time: the unpinned entry with the largest
``(age + 1 s) × size`` (LRU weighted by size: old and large goes first, and a large entry goes
before a small one of the same age) moves one tier down its own chain, or out of the store from the
last tier. A payload the index no longer knows (an orphan) goes first, straight out. A tier is only
written once its free space covers the payload, so every budget holds after every step.
"""

from __future__ import annotations

from collections.abc import Callable

from store.errors import EnginePressure, PayloadError, TierFull, TierUnavailable
from store.events import EventLog
from store.index import Index
from store.payload import Payload
from store.tier import Stored, Tier

Placed = tuple[Tier, Stored]


class Placer:
    def __init__(
        self,
        tiers: list[Tier],
        index: Index,
        events: EventLog,
        is_pinned: Callable[[str], bool],
        clock: Callable[[], float],
        high_water: float,
    ) -> None:
        self.tiers = tiers
        self.index = index
        self.events = events
        self.is_pinned = is_pinned
        self.clock = clock
        self.high_water = high_water
        self._moving: set[str] = set()  # handles in flight: never victims of their own move
        self._above: set[str] = set()  # tiers above the high-water mark (alerts fire on crossing)
        self._pressured: set[int] = set()  # tiers whose engine reported pressure (alerts fire on onset)

    def chain(self, payload: Payload) -> list[Tier]:
        return [t for t in self.tiers if t.accepts(payload)]

    def place(self, handle_id: str, payload: Payload, tiers: list[Tier], *, alert_no_space: bool) -> Placed | None:
        """Put ``payload`` in the first of ``tiers`` where room can be made. None when none can
        take it; with ``alert_no_space`` that raises an ``oom.alert`` (a new value that could not
        be cached, as opposed to a best-effort promotion or demotion)."""
        self._moving.add(handle_id)
        try:
            for tier in tiers:
                try:
                    size = tier.size_of(payload)
                    if size > tier.budget:
                        continue
                    self._make_room(tier, size)
                    stored = tier.put(handle_id, payload)
                except TierFull:
                    continue
                except EnginePressure as exc:
                    self.engine_pressure(tier, True, str(exc))
                    continue
                except TierUnavailable as exc:
                    self.alert("tier_unavailable", tier.name, str(exc))
                    continue
                self._check_high_water(tier)
                return tier, stored
        finally:
            self._moving.discard(handle_id)
        if alert_no_space:
            self.alert("no_space", ",".join(t.name for t in tiers), f"{payload.memory_bytes} bytes fit in no tier")
        return None

    def alert(self, reason: str, tier: str, detail: str) -> None:
        self.events.emit_quietly("oom.alert", self.clock(), reason=reason, tier=tier, detail=detail)

    def engine_pressure(self, tier: Tier, pressure: bool, detail: str) -> None:
        """Alert when an engine starts reporting memory pressure; once per episode, not per put."""
        if pressure and id(tier) not in self._pressured:
            self._pressured.add(id(tier))
            self.alert("engine_pressure", tier.name, detail)
        elif not pressure:
            self._pressured.discard(id(tier))

    def _check_high_water(self, tier: Tier) -> None:
        level = tier.used / tier.budget if tier.budget else 1.0
        if level >= self.high_water and tier.name not in self._above:
            self._above.add(tier.name)
            self.alert("high_water", tier.name, f"{tier.used} of {tier.budget} bytes used")
        elif level < 0.9 * self.high_water:
            self._above.discard(tier.name)  # re-armed once clearly below the mark

    def _make_room(self, tier: Tier, size: int) -> None:
        while tier.free < size:
            victim = self._victim(tier)
            if victim is None:
                raise TierFull(f"{tier.name} tier: every entry is pinned or in flight")
            handle_id, orphan = victim
            if orphan:
                tier.delete(handle_id)
                self.index.remove(handle_id)  # drops a stale LRU entry, if any
                self.events.emit("kv.evicted", self.clock(), handle=handle_id, tier=tier.name, reason="orphan")
            else:
                self._demote(tier, handle_id)

    def _victim(self, tier: Tier) -> tuple[str, bool] | None:
        """(handle, is orphan) of the entry to move out of ``tier``, or None when all are protected."""
        sizes = {h: n for h, n in tier.entries().items() if h not in self._moving and not self.is_pinned(h)}
        if not sizes:
            return None
        ids = list(sizes)
        now = self.clock()
        best, best_weight = ids[0], -1.0
        for handle_id, last in zip(ids, self.index.last_access(ids), strict=True):
            if last is None:
                return handle_id, True
            weight = (max(0.0, now - last) + 1.0) * sizes[handle_id]
            if weight > best_weight:
                best, best_weight = handle_id, weight
        return best, False

    def _demote(self, tier: Tier, handle_id: str) -> None:
        """Move one entry down its chain, or evict it when no lower tier takes it."""
        moved: Placed | None = None
        if tier is not self.tiers[-1]:
            try:
                payload = tier.get(handle_id, "")  # memory tiers: no checksum to check
                chain = self.chain(payload)
                moved = self.place(handle_id, payload, chain[chain.index(tier) + 1 :], alert_no_space=False)
            except PayloadError:
                moved = None
        if moved is not None:
            new_tier, stored = moved
            try:
                recorded = self.index.retier(handle_id, new_tier.name, stored.location, stored.checksum)
            except Exception:
                new_tier.delete(handle_id)
                raise
            tier.delete(handle_id)
            if recorded:
                self.events.emit(
                    "kv.demoted", self.clock(), handle=handle_id, tier=new_tier.name, **{"from": tier.name}
                )
                return
            new_tier.delete(handle_id)  # the handle left the index meanwhile
            return
        tier.delete(handle_id)
        self.index.remove(handle_id)
        self.events.emit("kv.evicted", self.clock(), handle=handle_id, tier=tier.name, reason="budget")
