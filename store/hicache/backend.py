"""HeteroFoldHiCache: the HiCache L3 storage backend SGLang loads from this module.

    python -m sglang.launch_server ... --page-size 64 --enable-hierarchical-cache \\
        --hicache-storage-backend dynamic --hicache-storage-backend-extra-config '{
            "backend_name": "heterofold", "module_path": "store.hicache.backend",
            "class_name": "HeteroFoldHiCache", "namespace": "qwen2.5-0.5b",
            "redis_url": "redis://hicache-redis:6379/0"}'

SGLang's factory calls ``HeteroFoldHiCache(storage_config, kwargs)`` and then
``register_mem_pool_host(host_pool)``. Extra-config keys of ours: ``namespace`` (default: SGLang's
model name; the gateway's engine settings name the same), ``redis_url`` (default
``$HETEROFOLD_HICACHE_REDIS_URL``), ``key_prefix`` (``hf``), ``ttl_s``. With ``"interface_v1": 1``
SGLang calls the ``_v1`` methods instead of ``batch_get``/``batch_set``.

Pages SGLang writes through (``batch_set``) are stored as canonical pages under their SGLang keys:
the gateway reads them back as the sender's KV value. Pages the gateway wrote (a transferred KV
value under the receiver's keys) answer ``batch_exists`` and ``batch_get``, so SGLang loads them
instead of prefilling. Only MHA pools with one pipeline stage and no context parallelism are served;
store failures are logged and answered as misses, never raised into SGLang's threads.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

import torch

from store.connection import connect
from store.errors import StoreError
from store.hicache.layout import PageGeometry
from store.hicache.page_keys import PageKeys
from store.hicache.page_store import DEFAULT_TTL_S, PageStore

if TYPE_CHECKING:
    from store.hicache.interface import HiCacheStorageMirror as _Base
else:
    try:  # inside SGLang: its own class, which the factory requires
        from sglang.srt.mem_cache.hicache_storage import HiCacheStorage as _Base
    except ImportError:
        from store.hicache.interface import HiCacheStorageMirror as _Base

log = logging.getLogger(__name__)
REDIS_URL_ENV = "HETEROFOLD_HICACHE_REDIS_URL"


class HeteroFoldHiCache(_Base):
    def __init__(self, storage_config: Any, kwargs: Any = None) -> None:
        extra = dict(storage_config.extra_config or {})
        if storage_config.is_mla_model:
            raise ValueError("HeteroFoldHiCache serves MHA models only")
        if storage_config.pp_size > 1 or getattr(storage_config, "attn_cp_size", 1) > 1:
            raise ValueError("HeteroFoldHiCache serves one pipeline stage without context parallelism")
        namespace = str(extra.get("namespace") or storage_config.model_name or "").replace("/", "--")
        redis_url = extra.get("redis_url") or os.environ.get(REDIS_URL_ENV)
        if not namespace or not redis_url:
            raise ValueError(f"HeteroFoldHiCache needs a namespace and a redis_url (extra config or ${REDIS_URL_ENV})")
        self.tp_rank, self.tp_size = int(storage_config.tp_rank), int(storage_config.tp_size)
        keys = PageKeys(str(extra.get("key_prefix", "hf")), namespace, self.tp_rank, self.tp_size)
        client = connect(str(redis_url), connect_timeout_s=1.0, socket_timeout_s=5.0)
        self.pages = PageStore(client, keys, int(extra.get("ttl_s", DEFAULT_TTL_S)))
        self.geometry: PageGeometry | None = None
        self.stats = {"exists_pages": 0, "pages_read": 0, "pages_written": 0, "errors": 0}

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        super().register_mem_pool_host(mem_pool_host)
        self.geometry = PageGeometry.of_host_pool(mem_pool_host, tp_rank=self.tp_rank, tp_size=self.tp_size)
        try:
            self.pages.publish_geometry(self.geometry)
        except StoreError as exc:  # the gateway retries reading it; pages still work
            log.warning("HeteroFoldHiCache: geometry not published: %s", exc)

    # ---- queries -------------------------------------------------------------------------

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    def batch_exists(self, keys: list[str], extra_info: Any | None = None) -> int:
        try:
            n = self.pages.exists(keys)
        except StoreError as exc:
            return self._failed("batch_exists", exc, 0)
        self.stats["exists_pages"] += n
        return n

    # ---- reads: stored canonical page -> this pool's flat page ---------------------------

    def get(self, key: str, target_location: Any | None = None, target_sizes: Any | None = None) -> torch.Tensor | None:
        out = self.batch_get([key], None if target_location is None else [target_location])
        return out[0] if isinstance(out, list) else None

    def batch_get(
        self, keys: list[str], target_locations: Any | None = None, target_sizes: Any | None = None
    ) -> list[torch.Tensor | None]:
        flats = self._read(keys)
        targets = list(target_locations) if target_locations is not None else [None] * len(keys)
        out: list[torch.Tensor | None] = []
        for flat, target in zip(flats, targets, strict=True):
            if flat is not None and target is not None:
                target.copy_(flat.view(target.shape))
                flat = target
            out.append(flat)
        return out

    def batch_get_v1(self, keys: list[str], host_indices: torch.Tensor, extra_info: Any | None = None) -> list[bool]:
        flats, done = self._read(keys), []
        for i, flat in enumerate(flats):
            if flat is None:
                done.append(False)
                continue
            self.mem_pool_host.set_from_flat_data_page(int(host_indices[i * self._page_size]), flat)
            done.append(True)
        return done

    def _read(self, keys: list[str]) -> list[torch.Tensor | None]:
        if self.geometry is None:
            return [None] * len(keys)
        try:
            pages = self.pages.get(keys)
        except StoreError as exc:
            return self._failed("batch_get", exc, [None] * len(keys))
        geometry, out = self.geometry, []
        for page in pages:
            if page is not None and tuple(page.shape) != geometry.canonical_shape:
                log.warning("HeteroFoldHiCache: page %s does not fit %s", tuple(page.shape), geometry)
                page = None
            out.append(None if page is None else geometry.from_canonical(page))
        self.stats["pages_read"] += sum(p is not None for p in out)
        return out

    # ---- writes: this pool's flat page -> stored canonical page --------------------------

    def set(
        self, key: str, value: Any | None = None, target_location: Any | None = None, target_sizes: Any | None = None
    ) -> bool:
        return self.batch_set([key], [value])

    def batch_set(
        self,
        keys: list[str],
        values: Any | None = None,
        target_locations: Any | None = None,
        target_sizes: Any | None = None,
    ) -> bool:
        if self.geometry is None or values is None:
            return False
        return all(self._write(keys, list(values)))

    def batch_set_v1(self, keys: list[str], host_indices: torch.Tensor, extra_info: Any | None = None) -> list[bool]:
        if self.geometry is None:
            return [False] * len(keys)
        P = self._page_size
        flats = [self.mem_pool_host.get_data_page(int(host_indices[i * P]), flat=True) for i in range(len(keys))]
        return self._write(keys, flats)

    def _write(self, keys: list[str], flats: list[torch.Tensor]) -> list[bool]:
        assert self.geometry is not None
        geometry = self.geometry
        try:
            # Always written, even over a page the gateway put there: SGLang's own pages are native
            # KV, better than a mapped value under the same key.
            self.pages.set(keys, [geometry.to_canonical(f) for f in flats])
        except StoreError as exc:
            return self._failed("batch_set", exc, [False] * len(keys))
        self.stats["pages_written"] += len(keys)
        return [True] * len(keys)

    @property
    def _page_size(self) -> int:
        return self.geometry.page_size if self.geometry is not None else 1

    def _failed(self, what: str, exc: StoreError, answer: Any) -> Any:
        self.stats["errors"] += 1
        log.warning("HeteroFoldHiCache %s failed: %s", what, exc)
        return answer

    def clear(self) -> None:
        return None  # pages expire; other engines and the gateway share the namespace

    def get_stats(self) -> Any:
        return dict(self.stats)

    def close(self) -> None:
        self.pages.client.close()
