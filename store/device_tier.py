"""The device tier: values resident in an engine's memory, budgeted by the store's configuration
and by what the engine reports, whichever is tighter."""

from __future__ import annotations

from store.device_cache import DeviceCache
from store.errors import EnginePressure, PayloadMissing, TierFull
from store.payload import Payload
from store.tier import Stored, Tier


class DeviceTier(Tier):
    name = "device"

    def __init__(self, cache: DeviceCache, budget: int) -> None:
        super().__init__()
        self.cache = cache
        self.budget = budget

    @property
    def free(self) -> int:
        mem = self.cache.memory()
        return max(0, min(self.budget - self.used, mem.capacity - mem.used))

    @property
    def location(self) -> str:
        return f"device:{self.cache.fingerprint[:16]}"

    def accepts(self, payload: Payload) -> bool:
        return payload.kv.fingerprint == self.cache.fingerprint

    def size_of(self, payload: Payload) -> int:
        return payload.memory_bytes

    def put(self, handle_id: str, payload: Payload) -> Stored:
        if self.cache.memory().pressure:
            raise EnginePressure(f"engine {self.cache.fingerprint[:16]} reports memory pressure")
        size = self.size_of(payload)
        if handle_id in self._sizes or size > self.free:
            raise TierFull(f"device tier: {size} bytes do not fit in {self.free} free")
        self.cache.hold(handle_id, payload.kv)
        self._sizes[handle_id] = size
        return Stored(location=self.location, nbytes=size, checksum=payload.checksum if payload.serialized else "")

    def get(self, handle_id: str, checksum: str) -> Payload:
        kv = self.cache.fetch(handle_id) if handle_id in self._sizes else None
        if kv is None:
            self._sizes.pop(handle_id, None)
            raise PayloadMissing(f"device tier does not hold {handle_id}")
        return Payload(kv)

    def delete(self, handle_id: str) -> None:
        self._sizes.pop(handle_id, None)
        self.cache.drop(handle_id)
