"""KV identity: which cached prefix a token sequence names, for which model and tenant.

The prefix-hash chain is SGLang HiCache's (``get_hash_str`` in ``mem_cache``): page ``i`` hashes to
``sha256(digest_{i-1} || token ids of page i as uint32 little-endian)``. The first page chains onto
a seed instead of nothing; the seed is a digest of (model fingerprint, tenant salt, page size), so
the same tokens under another model or tenant give unrelated hashes. With ``seed=""`` the chain is
SGLang's exactly, which is what an SGLang HiCache backend will need.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from store.errors import BadRequest

_SEED_DOMAIN = b"heterofold.kv.chain.v1\x00"
_UINT32_MAX = 2**32 - 1


def page_hashes(
    token_ids: Sequence[int] | np.ndarray, page_size: int, seed: str = "", partial: bool = False
) -> list[str]:
    """Hex digest of each page of ``token_ids``, chained from ``seed`` (hex; empty for none).

    Only full pages are hashed unless ``partial``, in which case a shorter last page is hashed
    too: a lookup must never hash a cut page, or one prefix would hash differently depending on
    where the sequence happened to end.
    """
    if page_size < 1:
        raise ValueError(f"page size must be positive, got {page_size}")
    ids = np.asarray(token_ids, dtype=np.int64)
    if ids.ndim != 1:
        raise BadRequest(f"token ids must be one sequence, got shape {ids.shape}")
    if ids.size and (ids.min() < 0 or ids.max() > _UINT32_MAX):
        raise BadRequest("token ids must fit in uint32")
    raw = ids.astype("<u4").tobytes()  # the same bytes as SGLang's per-token to_bytes(4, "little")
    step = 4 * page_size
    end = len(raw) if partial else len(raw) - len(raw) % step
    prior = bytes.fromhex(seed)
    out: list[str] = []
    for start in range(0, end, step):
        digest = hashlib.sha256(prior + raw[start : start + step]).digest()
        out.append(digest.hex())
        prior = digest
    return out


@dataclass(frozen=True)
class Scope:
    """Everything besides the tokens that makes two caches different: model and tenant, and the
    page size that decides how the chain is cut."""

    fingerprint: str
    tenant_salt: str
    page_size: int

    def __post_init__(self) -> None:
        if not self.fingerprint:
            raise ValueError("a scope needs a model fingerprint")
        if not 1 <= self.page_size <= 1 << 16:
            raise ValueError(f"page size must be within [1, 65536], got {self.page_size}")

    @property
    def seed(self) -> str:
        """Hex digest the first page chains onto."""
        h = hashlib.sha256(_SEED_DOMAIN)
        for part in (self.fingerprint, self.tenant_salt):
            data = part.encode()
            h.update(struct.pack("<I", len(data)) + data)  # length-prefixed: no ambiguous joins
        h.update(struct.pack("<I", self.page_size))
        return h.hexdigest()

    @property
    def key(self) -> str:
        """Short digest naming this scope in Redis keys; the salt itself never leaves the process."""
        return hashlib.sha256(bytes.fromhex(self.seed)).hexdigest()[:32]

    def pages(self, token_ids: Sequence[int] | np.ndarray) -> list[str]:
        """Chain hash after each full page of ``token_ids``."""
        return page_hashes(token_ids, self.page_size, self.seed)

    def identity(self, token_ids: Sequence[int] | np.ndarray) -> KVIdentity:
        """Identity of the value for exactly ``token_ids`` (a short last page is part of it)."""
        chain = page_hashes(token_ids, self.page_size, self.seed, partial=True)
        if not chain:
            raise BadRequest("an empty token sequence has no KV identity")
        return KVIdentity(self.fingerprint, self.tenant_salt, chain[-1], self.page_size)


@dataclass(frozen=True)
class KVIdentity:
    """One cached value: model fingerprint, tenant salt, the chain hash of its last (possibly
    short) page, and the page size. Equal identities name interchangeable values."""

    fingerprint: str
    tenant_salt: str
    chain_hash: str
    page_size: int

    @property
    def scope(self) -> Scope:
        return Scope(self.fingerprint, self.tenant_salt, self.page_size)

    @property
    def handle_id(self) -> str:
        """The handle's name in the index: the chain hash is already seeded by the scope, and the
        scope key is added so that a collision would need both to match."""
        return hashlib.sha256(f"{self.scope.key}:{self.chain_hash}".encode()).hexdigest()[:40]
