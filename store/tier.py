"""The tier interface: one place on this node that holds payloads, within a byte budget.

Rules every tier keeps:
- Entries are keyed by handle id, one entry per id; ``used`` is the sum of their sizes and never
  exceeds ``budget``. ``put`` refuses (``TierFull``) a payload that does not fit: making room by
  demotion and eviction is the placer's job, never the tier's.
- ``put`` copies what it keeps; the caller's tensors may be reused after it returns.
- ``get`` returns a value that no later store operation mutates. It raises ``PayloadMissing``
  when the entry is gone and ``PayloadCorrupt`` when its bytes fail their checksum (the tier
  drops the entry before raising).
- ``TierUnavailable`` from ``put`` means the medium failed (disk full, unwritable): the placer
  skips the tier and raises an alert.
- Tiers are not thread-safe; the store serializes calls.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import NamedTuple

from store.handle import TierName
from store.payload import Payload


class Stored(NamedTuple):
    location: str  # where the bytes are, for the handle metadata
    nbytes: int  # what the entry is charged against the budget
    checksum: str  # sha256 of the serialized payload, "" when it was never serialized


class Tier(ABC):
    name: TierName  # the handle metadata's tier field
    budget: int

    def __init__(self) -> None:
        self._sizes: dict[str, int] = {}

    @property
    def used(self) -> int:
        return sum(self._sizes.values())

    @property
    def free(self) -> int:
        return max(0, self.budget - self.used)

    def entries(self) -> dict[str, int]:
        """Handle id -> bytes charged, a copy."""
        return dict(self._sizes)

    def __contains__(self, handle_id: object) -> bool:
        return handle_id in self._sizes

    def accepts(self, payload: Payload) -> bool:
        """Whether this tier takes this kind of payload at all (a device tier holds one model's)."""
        return True

    @abstractmethod
    def size_of(self, payload: Payload) -> int:
        """Bytes ``payload`` would be charged here."""

    @abstractmethod
    def put(self, handle_id: str, payload: Payload) -> Stored: ...

    @abstractmethod
    def get(self, handle_id: str, checksum: str) -> Payload:
        """``checksum`` is the handle metadata's; tiers holding serialized bytes verify against it.
        The payload carries its blob when the tier holds serialized bytes."""

    @abstractmethod
    def delete(self, handle_id: str) -> None:
        """Drop the entry; a missing entry is not an error."""
