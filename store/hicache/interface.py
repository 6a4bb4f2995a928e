"""A mirror of SGLang's ``HiCacheStorage`` (sglang 0.5.23, ``mem_cache/hicache_storage.py``): the
methods ``HeteroFoldHiCache`` implements, with SGLang's names, parameters and defaults.

Inside SGLang the backend subclasses SGLang's own class (its factory checks ``issubclass``); this
mirror is the base only where SGLang is not installed (the gateway, CPU machines).
``tests/sglang/test_backend.py`` compares these signatures with the real class from the wheel.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch


class HiCacheStorageMirror(ABC):
    """The storage contract as SGLang calls it:

    - ``batch_exists(keys)``: how many of ``keys``, from the first, are stored.
    - ``batch_get(keys, target_locations)``: one flat host page per key (written into the given
      target tensor), None for a key that cannot be read. SGLang stops at the first None.
    - ``batch_set(keys, values)``: flat host pages to store; True only if all were stored.
    - ``batch_get_v1``/``batch_set_v1``: the same through host-pool indices (``interface_v1``).
    Failures are answered, never raised: SGLang's storage threads must keep running.
    """

    mem_pool_host: Any

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        self.mem_pool_host = mem_pool_host

    def batch_get_v1(self, keys: list[str], host_indices: torch.Tensor, extra_info: Any | None = None) -> list[bool]:
        raise NotImplementedError

    def batch_set_v1(self, keys: list[str], host_indices: torch.Tensor, extra_info: Any | None = None) -> list[bool]:
        raise NotImplementedError

    @abstractmethod
    def get(
        self, key: str, target_location: Any | None = None, target_sizes: Any | None = None
    ) -> torch.Tensor | None: ...

    @abstractmethod
    def batch_get(
        self, keys: list[str], target_locations: Any | None = None, target_sizes: Any | None = None
    ) -> list[torch.Tensor | None] | int: ...

    @abstractmethod
    def set(
        self, key: str, value: Any | None = None, target_location: Any | None = None, target_sizes: Any | None = None
    ) -> bool: ...

    @abstractmethod
    def batch_set(
        self,
        keys: list[str],
        values: Any | None = None,
        target_locations: Any | None = None,
        target_sizes: Any | None = None,
    ) -> bool: ...

    @abstractmethod
    def exists(self, key: str) -> bool: ...

    def batch_exists(self, keys: list[str], extra_info: Any | None = None) -> int:
        for i, key in enumerate(keys):
            if not self.exists(key):
                return i
        return len(keys)

    def clear(self) -> None:
        return None

    def get_stats(self) -> Any:
        return None
