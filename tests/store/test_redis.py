"""The embedded Redis, a configured URL, Redis going away and coming back."""

import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from store.errors import StoreUnavailable
from store.kv_store import KVStore
from store.payload import Payload
from store.redis_server import EmbeddedRedis
from store.tier import Stored

from .conftest import FP, assert_same, make_kv

A, B = list(range(10, 22)), list(range(50, 62))


def port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_embedded_redis_runs_on_loopback_under_the_data_dir_and_stops(
    open_store: Callable[..., KVStore], tmp_path: Path
) -> None:
    store = open_store()
    client = redis.Redis.from_url(store.redis_url)
    assert store.redis_url.startswith("redis://127.0.0.1:")
    assert client.config_get("bind")["bind"] == "127.0.0.1"
    assert Path(client.config_get("dir")["dir"]) == tmp_path / "redis"
    client.close()
    port = int(store.redis_url.rsplit(":", 1)[1].split("/")[0])
    assert port_open(port)
    store.close()
    assert not port_open(port)
    assert (tmp_path / "redis" / "appendonly.aof").is_file()


def test_store_uses_a_configured_redis_url(
    open_store: Callable[..., KVStore], redis_url: str, key_prefix: str, tmp_path: Path
) -> None:
    store = open_store(redis_url=redis_url, key_prefix=key_prefix)
    assert not (tmp_path / "redis").exists()  # nothing embedded was started
    scope = store.scope(FP, "t")
    kv = make_kv(A)
    handle = store.put(scope, kv).handle_id
    match = store.lookup(scope, [*A, 1])
    assert match is not None and match.tokens == 12
    assert_same(store.load(match), kv)
    client = redis.Redis.from_url(redis_url)
    assert client.exists(f"{key_prefix}:local:handle:{handle}")
    client.close()
    other_node = open_store(redis_url=redis_url, key_prefix=key_prefix, node="other", data_dir=tmp_path / "n2")
    assert other_node.lookup(scope, A) is None  # its payloads are this node's memory and disk


def test_unreachable_redis_fails_fast_with_a_typed_error(open_store: Callable[..., KVStore]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed_port = s.getsockname()[1]  # nothing listens once the socket closes
    with pytest.raises(StoreUnavailable):
        open_store(redis_url=f"redis://127.0.0.1:{closed_port}/0")


@pytest.fixture
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedis]:
    """A redis-server of this test's own, to stop and start (never the machine's shared one)."""
    with EmbeddedRedis(tmp_path_factory.mktemp("redis")) as s:
        yield s


def test_operations_fail_fast_while_redis_is_down_and_leave_no_payload(
    open_store: Callable[..., KVStore], server: EmbeddedRedis
) -> None:
    store = open_store(redis_url=server.url)
    scope = store.scope(FP, "t")
    store.put(scope, make_kv(A))
    match = store.lookup(scope, A)
    assert match is not None
    server.stop()
    with pytest.raises(StoreUnavailable):
        store.lookup(scope, A)
    with pytest.raises(StoreUnavailable):
        store.put(scope, make_kv(B))
    with pytest.raises(StoreUnavailable):
        store.load(match)
    assert [u.entries for u in store.usage()] == [1, 0]  # B was not left behind unindexed


def test_redis_restart_in_the_middle_of_a_put(
    open_store: Callable[..., KVStore], server: EmbeddedRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store(redis_url=server.url)
    scope = store.scope(FP, "t")
    kv_a, kv_b = make_kv(A), make_kv(B, seed=1)
    store.put(scope, kv_a)
    place_in_cpu = store.tiers.cpu.put

    def redis_dies_while_placing(handle_id: str, payload: Payload) -> Stored:
        server.stop()  # after the lookup for an existing handle, before the handle is indexed
        return place_in_cpu(handle_id, payload)

    monkeypatch.setattr(store.tiers.cpu, "put", redis_dies_while_placing)
    with pytest.raises(StoreUnavailable):
        store.put(scope, kv_b)
    monkeypatch.undo()
    assert [u.entries for u in store.usage()] == [1, 0]

    server.start()  # same port, same append-only log
    match = store.lookup(scope, A)
    assert match is not None
    assert_same(store.load(match), kv_a)
    assert store.lookup(scope, B) is None
    assert store.put(scope, kv_b).outcome == "stored"
    assert store.lookup(scope, B) is not None


def test_redis_restarted_without_its_data_leaves_a_working_store(
    open_store: Callable[..., KVStore], server: EmbeddedRedis
) -> None:
    store = open_store(redis_url=server.url, cpu_budget=2 * 1600)
    scope = store.scope(FP, "t")
    store.put(scope, make_kv(A))
    server.stop()
    (server.dir / "appendonly.aof").unlink()
    server.start()
    assert store.lookup(scope, A) is None
    assert store.put(scope, make_kv(A)).outcome == "stored"  # the unindexed old copy is replaced
    for i in range(4):
        store.put(scope, make_kv([i, *B[1:]], seed=i))  # the orphans go first when room is needed
        assert all(u.used <= u.budget for u in store.usage())


def test_partial_handle_hash_is_dropped_at_start_instead_of_crashing(open_store) -> None:  # type: ignore[no-untyped-def]
    store = open_store()
    keys, client = store.index.keys, store.index.client
    client.hset(keys.handle("ghost"), mapping={"last_access": "1.0"})
    client.zadd(keys.lru, {"ghost": 1.0})
    store.close()
    again = open_store()
    assert again.index.handles() == []
    assert not again.index.client.exists(keys.handle("ghost"))
