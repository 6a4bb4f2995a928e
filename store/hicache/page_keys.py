"""SGLang's HiCache page keys, and the Redis keys the page store writes.

Page keys (sglang 0.5.23, ``get_hash_str`` in ``mem_cache/utils.py``, computed by
``cpp_utils/hash_binding.cpp``): page ``i`` of a token sequence is

    digest_i = sha256(digest_{i-1} || token ids of page i as uint32 little-endian)

hex-encoded. The first page chains onto nothing, or onto ``storage_namespace_seed(extra_key,
cache_salt)`` when a request carries either. Only full pages are ever backed up or looked up.
This is ``store.identity.page_hashes`` with an empty seed, so the chain is shared with our store.

Redis keys, under ``prefix`` (default ``hf``) and one namespace per served model (SGLang keys are
the same for the same tokens whatever the model; the namespace keeps models apart):

    {prefix}:hicache:{ns}:r{rank}of{tp}:{page_key}   STRING  one canonical page of one TP rank
    {prefix}:hicache:{ns}:geometry:r{rank}of{tp}     STRING  that rank's page geometry (JSON)

Every key carries a TTL.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from store.identity import page_hashes

_NAMESPACE_DOMAIN = b"sglang-cache-namespace-v1"


def page_keys(token_ids: Sequence[int], page_size: int, prior_hash: str | None = None) -> list[str]:
    """SGLang's key of each full page of ``token_ids``, chained from ``prior_hash`` (hex)."""
    return page_hashes(token_ids, page_size, seed=prior_hash or "")


def namespace_seed(extra_key: str | None, cache_salt: str | None) -> str | None:
    """The prior hash SGLang starts a request's chain from (``storage_namespace_seed``)."""
    if extra_key is None and cache_salt is None:
        return None
    digest = hashlib.sha256(_NAMESPACE_DOMAIN)
    for part in (extra_key, cache_salt):
        if part is None:
            digest.update(b"\x00")
            continue
        encoded = part.encode("utf-8")
        digest.update(b"\x01" + len(encoded).to_bytes(8, "little") + encoded)
    return digest.hexdigest()


@dataclass(frozen=True)
class PageKeys:
    """Redis key names of one namespace and TP rank."""

    prefix: str
    namespace: str
    tp_rank: int
    tp_size: int

    def __post_init__(self) -> None:
        for name, value in (("prefix", self.prefix), ("namespace", self.namespace)):
            if not value or any(c in value for c in ": \n"):
                raise ValueError(f"{name} must be non-empty without ':' or spaces, got {value!r}")
        if not 0 <= self.tp_rank < self.tp_size:
            raise ValueError(f"TP rank {self.tp_rank} outside [0, {self.tp_size})")

    @property
    def _rank(self) -> str:
        return f"r{self.tp_rank}of{self.tp_size}"

    def page(self, page_key: str) -> str:
        return f"{self.prefix}:hicache:{self.namespace}:{self._rank}:{page_key}"

    @property
    def geometry(self) -> str:
        return f"{self.prefix}:hicache:{self.namespace}:geometry:{self._rank}"

    def rank(self, tp_rank: int) -> PageKeys:
        return PageKeys(self.prefix, self.namespace, tp_rank, self.tp_size)
