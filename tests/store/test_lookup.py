"""Longest-prefix match, handle metadata and TTLs, tenant isolation: against the embedded Redis."""

import hashlib
from collections.abc import Callable
from pathlib import Path

import redis

from heterofold.kv import HEADER_SIZE, header_digest
from store.kv_store import KVStore

from .conftest import FP, OTHER_FP, Clock, assert_same, make_kv

PREFIX = list(range(100, 132))  # 32 tokens: 8 pages of 4


def test_lookup_finds_the_longest_cached_page_aligned_prefix(open_store: Callable[..., KVStore]) -> None:
    store = open_store()
    scope = store.scope(FP, "t")
    short, long = make_kv(PREFIX[:8], seed=1), make_kv(PREFIX[:22], seed=2)
    assert store.put(scope, short).indexed_tokens == 8
    assert store.put(scope, long).indexed_tokens == 20  # 22 tokens: the last full page ends at 20

    match = store.lookup(scope, [*PREFIX, 7, 7])
    assert match is not None and match.tokens == 20 and match.meta.tokens == 22
    diverges_in_page_3 = [*PREFIX[:9], 1, *PREFIX[10:]]
    match = store.lookup(scope, diverges_in_page_3)
    assert match is not None and match.tokens == 8
    assert store.lookup(scope, [1, *PREFIX[1:]]) is None
    assert store.lookup(scope, PREFIX[:3]) is None  # no full page to match


def test_loaded_value_is_cut_to_the_matched_prefix(open_store: Callable[..., KVStore]) -> None:
    store = open_store()
    scope = store.scope(FP, "t")
    kv = make_kv(PREFIX[:22])
    store.put(scope, kv)
    match = store.lookup(scope, [*PREFIX[:13], 9, 9, 9])
    assert match is not None and match.tokens == 12
    assert_same(store.load(match), kv.truncate(12))


def test_sliding_window_value_is_indexed_only_where_it_can_be_cut(open_store: Callable[..., KVStore]) -> None:
    store = open_store()
    scope = store.scope(FP, "t")
    sliding = make_kv(PREFIX[:16], windows=(0, 6))  # the sliding layer keeps the last 5 tokens
    result = store.put(scope, sliding)
    assert result.outcome == "stored" and result.indexed_tokens == 16
    assert store.lookup(scope, [*PREFIX[:12], 0, 0, 0, 0]) is None  # 12 tokens cannot be cut out
    match = store.lookup(scope, [*PREFIX[:16], 0])
    assert match is not None and match.tokens == 16

    ragged = make_kv(PREFIX[:18], windows=(0, 6))  # no page boundary it can be cut at
    skipped = store.put(scope, ragged)
    assert skipped.outcome == "skipped" and skipped.indexed_tokens == 0


def test_handle_metadata_records_tier_checksum_times_and_hits(open_store: Callable[..., KVStore], clock: Clock) -> None:
    store = open_store(cpu_budget=0)  # straight to SSD, where the payload is serialized
    scope = store.scope(FP, "t")
    kv = make_kv(PREFIX[:10])
    created = clock()
    store.put(scope, kv)
    clock.tick(5)
    for _ in range(2):
        match = store.lookup(scope, PREFIX)
        assert match is not None
        store.load(match)
    meta = store.index.get(match.meta.handle_id)
    assert meta is not None
    assert (meta.tokens, meta.tier, meta.hits) == (10, "ssd", 2)
    blob = Path(meta.location).read_bytes()
    assert meta.nbytes == len(blob) and meta.location.endswith(".kv")
    # The header's sha256, over the body; serialization is deterministic, so it names the value.
    assert meta.checksum == header_digest(blob).hex() == hashlib.sha256(blob[HEADER_SIZE:]).hexdigest()
    assert blob == kv.to_bytes()
    assert meta.created == created and meta.last_access == created + 5
    assert len(meta.pages) == 2


def test_every_key_the_store_writes_has_a_ttl(open_store: Callable[..., KVStore]) -> None:
    store = open_store(ttl_s=3600)
    scope = store.scope(FP, "t")
    store.put(scope, make_kv(PREFIX[:8]))
    match = store.lookup(scope, PREFIX)
    assert match is not None
    store.load(match)
    keys = store.index.keys
    written = [keys.handle(match.meta.handle_id), keys.lru, keys.usage, keys.events]
    written += [keys.page(scope.key, h) for h in match.meta.pages]
    client = redis.Redis.from_url(store.redis_url)
    ttls = [client.ttl(k) for k in written]
    client.close()
    assert all(0 < t <= 3600 for t in ttls), dict(zip(written, ttls, strict=True))


def test_one_tenants_kv_is_never_matched_for_another(open_store: Callable[..., KVStore]) -> None:
    store = open_store()
    alice, bob = store.scope(FP, "alice"), store.scope(FP, "bob")
    store.put(alice, make_kv(PREFIX[:16]))
    assert store.lookup(bob, PREFIX) is None
    assert store.lookup(store.scope(FP, ""), PREFIX) is None
    match = store.lookup(alice, PREFIX)
    assert match is not None and match.tokens == 16

    bob_value = make_kv(PREFIX[:16], seed=9)
    assert store.put(bob, bob_value).outcome == "stored"  # the same tokens are a new value for bob
    bob_match = store.lookup(bob, PREFIX)
    assert bob_match is not None and bob_match.meta.handle_id != match.meta.handle_id
    assert_same(store.load(bob_match), bob_value)


def test_another_models_kv_is_never_matched(open_store: Callable[..., KVStore]) -> None:
    store = open_store()
    store.put(store.scope(FP, "t"), make_kv(PREFIX[:16]))
    assert store.lookup(store.scope(OTHER_FP, "t"), PREFIX) is None


def test_storing_the_same_value_twice_keeps_one_handle(open_store: Callable[..., KVStore]) -> None:
    store = open_store()
    scope = store.scope(FP, "t")
    first = store.put(scope, make_kv(PREFIX[:8]))
    again = store.put(scope, make_kv(PREFIX[:8]))
    assert (first.outcome, again.outcome) == ("stored", "exists")
    assert first.handle_id == again.handle_id
    assert [u.entries for u in store.usage()] == [1, 0]
