"""PageStore: canonical KV pages in Redis, written and read by SGLang (through ``HeteroFoldHiCache``)
and by the gateway (``engines/sglang.py``).

Each page is one Redis string: a 72-byte header (magic, version, dtype, shape [2, L, P, H, D], sha256
of the body) then the tensor bytes. A page whose checksum fails reads as missing and is deleted.
Pages carry a TTL; point the page store at a Redis with ``maxmemory`` and ``allkeys-lru`` (compose
does) to bound it. Methods block; Redis errors become ``StoreError`` (``store.connection``).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

import redis
import torch

from heterofold.kv import KVCache
from store.connection import redis_errors
from store.errors import BadRequest, StoreError
from store.hicache.layout import PageGeometry, kv_to_pages, pages_to_kv, rank_heads
from store.hicache.page_keys import PageKeys, page_keys

_MAGIC = b"HFPG"
_VERSION = 1
_HEADER = struct.Struct("<4sH2x8s5I4x32s")  # magic, version, dtype name, shape, sha256 of the body
DEFAULT_TTL_S = 24 * 3600


def encode_page(page: torch.Tensor) -> bytes:
    """A canonical page [2, L, P, H, D] as bytes."""
    if page.dim() != 5 or page.shape[0] != 2:
        raise BadRequest(f"a canonical page is [2, L, P, H, D], got {tuple(page.shape)}")
    body = page.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    dtype = str(page.dtype).removeprefix("torch.").encode()
    return _HEADER.pack(_MAGIC, _VERSION, dtype, *page.shape, hashlib.sha256(body).digest()) + body


def decode_page(data: bytes) -> torch.Tensor | None:
    """Inverse of ``encode_page``; None for bytes that are not an intact page."""
    if len(data) < _HEADER.size:
        return None
    magic, version, dtype_name, *rest = _HEADER.unpack_from(data)
    shape, digest = rest[:5], rest[5]
    body = data[_HEADER.size :]
    if magic != _MAGIC or version != _VERSION or hashlib.sha256(body).digest() != digest:
        return None
    dtype = getattr(torch, dtype_name.rstrip(b"\x00").decode(), None)
    if not isinstance(dtype, torch.dtype):
        return None
    flat = torch.frombuffer(bytearray(body), dtype=torch.uint8)
    if flat.numel() != dtype.itemsize * shape[0] * shape[1] * shape[2] * shape[3] * shape[4]:
        return None
    return flat.view(dtype).reshape(shape)


class PageStore:
    """Pages of one namespace (served model) and TP size; ``keys.tp_rank`` is the rank this
    instance reads and writes by default (an SGLang backend is one rank; the gateway all).
    The gateway's half is the SGLang engine's page sink (``engines.page_sink.PageSink``)."""

    errors: tuple[type[Exception], ...] = (StoreError,)

    def __init__(self, client: redis.Redis, keys: PageKeys, ttl_s: int = DEFAULT_TTL_S) -> None:
        self.client = client
        self.keys = keys
        self.ttl_s = ttl_s

    @property
    def tp_size(self) -> int:
        return self.keys.tp_size

    # ---- one rank: what SGLang's backend calls --------------------------------------------

    def exists(self, page_keys_: Sequence[str], rank: int | None = None) -> int:
        """How many of ``page_keys_``, from the first, are stored (for ``rank``)."""
        k = self.keys if rank is None else self.keys.rank(rank)
        if not page_keys_:
            return 0
        with redis_errors("hicache exists"):
            pipe = self.client.pipeline(transaction=False)
            for key in page_keys_:
                pipe.exists(k.page(key))
            found = pipe.execute()
        for i, present in enumerate(found):
            if not present:
                return i
        return len(page_keys_)

    def get(self, page_keys_: Sequence[str], rank: int | None = None) -> list[torch.Tensor | None]:
        """Canonical pages, None for each missing or corrupt one (a corrupt one is deleted)."""
        k = self.keys if rank is None else self.keys.rank(rank)
        if not page_keys_:
            return []
        names = [k.page(key) for key in page_keys_]
        with redis_errors("hicache get"):
            raw = self.client.mget(names)
        out: list[torch.Tensor | None] = []
        corrupt = []
        for name, data in zip(names, raw, strict=True):
            page = decode_page(data) if isinstance(data, bytes) else None
            if data is not None and page is None:
                corrupt.append(name)
            out.append(page)
        if corrupt:
            with redis_errors("hicache drop corrupt"):
                self.client.delete(*corrupt)
        return out

    def set(self, page_keys_: Sequence[str], pages: Sequence[torch.Tensor], rank: int | None = None) -> None:
        k = self.keys if rank is None else self.keys.rank(rank)
        if len(page_keys_) != len(pages):
            raise BadRequest(f"{len(page_keys_)} keys for {len(pages)} pages")
        with redis_errors("hicache set"):
            pipe = self.client.pipeline(transaction=False)
            for key, page in zip(page_keys_, pages, strict=True):
                pipe.set(k.page(key), encode_page(page), ex=self.ttl_s)
            pipe.execute()

    def touch(self, page_keys_: Sequence[str], rank: int | None = None) -> None:
        k = self.keys if rank is None else self.keys.rank(rank)
        with redis_errors("hicache touch"):
            pipe = self.client.pipeline(transaction=False)
            for key in page_keys_:
                pipe.expire(k.page(key), self.ttl_s)
            pipe.execute()

    def publish_geometry(self, geometry: PageGeometry) -> None:
        with redis_errors("hicache geometry"):
            self.client.set(self.keys.rank(geometry.tp_rank).geometry, geometry.to_json(), ex=self.ttl_s)

    def geometry(self, rank: int = 0) -> PageGeometry | None:
        """What the SGLang rank published when its host pool registered; None before that."""
        with redis_errors("hicache geometry"):
            text = self.client.get(self.keys.rank(rank).geometry)
        return None if text is None else PageGeometry.from_json(text)

    # ---- every rank: what the gateway calls --------------------------------------------------

    def implied_geometry(self, kv: KVCache, *, layout: str, page_size: int, dtype: str) -> PageGeometry:
        """Rank 0's geometry for ``kv``'s model on a server with this host ``layout``, ``page_size``
        and KV ``dtype``, split over this store's TP size: what a backend publishes once it runs."""
        if not kv.keys:
            raise BadRequest("a value with no layers has no pages")
        H, _, D = kv.keys[0].shape  # (H_kv, T, D)
        a, b = rank_heads(H, self.keys.tp_size, 0)
        return PageGeometry(layout, kv.num_layers, b - a, D, page_size, dtype, 0, self.keys.tp_size)

    def put_kv(self, kv: KVCache, *, layout: str, page_size: int, dtype: str, prior_hash: str | None = None) -> int:
        """Write every full page of ``kv`` for every rank, under the pages' SGLang keys; returns the
        tokens written. The geometry (page size, dtype, heads per rank) is rank 0's as its backend
        published it, else ``implied_geometry``."""
        geometry = self.geometry(0) or self.implied_geometry(kv, layout=layout, page_size=page_size, dtype=dtype)
        P, tp = geometry.page_size, self.keys.tp_size
        pages = kv_to_pages(kv, P, tp, geometry.torch_dtype)
        if not pages:
            return 0
        if pages[0][0].shape[1:] != geometry.canonical_shape[1:]:
            raise BadRequest(f"the value's pages {tuple(pages[0][0].shape)} do not fit {geometry}")
        names = page_keys(kv.token_ids.tolist()[: len(pages) * P], P, prior_hash)
        for rank in range(tp):
            self.set(names, [page[rank] for page in pages], rank)
        return len(pages) * P

    def get_kv(
        self, token_ids: Sequence[int], page_size: int, *, fingerprint: str, num_kv_heads: int,
        prior_hash: str | None = None,
    ) -> KVCache | None:  # fmt: skip
        """The value for the longest prefix of ``token_ids`` whose pages every rank holds."""
        names = page_keys(token_ids, page_size, prior_hash)
        n = min((self.exists(names, r) for r in range(self.keys.tp_size)), default=0)
        if n == 0:
            return None
        per_rank = [self.get(names[:n], r) for r in range(self.keys.tp_size)]
        pages = []
        for i in range(n):
            row = [per_rank[r][i] for r in range(self.keys.tp_size)]
            if any(p is None for p in row):
                break  # evicted or corrupt since exists()
            pages.append([p for p in row if p is not None])
        if not pages:
            return None
        ids = list(token_ids)[: len(pages) * page_size]
        return pages_to_kv(pages, ids, fingerprint=fingerprint, num_kv_heads=num_kv_heads)
