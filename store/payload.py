"""A KV value on its way into a tier, with its serialized layout made at most once."""

from __future__ import annotations

from heterofold.kv import KVCache, KVParts


def memory_bytes(kv: KVCache) -> int:
    """Bytes the value's tensors occupy in memory."""
    return kv.nbytes + kv.token_ids.nbytes + kv.positions.nbytes


class Payload:
    """One value being placed. ``parts`` lays out its serialized form on first use only (views of
    its tensors, nothing copied), so a payload that stays in memory tiers never pays for it. A
    payload read back from SSD carries the checksum it was verified against."""

    def __init__(self, kv: KVCache, checksum: str = "") -> None:
        self.kv = kv
        self._checksum = checksum
        self._parts: KVParts | None = None

    @property
    def memory_bytes(self) -> int:
        return memory_bytes(self.kv)

    @property
    def parts(self) -> KVParts:
        if self._parts is None:
            self._parts = self.kv.to_parts()
        return self._parts

    @property
    def serialized(self) -> bool:
        """Whether its checksum is known, i.e. it was written to or read from SSD."""
        return bool(self._checksum)

    @property
    def checksum(self) -> str:
        """The sha256 of its serialized body (hex), hashed here unless already known."""
        if not self._checksum:
            self._checksum = self.parts.sha256().hex()
        return self._checksum
