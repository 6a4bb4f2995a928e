"""Budgets, demotion, promotion, eviction order, pins and OOM alerts."""

import random
from collections.abc import Callable

from store.device_cache import DeviceMemory, TorchDeviceCache
from store.kv_store import KVStore

from .conftest import FP, OTHER_FP, Clock, assert_same, make_kv

TOKENS = 8  # two pages of 4
SIZE = TOKENS * 128 + TOKENS * 16  # make_kv's tensors plus token ids and positions: 1152 bytes


def tokens(i: int) -> list[int]:
    return [1000 + i, *list(range(TOKENS - 1))]


def kinds(store: KVStore) -> list[tuple[str, str]]:
    return [(e.kind, e.fields.get("reason", e.fields.get("tier", ""))) for e in store.events.read(count=1000)]


def test_budgets_hold_under_many_inserts(open_store: Callable[..., KVStore], clock: Clock) -> None:
    store = open_store(cpu_budget=5 * SIZE, ssd_budget=6 * 2200)
    scope = store.scope(FP, "t")
    rng = random.Random(0)
    for i in range(80):
        clock.tick(1)
        n = rng.choice([5, 8, 12, 16])
        store.put(scope, make_kv([2000 + i, *list(range(n - 1))], seed=i))
        if i % 3 == 0:  # some hits, so promotions and demotions interleave with inserts
            match = store.lookup(scope, [2000 + rng.randrange(i + 1), *list(range(15))])
            if match is not None:
                store.load(match)
        for usage in store.usage():
            assert usage.used <= usage.budget, usage
    cpu, ssd = store.usage()
    assert cpu.entries >= 3 and ssd.entries >= 4  # both tiers in use, not just kept empty
    assert ("kv.evicted", "budget") in kinds(store)


def test_full_cpu_tier_demotes_the_least_recent_value_to_ssd(open_store: Callable[..., KVStore], clock: Clock) -> None:
    store = open_store(cpu_budget=3 * SIZE)
    scope = store.scope(FP, "t")
    for i in range(3):
        clock.tick()
        store.put(scope, make_kv(tokens(i), seed=i))
    clock.tick()
    first = store.lookup(scope, tokens(0))
    assert first is not None
    store.load(first)  # 0 is now the most recent; 1 the least
    clock.tick()
    assert store.put(scope, make_kv(tokens(3), seed=3)).tier == "cpu"

    tiers = {i: store.lookup(scope, tokens(i)) for i in range(4)}
    assert {i: m.meta.tier for i, m in tiers.items() if m} == {0: "cpu", 1: "ssd", 2: "cpu", 3: "cpu"}
    assert ("kv.demoted", "ssd") in kinds(store)


def test_a_hit_on_ssd_promotes_the_value_back_to_cpu(open_store: Callable[..., KVStore], clock: Clock) -> None:
    store = open_store(cpu_budget=2 * SIZE)
    scope = store.scope(FP, "t")
    values = [make_kv(tokens(i), seed=i) for i in range(3)]
    for kv in values:
        clock.tick()
        store.put(scope, kv)
    match = store.lookup(scope, tokens(0))
    assert match is not None and match.meta.tier == "ssd"
    clock.tick()
    assert_same(store.load(match), values[0])
    after = store.lookup(scope, tokens(0))
    assert after is not None and after.meta.tier == "cpu" and after.meta.checksum == match.meta.checksum
    assert ("kv.promoted", "cpu") in kinds(store)
    assert [u.used <= u.budget for u in store.usage()] == [True, True]


def test_eviction_takes_the_least_recently_used_first(open_store: Callable[..., KVStore], clock: Clock) -> None:
    store = open_store(cpu_budget=3 * SIZE, ssd_budget=0)  # no SSD: leaving the CPU tier is eviction
    scope = store.scope(FP, "t")
    for i in (0, 1, 2):
        clock.tick(10)
        store.put(scope, make_kv(tokens(i), seed=i))
    for i in (0, 2):  # 1 is left the least recently used
        clock.tick(10)
        match = store.lookup(scope, tokens(i))
        assert match is not None
        store.load(match)
    clock.tick(10)
    store.put(scope, make_kv(tokens(3), seed=3))
    assert store.lookup(scope, tokens(1)) is None
    assert all(store.lookup(scope, tokens(i)) is not None for i in (0, 2, 3))
    clock.tick(10)
    store.put(scope, make_kv(tokens(4), seed=4))
    assert store.lookup(scope, tokens(0)) is None  # next least recent


def test_eviction_weighs_age_by_size(open_store: Callable[..., KVStore], clock: Clock) -> None:
    store = open_store(cpu_budget=5 * SIZE, ssd_budget=0)
    scope = store.scope(FP, "t")
    small, large = list(range(500, 508)), list(range(600, 624))  # 1 and 3 units of SIZE
    store.put(scope, make_kv(small))
    clock.tick(10)
    store.put(scope, make_kv(large))
    clock.tick(1)
    # A 2-unit value needs one unit freed. Weights (age + 1 s) x size: small (11 + 1) x 1 = 12,
    # large (1 + 1) x 3 = 6: the small, much older one goes although it is smaller.
    store.put(scope, make_kv(list(range(700, 716))))
    assert store.lookup(scope, small) is None and store.lookup(scope, large) is not None
    # Back in at the same time as the 2-unit value is 1 s old: large (1 + 1) x 3 = 6 against
    # (0 + 1) x 2 = 2 for the other: at nearly equal age, the larger goes.
    store.put(scope, make_kv(small))
    assert store.lookup(scope, large) is None
    assert store.lookup(scope, small) is not None and store.lookup(scope, list(range(700, 716))) is not None


def test_pinned_handles_are_never_demoted_or_evicted(open_store: Callable[..., KVStore], clock: Clock) -> None:
    store = open_store(cpu_budget=2 * SIZE, ssd_budget=0)
    scope = store.scope(FP, "t")
    store.put(scope, make_kv(tokens(0)))
    pinned = store.lookup(scope, tokens(0))
    assert pinned is not None
    with store.checkout(pinned) as value:
        for i in range(1, 6):
            clock.tick(100)
            assert store.put(scope, make_kv(tokens(i), seed=i)).outcome == "stored"
            still = store.lookup(scope, tokens(0))
            assert still is not None and still.meta.tier == "cpu"
        assert value.num_tokens == TOKENS
    clock.tick(100)
    store.put(scope, make_kv(tokens(6), seed=6))
    store.put(scope, make_kv(tokens(7), seed=7))
    assert store.lookup(scope, tokens(0)) is None  # unpinned, it is evicted like any other


def test_value_that_fits_nowhere_is_skipped_with_an_oom_alert(open_store: Callable[..., KVStore]) -> None:
    store = open_store(cpu_budget=2 * SIZE, ssd_budget=0)
    scope = store.scope(FP, "t")
    store.put(scope, make_kv(tokens(0)))
    store.tiers.pin(store.put(scope, make_kv(tokens(1), seed=1)).handle_id)
    store.tiers.pin(store.lookup(scope, tokens(0)).meta.handle_id)  # type: ignore[union-attr]
    result = store.put(scope, make_kv(tokens(2), seed=2))  # both slots pinned: no room after eviction
    assert (result.outcome, result.tier) == ("skipped", None)
    huge = store.put(scope, make_kv(list(range(64))))  # larger than every budget
    assert huge.outcome == "skipped"
    assert kinds(store).count(("kv.stored", "cpu")) == 2
    assert [e.fields["reason"] for e in store.events.read(count=100) if e.kind == "oom.alert"].count("no_space") == 2
    assert store.lookup(scope, tokens(2)) is None


def test_crossing_the_high_water_mark_raises_one_alert(open_store: Callable[..., KVStore], clock: Clock) -> None:
    store = open_store(cpu_budget=4 * SIZE, ssd_budget=0, high_water=0.7)
    scope = store.scope(FP, "t")
    for i in range(6):
        clock.tick()
        store.put(scope, make_kv(tokens(i), seed=i))
    alerts = [e.fields for e in store.events.read(count=100) if e.kind == "oom.alert"]
    assert [(a["reason"], a["tier"]) for a in alerts] == [("high_water", "cpu")]  # at 3 of 4, once


class ReportedPressure(TorchDeviceCache):
    """A real device cache whose pressure report the test sets, standing in for an engine's own
    accounting (a CPU device has none to report)."""

    pressure = True

    def memory(self) -> DeviceMemory:
        return super().memory()._replace(pressure=self.pressure)


def test_device_tier_holds_its_engines_values_first(open_store: Callable[..., KVStore]) -> None:
    device = TorchDeviceCache(FP, capacity=1 << 20)
    store = open_store(devices=[device], device_budget=2 * SIZE)
    scope = store.scope(FP, "t")
    kv = make_kv(tokens(0))
    assert store.put(scope, kv).tier == "device"
    assert store.put(store.scope(OTHER_FP, "t"), make_kv(tokens(0), fingerprint=OTHER_FP)).tier == "cpu"
    match = store.lookup(scope, tokens(0))
    assert match is not None and match.meta.location.startswith("device:")
    assert_same(store.load(match), kv)
    assert device.memory().used == SIZE
    for i in (1, 2):
        store.put(scope, make_kv(tokens(i), seed=i))
    assert store.lookup(scope, tokens(0)).meta.tier == "cpu"  # type: ignore[union-attr]  # demoted


def test_engine_memory_pressure_skips_the_device_tier_with_one_alert(open_store: Callable[..., KVStore]) -> None:
    store = open_store(devices=[ReportedPressure(FP, capacity=1 << 20)], device_budget=1 << 20)
    scope = store.scope(FP, "t")
    assert store.put(scope, make_kv(tokens(0))).tier == "cpu"  # the request goes on, cached lower
    assert store.put(scope, make_kv(tokens(1), seed=1)).tier == "cpu"
    store.check_engines()
    alerts = [e.fields for e in store.events.read(count=100) if e.kind == "oom.alert"]
    assert [(a["reason"], a["tier"]) for a in alerts] == [("engine_pressure", "device")]  # once per episode


def test_polling_engines_alerts_when_pressure_starts(open_store: Callable[..., KVStore]) -> None:
    device = ReportedPressure(FP, capacity=1 << 20)
    device.pressure = False
    store = open_store(devices=[device], device_budget=1 << 20)
    store.check_engines()
    assert not [e for e in store.events.read(count=100) if e.kind == "oom.alert"]
    device.pressure = True
    store.check_engines()
    store.check_engines()
    device.pressure = False
    store.check_engines()
    device.pressure = True  # a second episode
    store.check_engines()
    alerts = [e.fields["reason"] for e in store.events.read(count=100) if e.kind == "oom.alert"]
    assert alerts == ["engine_pressure", "engine_pressure"]


def test_stored_value_is_a_copy_the_callers_buffers_cannot_change(open_store: Callable[..., KVStore]) -> None:
    store = open_store()
    scope = store.scope(FP, "t")
    kv = make_kv(tokens(0))
    original = make_kv(tokens(0))
    store.put(scope, kv)
    for t in kv.keys + kv.values:
        t.zero_()  # as an engine reusing its page pool would
    match = store.lookup(scope, tokens(0))
    assert match is not None
    assert_same(store.load(match), original)
