"""HeteroFoldHiCache against SGLang's own interface: ``HiCacheStorage``, ``HiCacheStorageConfig`` and
``StorageBackendFactory`` are imported from the pinned sglang wheel (they need only torch), and the
backend is created the way SGLang creates a ``dynamic`` backend. The host pool is a stand-in
(tests/sglang/host_pool.py). Pages live in a real Redis."""

from __future__ import annotations

import inspect
import types
from typing import Any

import pytest
import redis
import torch

from heterofold.kv import KVCache
from store.hicache.interface import HiCacheStorageMirror
from store.hicache.layout import LAYOUTS, PageGeometry
from store.hicache.page_keys import PageKeys, page_keys
from store.hicache.page_store import PageStore
from tests.sglang.host_pool import HostPoolStandIn

L, H, D, P = 2, 2, 4, 4


def config(sg: types.SimpleNamespace, redis_url: str, tp_rank: int = 0, tp_size: int = 1, **extra: Any) -> Any:
    return sg.storage.HiCacheStorageConfig(
        tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1, is_mla_model=False,
        enable_storage_metrics=False, is_page_first_layout=True, model_name="org/model",
        extra_config={"backend_name": "heterofold", "module_path": "store.hicache.backend",
                      "class_name": "HeteroFoldHiCache", "redis_url": redis_url, **extra},
    )  # fmt: skip


def create(sg: types.SimpleNamespace, cfg: Any, pool: HostPoolStandIn) -> Any:
    """As SGLang's cache controller does: the factory, then register_mem_pool_host."""
    backend = sg.factory.StorageBackendFactory.create_backend("dynamic", cfg, pool)
    backend.register_mem_pool_host(pool)
    return backend


def fill(pool: HostPoolStandIn, seed: int) -> None:
    pool.kv_buffer.copy_(torch.randn(pool.kv_buffer.shape, generator=torch.Generator().manual_seed(seed)))


def test_mirror_has_sglangs_signatures(real_sglang: types.SimpleNamespace) -> None:
    real = real_sglang.storage.HiCacheStorage
    for name, ours in inspect.getmembers(HiCacheStorageMirror, inspect.isfunction):
        if name.startswith("_"):
            continue
        theirs = inspect.signature(getattr(real, name))
        mine = inspect.signature(ours)
        assert list(mine.parameters) == list(theirs.parameters), name
        assert [p.default for p in mine.parameters.values()] == [p.default for p in theirs.parameters.values()], name
    assert {n for n in real.__abstractmethods__} == set(HiCacheStorageMirror.__abstractmethods__)


def test_factory_loads_the_backend_as_a_real_hicache_storage(
    real_sglang: types.SimpleNamespace, redis_url: str
) -> None:
    pool = HostPoolStandIn("page_first", L, H, D, P, pages=4)
    backend = create(real_sglang, config(real_sglang, redis_url), pool)
    assert isinstance(backend, real_sglang.storage.HiCacheStorage)
    assert type(backend).__name__ == "HeteroFoldHiCache"


@pytest.mark.parametrize("layout", LAYOUTS)
def test_pages_written_through_are_served_back_in_any_layout(
    real_sglang: types.SimpleNamespace, redis_url: str, redis_client: redis.Redis, layout: str
) -> None:
    """batch_set from one engine's pool, then batch_exists/batch_get into another pool of another
    layout (the stored page is layout-independent), as the cache controller's generic path does."""
    writer_pool = HostPoolStandIn("page_first", L, H, D, P, pages=4)
    fill(writer_pool, 1)
    writer = create(real_sglang, config(real_sglang, redis_url), writer_pool)
    keys = page_keys(list(range(3 * P)), P)
    data = [writer_pool.get_data_page(i * P) for i in (2, 0, 1)]
    assert writer.batch_set(keys, data)

    reader_pool = HostPoolStandIn(layout, L, H, D, P, pages=4)
    reader = create(real_sglang, config(real_sglang, redis_url), reader_pool)
    info = real_sglang.storage.HiCacheStorageExtraInfo(prefix_keys=None)
    assert reader.batch_exists(keys, info) == 3
    assert reader.batch_exists([*keys[:2], "f" * 64, keys[2]]) == 2
    got = reader.batch_get(keys, [reader_pool.get_dummy_flat_data_page() for _ in keys])
    for slot, page in zip((1, 2, 3), got, strict=True):
        reader_pool.set_from_flat_data_page(slot * P, page)
    for slot, src in zip((1, 2, 3), (2, 0, 1), strict=True):
        for t in range(P):
            assert torch.equal(reader_pool.token_kv(slot * P + t), writer_pool.token_kv(src * P + t))


def test_zero_copy_v1_methods_use_host_indices(
    real_sglang: types.SimpleNamespace, redis_url: str, redis_client: redis.Redis
) -> None:
    pool = HostPoolStandIn("page_first_direct", L, H, D, P, pages=4)
    fill(pool, 2)
    backend = create(real_sglang, config(real_sglang, redis_url, interface_v1=1), pool)
    keys = page_keys(list(range(2 * P)), P)
    assert backend.batch_set_v1(keys, torch.arange(0, 2 * P)) == [True, True]
    other = HostPoolStandIn("page_first_direct", L, H, D, P, pages=4)
    backend.register_mem_pool_host(other)
    assert backend.batch_get_v1([*keys, "e" * 64], torch.arange(2 * P, 5 * P)) == [True, True, False]
    assert torch.equal(other.kv_buffer[:, 2:4], pool.kv_buffer[:, 0:2])


def test_tp_ranks_keep_their_own_pages(
    real_sglang: types.SimpleNamespace, redis_url: str, redis_client: redis.Redis
) -> None:
    pools = [HostPoolStandIn("layer_first", L, 1, D, P, pages=2) for _ in range(2)]
    backends = []
    for r, pool in enumerate(pools):
        fill(pool, 10 + r)
        backends.append(create(real_sglang, config(real_sglang, redis_url, r, 2), pool))
    keys = page_keys(list(range(P)), P)
    assert backends[0].batch_set(keys, [pools[0].get_data_page(0)])
    assert backends[1].batch_exists(keys) == 0  # rank 1 has not written its heads yet
    assert backends[1].batch_set(keys, [pools[1].get_data_page(0)])
    got = backends[1].batch_get(keys, [pools[1].get_dummy_flat_data_page()])
    assert got[0] is not None and torch.equal(got[0], pools[1].get_data_page(0))


def test_namespace_comes_from_extra_config_else_model_name(
    real_sglang: types.SimpleNamespace, redis_url: str, redis_client: redis.Redis
) -> None:
    pool = HostPoolStandIn("page_first", L, H, D, P, pages=2)
    named = create(real_sglang, config(real_sglang, redis_url, namespace="qwen"), pool)
    default = create(real_sglang, config(real_sglang, redis_url), pool)
    assert named.pages.keys.namespace == "qwen" and default.pages.keys.namespace == "org--model"
    assert PageStore(redis_client, PageKeys("hf", "qwen", 0, 1)).geometry(0) == named.geometry


def test_page_store_writes_a_value_before_any_backend_publishes_its_geometry(redis_client: redis.Redis) -> None:
    T = 2 * P + 1  # two full pages and one token over
    K, V = torch.randn(2, L, H, T, D).unbind(0)  # each (L, H, T, D)
    kv = KVCache(fingerprint="fp", token_ids=torch.arange(T), positions=torch.arange(T), keys=tuple(K.unbind(0)),
                 values=tuple(V.unbind(0)), windows=(0,) * L)  # fmt: skip
    store = PageStore(redis_client, PageKeys("hf", "fresh", 0, 2))
    assert store.geometry(0) is None
    implied = store.implied_geometry(kv, layout="page_first", page_size=P, dtype="float32")
    assert implied == PageGeometry("page_first", L, H // 2, D, P, "float32", 0, 2)
    assert store.put_kv(kv, layout="page_first", page_size=P, dtype="float32") == 2 * P
    back = store.get_kv(kv.token_ids.tolist(), P, fingerprint="fp", num_kv_heads=H)
    assert back is not None and back.num_tokens == 2 * P
    assert torch.equal(back.keys[1], kv.keys[1][:, : 2 * P]) and torch.equal(back.values[0], kv.values[0][:, : 2 * P])


def test_corrupt_pages_read_as_missing_and_are_dropped(
    real_sglang: types.SimpleNamespace, redis_url: str, redis_client: redis.Redis
) -> None:
    pool = HostPoolStandIn("page_first", L, H, D, P, pages=2)
    fill(pool, 3)
    backend = create(real_sglang, config(real_sglang, redis_url), pool)
    keys = page_keys(list(range(P)), P)
    assert backend.batch_set(keys, [pool.get_data_page(0)])
    name = backend.pages.keys.page(keys[0])
    raw = bytearray(redis_client.get(name) or b"")
    raw[-1] ^= 0xFF
    redis_client.set(name, bytes(raw))
    assert backend.batch_get(keys, [pool.get_dummy_flat_data_page()]) == [None]
    assert not redis_client.exists(name)


def test_redis_down_answers_misses_and_never_raises(real_sglang: types.SimpleNamespace, redis_url: str) -> None:
    pool = HostPoolStandIn("page_first", L, H, D, P, pages=2)
    backend = create(real_sglang, config(real_sglang, "redis://127.0.0.1:1/0"), pool)
    keys = page_keys(list(range(P)), P)
    assert backend.batch_exists(keys) == 0
    assert backend.batch_get(keys, [pool.get_dummy_flat_data_page()]) == [None]
    assert backend.batch_set(keys, [pool.get_data_page(0)]) is False
    assert backend.get_stats()["errors"] == 3


def test_mla_models_are_refused(real_sglang: types.SimpleNamespace, redis_url: str) -> None:
    cfg = config(real_sglang, redis_url)
    cfg.is_mla_model = True
    with pytest.raises(ValueError, match="MHA"):
        real_sglang.factory.StorageBackendFactory.create_backend("dynamic", cfg, None)
