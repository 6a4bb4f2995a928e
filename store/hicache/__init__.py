"""SGLang HiCache L3 storage over our store (DESIGN.md, "SGLang").

    page_keys.py  SGLang's page keys (sha256 chain over uint32 token ids) and our Redis key names
    layout.py     SGLang host page layouts <-> canonical pages <-> the canonical KV value
    page_store.py PageStore: checksummed canonical pages in Redis, shared by SGLang and the gateway
    interface.py  a mirror of SGLang's ``HiCacheStorage`` for when SGLang is not installed
    backend.py    HeteroFoldHiCache: the class SGLang loads with ``--hicache-storage-backend dynamic``

Matched against sglang 0.5.23 (the PyPI wheel's source): ``mem_cache/hicache_storage.py``,
``mem_cache/storage/backend_factory.py``, ``mem_cache/utils.py`` and ``cpp_utils/hash_binding.cpp``,
``mem_cache/pool_host/mha.py``, ``managers/cache_controller.py``.
"""

SGLANG_VERSION = "0.5.23"
