"""A KV value on its way into a tier, with its serialized form made at most once."""

from __future__ import annotations

from heterofold.kv import KVCache

# KVCache.to_bytes layout: 4-byte magic, 2-byte version, then the body's sha256.
_DIGEST = slice(6, 38)


def memory_bytes(kv: KVCache) -> int:
    """Bytes the value's tensors occupy in memory."""
    return kv.nbytes + kv.token_ids.nbytes + kv.positions.nbytes


def blob_checksum(blob: bytes | memoryview) -> str:
    """The sha256 a serialized value carries in its header (hex), without hashing it again."""
    return bytes(blob[_DIGEST]).hex()


class Payload:
    """One value being placed. ``blob`` serializes on first use only, so a payload that stays in
    memory tiers never pays for serialization and one that lands on SSD pays once. A payload read
    back from SSD comes with its blob."""

    def __init__(self, kv: KVCache, blob: bytes | None = None) -> None:
        self.kv = kv
        self._blob = blob

    @property
    def memory_bytes(self) -> int:
        return memory_bytes(self.kv)

    @property
    def serialized(self) -> bool:
        return self._blob is not None

    @property
    def blob(self) -> bytes:
        if self._blob is None:
            self._blob = self.kv.to_bytes()
        return self._blob

    @property
    def checksum(self) -> str:
        return blob_checksum(self.blob)
