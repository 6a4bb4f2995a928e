"""What an engine implements so the store can keep KV values resident in the engine's own memory
(the device tier), and a torch implementation any engine can use.

Rules an implementation keeps:
- ``memory`` reports what the engine sees: the bytes it can give to resident values, the bytes in
  use, and whether it is under memory pressure. Under pressure the store holds nothing new there
  and raises an ``oom.alert``.
- ``hold`` makes a copy in engine memory that no later call mutates, or raises ``TierFull``.
- ``fetch`` returns the held value (never mutated afterwards) or None; ``drop`` frees it, and a
  missing key is not an error.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import NamedTuple

import torch

from heterofold.kv import KVCache
from store.errors import TierFull
from store.payload import memory_bytes


class DeviceMemory(NamedTuple):
    capacity: int  # bytes the engine can give to resident KV values
    used: int  # bytes of that in use
    pressure: bool  # the engine is short of memory


class DeviceCache(ABC):
    fingerprint: str  # the engine's model; only its values are held

    @abstractmethod
    def memory(self) -> DeviceMemory: ...

    @abstractmethod
    def hold(self, key: str, kv: KVCache) -> None: ...

    @abstractmethod
    def fetch(self, key: str) -> KVCache | None: ...

    @abstractmethod
    def drop(self, key: str) -> None: ...


class TorchDeviceCache(DeviceCache):
    """Holds values as tensors on one torch device. Pressure is reported when the device's free
    memory (CUDA's own count) falls below ``min_free``; a CPU device reports none."""

    def __init__(self, fingerprint: str, capacity: int, device: str | torch.device = "cpu", min_free: int = 0) -> None:
        self.fingerprint = fingerprint
        self.capacity = capacity
        self.device = torch.device(device)
        self.min_free = min_free
        self._held: dict[str, KVCache] = {}
        self._used = 0

    def memory(self) -> DeviceMemory:
        pressure = False
        if self.device.type == "cuda":
            free, _total = torch.cuda.mem_get_info(self.device)
            pressure = free < self.min_free
        return DeviceMemory(self.capacity, self._used, pressure)

    def hold(self, key: str, kv: KVCache) -> None:
        size = memory_bytes(kv)
        if key in self._held or self._used + size > self.capacity:
            raise TierFull(f"device cache: {size} bytes do not fit")

        def own(t: torch.Tensor) -> torch.Tensor:
            out = torch.empty(t.shape, dtype=t.dtype, device=self.device)
            out.copy_(t.detach())
            return out

        self._held[key] = KVCache(
            fingerprint=kv.fingerprint,
            token_ids=own(kv.token_ids),
            positions=own(kv.positions),
            keys=tuple(own(k) for k in kv.keys),
            values=tuple(own(v) for v in kv.values),
            windows=kv.windows,
        )
        self._used += size

    def fetch(self, key: str) -> KVCache | None:
        return self._held.get(key)

    def drop(self, key: str) -> None:
        kv = self._held.pop(key, None)
        if kv is not None:
            self._used -= memory_bytes(kv)
