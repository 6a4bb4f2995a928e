"""The node lease: two live stores on one node and one Redis never both run (the second would
reconcile away the first one's index); a killed holder's lease lapses; a clean close frees it."""

import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from store.errors import NodeInUse
from store.kv_store import KVStore
from store.lease import NodeLease

from .conftest import FP, make_kv

A = list(range(10, 22))


def test_a_second_store_on_the_same_node_fails_and_leaves_the_first_ones_index(
    open_store: Callable[..., KVStore], redis_url: str, key_prefix: str, tmp_path: Path
) -> None:
    first = open_store(redis_url=redis_url, key_prefix=key_prefix, node="n1", node_lease_s=0.6)
    scope = first.scope(FP, "t")
    first.put(scope, make_kv(A))
    started = time.monotonic()
    with pytest.raises(NodeInUse, match=r"'n1' is in use by .*own store\.node"):
        open_store(redis_url=redis_url, key_prefix=key_prefix, node="n1", node_lease_s=0.6, data_dir=tmp_path / "b")
    assert time.monotonic() - started >= 0.6  # it waited one lease for a dead holder's to lapse
    match = first.lookup(scope, A)  # the second store never reconciled: the first's handle is still there
    assert match is not None and match.tokens == len(A)
    # another node on the same Redis is fine
    open_store(redis_url=redis_url, key_prefix=key_prefix, node="n2", node_lease_s=0.6, data_dir=tmp_path / "c")


def test_a_closed_store_frees_its_node_at_once(
    open_store: Callable[..., KVStore], redis_url: str, key_prefix: str, tmp_path: Path
) -> None:
    first = open_store(redis_url=redis_url, key_prefix=key_prefix, node="n1", node_lease_s=30)
    first.close()
    started = time.monotonic()
    open_store(redis_url=redis_url, key_prefix=key_prefix, node="n1", node_lease_s=30)
    assert time.monotonic() - started < 10  # far less than the 30 s lease


def test_a_dead_holders_lease_lapses_and_a_live_ones_is_kept(redis_url: str, key_prefix: str) -> None:
    client = redis.Redis.from_url(redis_url)
    key = f"{key_prefix}:n1:owner"
    try:
        dead = NodeLease(client, key, "n1", ttl_s=0.5)
        dead.acquire()
        dead._stop.set()  # killed: nothing refreshes it any more
        live = NodeLease(client, key, "n1", ttl_s=0.5)
        live.acquire(wait_s=3.0)  # taken once the dead one lapsed
        time.sleep(1.5)  # three lease lengths: the live holder's refresher keeps it
        assert client.get(key) == live.value.encode() and live.held
        with pytest.raises(NodeInUse):
            NodeLease(client, key, "n1", ttl_s=0.5).acquire(wait_s=0.5)
        live.release()
        assert client.get(key) is None
    finally:
        client.delete(key)
        client.close()
