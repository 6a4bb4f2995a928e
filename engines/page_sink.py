"""The page sink: the SGLang engine's side of HiCache storage, where it writes a KV value as pages for
its server to load and reads back the pages the server backed up. The gateway hands one in
(``store.hicache.page_store.PageStore`` satisfies it); the engine knows it only by this contract.

Rules every sink keeps:
- Pages are split over ``tp_size`` TP ranks, as the server splits its KV heads; the engine refuses a
  sink whose TP size is not its server's.
- Methods block (the engine calls them in a worker thread).
- A failed call raises one of ``errors``; the engine answers it as a miss (import: ``KVMismatch``,
  so the hop falls back; export: no value). Anything else is a bug and propagates.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from heterofold.kv import KVCache


class PageSink(Protocol):
    @property
    def tp_size(self) -> int:
        """The TP size the pages are split for."""
        ...

    @property
    def errors(self) -> tuple[type[Exception], ...]:
        """The exceptions a failed call raises."""
        ...

    def put_kv(self, kv: KVCache, *, layout: str, page_size: int, dtype: str) -> int:
        """Write every full page of ``kv`` for every rank under the pages' SGLang keys; returns the
        tokens written. The page geometry is the one the server's backend published, else the one
        the server's host ``layout``, ``page_size`` and KV ``dtype`` imply for ``kv``'s model."""
        ...

    def get_kv(
        self, token_ids: Sequence[int], page_size: int, *, fingerprint: str, num_kv_heads: int
    ) -> KVCache | None:
        """The value for the longest prefix of ``token_ids`` whose pages every rank holds; None
        when not even the first page is held."""
        ...
