"""Store fixtures. Every test runs against a real redis-server: by default the embedded one each
store starts under its own data directory; ``redis_url`` gives the machine's Redis on
127.0.0.1:6379 when it answers (keys under a unique prefix, removed afterwards), else a
redis-server this fixture starts."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import redis
import torch

from heterofold.kv import KVCache
from store.config import StoreConfig
from store.kv_store import KVStore
from store.redis_server import EmbeddedRedis

FP = "a" * 64
OTHER_FP = "b" * 64


def make_kv(
    tokens: Sequence[int],
    fingerprint: str = FP,
    windows: tuple[int, ...] = (0, 0),
    H: int = 2,
    D: int = 4,
    seed: int = 0,
) -> KVCache:
    """A small synthetic value: 2 layers of (H, T, D) float32 by default, 128 bytes per token."""
    g = torch.Generator().manual_seed(seed)
    T = len(tokens)
    keys, values = [], []
    for w in windows:
        t = T if w == 0 else min(T, w - 1)
        keys.append(torch.randn(H, t, D, generator=g))
        values.append(torch.randn(H, t, D, generator=g))
    return KVCache(fingerprint, torch.tensor(list(tokens)), torch.arange(T), tuple(keys), tuple(values), windows)


def assert_same(a: KVCache, b: KVCache) -> None:
    assert a.fingerprint == b.fingerprint and a.windows == b.windows
    assert torch.equal(a.token_ids, b.token_ids) and torch.equal(a.positions, b.positions)
    for x, y in zip(a.keys + a.values, b.keys + b.values, strict=True):
        assert torch.equal(x, y)


class Clock:
    """A clock the test moves, so that LRU order never depends on how fast the machine is."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def tick(self, seconds: float = 1.0) -> float:
        self.now += seconds
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def open_store(tmp_path: Path, clock: Clock) -> Iterator[Callable[..., KVStore]]:
    """Opens stores on ``tmp_path`` (page size 4, embedded Redis unless ``redis_url`` is given);
    every store still open at the end is closed."""
    opened: list[KVStore] = []

    def open_(devices: Sequence[Any] = (), **overrides: Any) -> KVStore:
        fields: dict[str, Any] = {"data_dir": tmp_path, "page_size": 4, "cpu_budget": 1 << 20, "ssd_budget": 1 << 22}
        fields.update(overrides)
        store = KVStore(StoreConfig(**fields), devices=devices, clock=clock)
        opened.append(store)
        return store

    yield open_
    for store in opened:
        store.close()


@pytest.fixture
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    shared = "redis://127.0.0.1:6379/0"
    client = redis.Redis.from_url(shared, socket_connect_timeout=0.2)
    try:
        client.ping()
    except redis.exceptions.ConnectionError:
        with EmbeddedRedis(tmp_path_factory.mktemp("redis")) as server:
            yield server.url
        return
    finally:
        client.close()
    yield shared


@pytest.fixture
def key_prefix(redis_url: str) -> Iterator[str]:
    """A prefix no other test or user of a shared Redis has; its keys are deleted afterwards.
    The test-only SCAN is confined to this prefix."""
    prefix = f"hftest-{uuid.uuid4().hex[:12]}"
    yield prefix
    client = redis.Redis.from_url(redis_url)
    try:
        for key in client.scan_iter(match=f"{prefix}:*", count=500):
            client.delete(key)
    finally:
        client.close()
