"""The event stream the dashboard reads."""

from collections.abc import Callable

from store.kv_store import KVStore

from .conftest import FP, make_kv

TOKENS = list(range(40, 52))


def test_events_record_store_hit_and_prefill_saved_in_order(open_store: Callable[..., KVStore]) -> None:
    store = open_store()
    scope = store.scope(FP, "t")
    handle = store.put(scope, make_kv(TOKENS)).handle_id
    match = store.lookup(scope, [*TOKENS, 0])
    assert match is not None
    store.load(match)
    store.prefill_saved(scope, match.tokens, ms=12.5)

    events = store.events.read()
    assert [e.kind for e in events] == ["kv.stored", "kv.hit", "prefill.saved"]
    stored, hit, saved = (e.fields for e in events)
    assert (stored["handle"], stored["tokens"], stored["tier"], stored["node"]) == (handle, "12", "cpu", "local")
    assert (hit["handle"], hit["tokens"]) == (handle, "12")
    assert (saved["fingerprint"], saved["tokens"], saved["ms"]) == (FP, "12", "12.5")


def test_reading_after_a_cursor_returns_only_newer_events(open_store: Callable[..., KVStore]) -> None:
    store = open_store()
    scope = store.scope(FP, "t")
    store.put(scope, make_kv(TOKENS))
    cursor = store.events.read()[-1].id
    assert store.events.read(after=cursor) == []
    store.prefill_saved(scope, 8)
    newer = store.events.read(after=cursor, block_ms=100)
    assert [e.kind for e in newer] == ["prefill.saved"]


def test_last_id_is_a_cursor_that_misses_nothing_written_after_it(open_store: Callable[..., KVStore]) -> None:
    store = open_store()
    scope = store.scope(FP, "t")
    assert store.events.last_id() == "0-0"  # empty stream
    store.put(scope, make_kv(TOKENS))
    cursor = store.events.last_id()
    assert cursor == store.events.read()[-1].id
    store.prefill_saved(scope, 8)  # written before the next read starts: a "$" read would miss it
    assert [e.kind for e in store.events.read(after=cursor, block_ms=100)] == ["prefill.saved"]
