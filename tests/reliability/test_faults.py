"""Faults against the running gateway on real Redis and SQL: every request gets the native answer
or a clean 5xx in the OpenAI error shape, bad KV never changes an answer, an event and a metric
record the fault, and the gateway recovers without a restart. (Redis stopped between two hops, a
tampered weights file and a mislabelled adapter are in tests/gateway/test_fallbacks.py.)"""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from engines.loader import LoadedModel
from engines.local import LocalEngine
from gateway.engine_pool import EnginePool
from gateway.services import build_services
from gateway.settings import StoreSettings
from store.errors import EmbeddedRedisError
from store.redis_server import EmbeddedRedis
from tests.gateway.conftest import ADMIN_KEY, CLIENT_KEY, GEMMA, SMOL, Gateway, make_settings
from tests.gateway.helpers import upload
from tests.reliability.conftest import (
    Messages,
    answer,
    assert_openai_error,
    chat,
    events,
    eventually,
    metric,
    native,
    opening,
    then,
)
from tests.reliability.faults import FaultyEngine, TcpProxy, disk_full, small_disk, unwritable

pytestmark = pytest.mark.models
POSTGRES = ("127.0.0.1", 5432)
ONLY_CPU = StoreSettings(cpu_budget_bytes=1 << 30, ssd_budget_bytes=0)
ONLY_SSD = StoreSettings(cpu_budget_bytes=0, ssd_budget_bytes=1 << 30)


def ready(gateway: Gateway) -> int:
    return httpx.get(f"{gateway.url}/health/ready", timeout=30).status_code


def latest_handle(gateway: Gateway) -> str:
    return events(gateway, "kv.stored")[-1]["handle"]


def hop_reuses_prefix(gateway: Gateway, role: str, messages: Messages, conversation: str) -> None:
    """Recovery: after a turn is stored again, the next hop takes its cached prefix, same answer."""
    text, hf, cached = answer(chat(gateway, role, messages, conversation))
    assert hf["path"] == "prefix" and cached > 0, hf
    assert text == native(gateway, role, messages)


def test_redis_killed_mid_traffic_answers_every_request_and_recovers_after_restart(
    serve: Callable[..., Gateway], tmp_path: Path
) -> None:
    redis_server = EmbeddedRedis(tmp_path / "own-redis").start()
    try:
        gw = serve(store=StoreSettings(redis_url=redis_server.url))
        firsts = {f"conv-{i}": opening(20 + i, 900) for i in range(3)}
        replies = {c: native(gw, "executor", m) for c, m in firsts.items()}
        for c, m in firsts.items():
            assert answer(chat(gw, "executor", m, c))[0] == replies[c]
        gw.settle()
        seconds = {c: then(m, replies[c], "Name one function it mentions.") for c, m in firsts.items()}
        expected = {c: native(gw, "executor", m) for c, m in seconds.items()}
        # The kill lands while the three requests are provably in flight: each one's store lookup
        # (the hop's first Redis call) waits at a gate until Redis has been SIGKILLed.
        planner = gw.services.chat.planner
        lookup, entered, killed = planner._cached_prefix, threading.Semaphore(0), threading.Event()

        def gated(hop: Any) -> Any:
            entered.release()
            killed.wait(60)
            return lookup(hop)

        planner._cached_prefix = gated  # type: ignore[method-assign]
        try:
            with ThreadPoolExecutor(3) as clients:
                futures = {c: clients.submit(chat, gw, "executor", m, c) for c, m in seconds.items()}
                for _ in seconds:
                    assert entered.acquire(timeout=120)  # all three are inside the hop
                redis_server.kill()  # SIGKILL
                killed.set()
                for c, future in futures.items():
                    text, hf, _ = answer(future.result())
                    assert text == expected[c] and hf["fallback"] == "StoreUnavailable", hf  # answered natively
        finally:
            planner._cached_prefix = lookup  # type: ignore[method-assign]
        review = then(seconds["conv-0"], expected["conv-0"], "Check the answer.")
        text, hf, cached = answer(chat(gw, "reviewer", review, "conv-0"))
        assert hf["path"] == "native" and hf["fallback"] == "StoreUnavailable" and cached == 0
        assert text == native(gw, "reviewer", review)
        assert ready(gw) == 503
        assert metric(gw, 'heterofold_transfer_fallbacks_total{reason="StoreUnavailable",stage="prefix"}') >= 1
        gw.settle()

        redis_server.start()  # same port: the pooled clients reconnect, no gateway restart
        eventually(lambda: ready(gw) == 200, what="ready again")
        eventually(lambda: any(e["reason"] == "StoreUnavailable" for e in events(gw, "transfer.fallback")),
                   what="the fallback events kept while Redis was down reach the stream")  # fmt: skip
        third = then(seconds["conv-1"], expected["conv-1"], "And another one?")
        reply = answer(chat(gw, "executor", third, "conv-1"))[0]
        gw.settle()
        hop_reuses_prefix(gw, "executor", then(third, reply, "Shorter, please."), "conv-1")
    finally:
        redis_server.stop()


def test_redis_unreachable_at_start_serves_chat_natively_then_connects_without_a_restart(
    serve: Callable[..., Gateway], tmp_path: Path
) -> None:
    redis_server = EmbeddedRedis(tmp_path / "own-redis")  # not started yet: its port refuses connections
    try:
        gw = serve(store=StoreSettings(redis_url=redis_server.url))
        assert httpx.get(f"{gw.url}/health/live", timeout=30).status_code == 200
        probe = httpx.get(f"{gw.url}/health/ready", timeout=30)
        assert probe.status_code == 503 and probe.json()["checks"]["redis"].startswith("unavailable"), probe.text
        first = opening(90, 900)
        reply = native(gw, "executor", first)
        text, hf, cached = answer(chat(gw, "executor", first, "conv-late"))
        assert (text, hf["path"], hf["fallback"], cached) == (reply, "native", "StoreUnavailable", 0)
        gw.settle()
        second = then(first, reply, "Name one function it mentions.")
        text, hf, cached = answer(chat(gw, "reviewer", second, "conv-late"))  # a transfer needs Redis too
        assert (text, hf["path"], hf["fallback"], cached) == (native(gw, "reviewer", second), "native",
                                                              "StoreUnavailable", 0)  # fmt: skip
        gw.settle()
        for stage in ("prefix", "transfer"):  # both hops tried both stages
            assert metric(gw, f'heterofold_transfer_fallbacks_total{{reason="StoreUnavailable",stage="{stage}"}}') == 2
        assert metric(gw, 'heterofold_kv_puts_total{outcome="error"}') == 2  # neither turn could be stored
        assert ready(gw) == 503

        redis_server.start()  # Redis answers: the gateway connects, no restart
        eventually(lambda: ready(gw) == 200, what="ready once Redis answers")
        eventually(lambda: len([e for e in events(gw, "transfer.fallback") if e["reason"] == "StoreUnavailable"]) == 4,
                   what="the fallback events kept while Redis was down reach the stream")  # fmt: skip
        third = then(second, text, "And another one?")
        text, hf, _ = answer(chat(gw, "executor", third, "conv-late"))
        assert hf["fallback"] is None and text == native(gw, "executor", third)
        gw.settle()
        assert metric(gw, 'heterofold_kv_puts_total{outcome="stored"}') == 1
        fourth = then(third, text, "Shorter, please.")
        hop_reuses_prefix(gw, "executor", fourth, "conv-late")
        gw.settle()
        _, hf, cached = answer(chat(gw, "reviewer", then(third, text, "Check the answer."), "conv-late"))
        assert hf["path"] == "transfer" and hf["adapter_version"] == "identity" and cached > 0, hf
    finally:
        redis_server.stop()


def test_embedded_redis_that_cannot_start_is_still_a_startup_error(tmp_path: Path) -> None:
    (tmp_path / "store").write_text("")  # a file where the embedded server's folder goes
    with pytest.raises(EmbeddedRedisError, match="cannot create"):
        asyncio.run(build_services(make_settings(tmp_path), pool=EnginePool({})))


def test_unwritable_ssd_directory_skips_caching_with_an_alert_and_recovers(
    serve: Callable[..., Gateway],
) -> None:
    gw = serve(store=ONLY_SSD)
    ssd = gw.services.store.tiers.ssd
    assert ssd is not None
    first = opening(30)
    reply = native(gw, "executor", first)
    second = then(first, reply, "Name one function it mentions.")
    with unwritable(ssd.root):
        assert answer(chat(gw, "executor", first, "conv-ro"))[0] == reply
        gw.settle()
        text, hf, cached = answer(chat(gw, "executor", second, "conv-ro"))
        assert hf["path"] == "native" and cached == 0 and text == native(gw, "executor", second)
        gw.settle()
        alerts = [e for e in events(gw, "oom.alert") if e["reason"] == "tier_unavailable" and e["tier"] == "ssd"]
        assert len(alerts) >= 2
        assert "Permission denied" in alerts[0]["detail"] or "not permitted" in alerts[0]["detail"]
        assert metric(gw, 'heterofold_kv_puts_total{outcome="skipped"}') == 2
        eventually(lambda: metric(gw, 'heterofold_oom_alerts_total{reason="tier_unavailable"}') >= 2)
        assert list(ssd.root.iterdir()) == [] and ssd.used == 0
    third = then(second, text, "And another one?")
    reply3 = answer(chat(gw, "executor", third, "conv-ro"))[0]
    gw.settle()
    assert metric(gw, 'heterofold_kv_puts_total{outcome="stored"}') == 1
    hop_reuses_prefix(gw, "executor", then(third, reply3, "Shorter, please."), "conv-ro")


def test_full_ssd_disk_skips_caching_with_an_alert_and_recovers_when_space_is_freed(
    serve: Callable[..., Gateway], tmp_path: Path
) -> None:
    root = tmp_path / "store" / "ssd"
    with small_disk(root, 64) as kind:  # the tier's budget (1 GiB) says there is room; the disk says not
        gw = serve(store=ONLY_SSD)
        first = opening(40)
        reply = native(gw, "executor", first)
        second = then(first, reply, "Name one function it mentions.")
        with disk_full(root, kind, leave_bytes=1 << 20):
            assert answer(chat(gw, "executor", first, "conv-full"))[0] == reply
            gw.settle()
            text, hf, cached = answer(chat(gw, "executor", second, "conv-full"))
            assert hf["path"] == "native" and cached == 0 and text == native(gw, "executor", second)
            gw.settle()
            alerts = [e for e in events(gw, "oom.alert") if e["reason"] == "tier_unavailable"]
            assert alerts and ("No space left" in alerts[0]["detail"] or "File too large" in alerts[0]["detail"])
            assert metric(gw, 'heterofold_kv_puts_total{outcome="skipped"}') == 2
            assert [p.name for p in root.iterdir() if p.name != "filler.bin"] == []  # no partial file left
        third = then(second, text, "And another one?")
        reply3 = answer(chat(gw, "executor", third, "conv-full"))[0]
        gw.settle()
        assert metric(gw, 'heterofold_kv_puts_total{outcome="stored"}') == 1
        hop_reuses_prefix(gw, "executor", then(third, reply3, "Shorter, please."), "conv-full")
        eventually(lambda: metric(gw, 'heterofold_oom_alerts_total{reason="tier_unavailable"}') >= 2)
        gw.server.should_exit = True  # stop writing before the disk goes away
        eventually(lambda: not gw.server.started or gw.server.should_exit)


def test_corrupt_or_planted_ssd_payload_is_dropped_and_never_changes_an_answer(
    serve: Callable[..., Gateway],
) -> None:
    gw = serve(store=ONLY_SSD)
    ssd = gw.services.store.tiers.ssd
    assert ssd is not None
    first = opening(50)
    reply = answer(chat(gw, "executor", first, "conv-c"))[0]
    gw.settle()
    handle = latest_handle(gw)
    blob = bytearray(ssd.path(handle).read_bytes())
    blob[len(blob) // 2] ^= 0x01  # one bit of one key
    ssd.path(handle).write_bytes(bytes(blob))

    second = then(first, reply, "Name one function it mentions.")
    text, hf, cached = answer(chat(gw, "executor", second, "conv-c"))
    # The prefix stage meets the corrupt file; the transfer stage may then find the turn gone.
    assert hf["path"] == "native" and hf["fallback"] in ("PayloadCorrupt", "SenderKVMissing") and cached == 0
    assert text == native(gw, "executor", second)
    gw.settle()
    assert not ssd.path(handle).exists()
    assert any(e["handle"] == handle and e["reason"] == "corrupt" for e in events(gw, "kv.evicted"))
    assert any(e["reason"] == "PayloadCorrupt" for e in events(gw, "transfer.fallback"))
    assert metric(gw, 'heterofold_transfer_fallbacks_total{reason="PayloadCorrupt",stage="prefix"}') == 1
    eventually(lambda: metric(gw, 'heterofold_kv_evictions_total{reason="corrupt"}') == 1)

    third = then(second, text, "And another one?")  # recovered: the second turn was stored again
    hop_reuses_prefix(gw, "executor", third, "conv-c")
    reply3 = answer(chat(gw, "executor", third, "conv-c"))[0]
    gw.settle()
    mine = latest_handle(gw)
    answer(chat(gw, "executor", opening(51), "conv-other"))
    gw.settle()
    other = latest_handle(gw)
    assert other != mine
    # Someone who can write the SSD directory plants another conversation's valid, self-consistent
    # file under this one's name: the handle's sha256 in Redis refuses it.
    ssd.path(mine).write_bytes(ssd.path(other).read_bytes())
    fourth = then(third, reply3, "Shorter, please.")
    text, hf, cached = answer(chat(gw, "executor", fourth, "conv-c"))
    assert hf["path"] == "native" and hf["fallback"] in ("PayloadCorrupt", "SenderKVMissing") and cached == 0
    assert text == native(gw, "executor", fourth)
    assert metric(gw, 'heterofold_transfer_fallbacks_total{reason="PayloadCorrupt",stage="prefix"}') == 2
    assert not ssd.path(mine).exists() and ssd.path(other).exists()


def test_adapter_rewritten_with_a_matching_manifest_is_refused_and_a_clean_upload_serves_again(
    serve: Callable[..., Gateway], fitted_adapter: Path
) -> None:
    gateway = serve()
    row = upload(gateway, fitted_adapter)
    folder = Path(row["artifact_path"])
    weights = bytearray((folder / "adapter.safetensors").read_bytes())
    weights[-1] ^= 0xFF
    (folder / "adapter.safetensors").write_bytes(bytes(weights))
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["weights_sha256"] = hashlib.sha256(weights).hexdigest()  # consistent on disk: only SQL knows
    (folder / "manifest.json").write_text(json.dumps(manifest))

    context = opening(60)
    answer(chat(gateway, "executor", context, "conv-adapter"))
    gateway.settle()
    summary = [{"role": "user", "content": f"{context[0]['content']}\n\nSummarize."}]
    text, hf, cached = answer(chat(gateway, "summarizer", summary, "conv-adapter"))
    assert hf["path"] == "native" and hf["fallback"] == "AdapterError" and cached == 0
    assert text == native(gateway, "summarizer", summary)
    gateway.settle()
    fallbacks = [e for e in events(gateway, "transfer.fallback") if e["reason"] == "AdapterError"]
    assert fallbacks and "registry" in fallbacks[0]["detail"]
    assert metric(gateway, 'heterofold_transfer_fallbacks_total{reason="AdapterError",stage="transfer"}') == 1

    files = {name: (fitted_adapter / name).read_bytes() for name in ("manifest.json", "adapter.safetensors")}
    with gateway.http() as admin:  # a clean copy as a new version, promoted: serves at once, no restart
        r = admin.post(
            "/admin/adapters",
            files={"manifest": files["manifest.json"], "weights": files["adapter.safetensors"]},
            data={"version": "clean"},
        )
        assert r.status_code == 201, r.text
        assert admin.post(f"/admin/adapters/{r.json()['id']}/promote").json()["status"] == "active"
    context = opening(61)  # new text: nothing of it cached for the summarizer's own model yet
    answer(chat(gateway, "executor", context, "conv-adapter-2"))
    gateway.settle()
    summary = [{"role": "user", "content": f"{context[0]['content']}\n\nSummarize."}]
    _, hf, cached = answer(chat(gateway, "summarizer", summary, "conv-adapter-2"))
    assert hf["path"] == "transfer" and hf["adapter_version"] == "clean" and cached > 0


def chat_when_free(gw: Gateway, messages: Messages, conversation: str, within_s: float = 10) -> httpx.Response:
    """The engine takes one request at a time and frees its slot when the work it stopped ends:
    a 429 just after a failure is the queue doing its job; the slot must come free soon."""
    deadline, r = time.monotonic() + within_s, chat(gw, "executor", messages, conversation)
    while r.status_code == 429 and time.monotonic() < deadline:
        time.sleep(0.2)
        r = chat(gw, "executor", messages, conversation)
    return r


@pytest.fixture
def faulty_smol(pool: EnginePool) -> Iterator[tuple[FaultyEngine, EnginePool]]:
    """smollm2 behind a FaultyEngine (one request at a time, a 10 s engine timeout), gemma3 as is."""
    smol = pool[SMOL].engine
    assert isinstance(smol, LocalEngine)
    one_at_a_time = LocalEngine(LoadedModel(smol.model, smol.tokenizer, smol.spec, 0.0), capacity=1)
    faulty = FaultyEngine(one_at_a_time)
    settings = pool[SMOL].settings.model_copy(update={"timeout_s": 10.0})
    yield faulty, EnginePool({SMOL: replace(pool[SMOL], engine=faulty, settings=settings), GEMMA: pool[GEMMA]})
    asyncio.run(one_at_a_time.aclose())


def test_engine_that_raises_answers_503_in_the_openai_shape_and_the_next_request_succeeds(
    serve: Callable[..., Gateway], faulty_smol: tuple[FaultyEngine, EnginePool]
) -> None:
    faulty, engines = faulty_smol
    gw = serve(engines=engines)
    question = [{"role": "user", "content": "Name three colours."}]
    expected = native(gw, "executor", question)
    faulty.mode = "raise"
    assert_openai_error(chat(gw, "executor", question, "conv-raise"), 503, "engine_failed")
    faulty.mode = "raise-midway"
    body = {"messages": question, "stream": True}
    headers = {"Authorization": f"Bearer {CLIENT_KEY}"}
    with httpx.stream("POST", f"{gw.url}/v1/agents/executor", json=body, headers=headers, timeout=60) as r:
        assert r.status_code == 200  # headers went out with the first token: the error comes in-band
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] != "data: [DONE]"
    error = json.loads(lines[-1].removeprefix("data: "))["error"]
    assert error["code"] == "engine_failed" and error["type"] == "server_error"
    assert_openai_error(chat_when_free(gw, question, "conv-raise"), 503, "engine_failed")
    assert metric(gw, 'heterofold_request_errors_total{code="engine_failed",role="executor"}') == 3
    eventually(lambda: len([e for e in events(gw, "engine.failure") if e["reason"] == "RuntimeError"]) == 3)

    faulty.mode = "ok"
    assert answer(chat_when_free(gw, question, "conv-raise"))[0] == expected


def test_engine_that_hangs_times_out_with_504_and_frees_its_queue_slot(
    serve: Callable[..., Gateway], faulty_smol: tuple[FaultyEngine, EnginePool]
) -> None:
    faulty, engines = faulty_smol
    gw = serve(engines=engines)
    question = [{"role": "user", "content": "Name three colours."}]
    expected = native(gw, "executor", question)
    faulty.mode = "hang"
    t0 = time.monotonic()
    assert_openai_error(chat(gw, "executor", question, "conv-hang"), 504, "engine_timeout")
    assert time.monotonic() - t0 < 30
    assert metric(gw, 'heterofold_request_errors_total{code="engine_timeout",role="executor"}') == 1
    eventually(lambda: any(e["reason"] == "timeout" for e in events(gw, "engine.failure")))

    faulty.mode = "ok"  # the engine takes one request at a time: the hung one must have let go
    assert answer(chat_when_free(gw, question, "conv-hang"))[0] == expected


def test_payload_that_fits_no_tier_is_skipped_with_an_oom_alert_and_caching_resumes(
    serve: Callable[..., Gateway],
) -> None:
    budget = 24 << 20  # one turn of ~350 smollm2 tokens (46 KB each) fits, two do not
    gw = serve(store=StoreSettings(cpu_budget_bytes=budget, ssd_budget_bytes=0))
    store = gw.services.store
    answer(chat(gw, "executor", opening(70), "conv-a"))
    gw.settle()
    held = latest_handle(gw)
    assert budget / 2 < store.tiers.cpu.used <= budget
    store.tiers.pin(held)  # a long checkout of conv-a's value: it cannot be evicted to make room
    try:
        first = opening(71)
        reply = answer(chat(gw, "executor", first, "conv-b"))[0]
        gw.settle()
        assert metric(gw, 'heterofold_kv_puts_total{outcome="skipped"}') == 1
        assert any(e["reason"] == "no_space" for e in events(gw, "oom.alert"))
        eventually(lambda: metric(gw, 'heterofold_oom_alerts_total{reason="no_space"}') == 1)
        assert store.tiers.cpu.used <= budget
    finally:
        store.tiers.unpin(held)
    second = then(first, reply, "Name one function it mentions.")
    text, hf, cached = answer(chat(gw, "executor", second, "conv-b"))
    assert hf["path"] == "native" and cached == 0 and text == native(gw, "executor", second)
    gw.settle()  # now conv-a's value is evicted to make room
    assert any(e["handle"] == held and e["reason"] == "budget" for e in events(gw, "kv.evicted"))
    assert store.tiers.cpu.used <= budget
    hop_reuses_prefix(gw, "executor", then(second, text, "Shorter, please."), "conv-b")


def test_database_unreachable_at_start_serves_chat_then_connects_without_a_restart(
    postgres_schema: str, serve: Callable[..., Gateway]
) -> None:
    proxy = TcpProxy(POSTGRES)  # the port refuses connections until up()
    url = (
        f"postgresql+psycopg://postgres@127.0.0.1:{proxy.port}/test?options={quote(f'-csearch_path={postgres_schema}')}"
    )
    try:
        gw = serve(database_url=url, registry_retry_s=0.3)
        admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
        assert_openai_error(httpx.get(f"{gw.url}/admin/adapters", headers=admin), 503, "registry_unavailable")
        assert ready(gw) == 503
        context = opening(80)
        answer(chat(gw, "executor", context, "conv-db"))
        gw.settle()
        summary = [{"role": "user", "content": f"{context[0]['content']}\n\nSummarize."}]
        text, hf, _ = answer(chat(gw, "summarizer", summary, "conv-db"))  # the adapter lookup needs SQL
        assert hf["path"] == "native" and hf["fallback"] == "RegistryError"
        assert text == native(gw, "summarizer", summary)
        assert metric(gw, 'heterofold_transfer_fallbacks_total{reason="RegistryError",stage="transfer"}') == 1
        eventually(lambda: any(e["reason"] == "RegistryError" for e in events(gw, "transfer.fallback")))

        proxy.up()  # the database is reachable: migrations run, models registered, no restart
        eventually(lambda: ready(gw) == 200, what="ready once the registry connects")
        models = httpx.get(f"{gw.url}/admin/models", headers=admin).json()
        assert {m["name"] for m in models} == {SMOL, GEMMA} and all(m["current"] for m in models)

        proxy.down()  # lost again mid-run: admin answers 503, chat goes on
        assert_openai_error(httpx.get(f"{gw.url}/admin/adapters", headers=admin), 503, "registry_unavailable")
        assert answer(chat(gw, "executor", [{"role": "user", "content": "Hi"}], "conv-db-2"))[0]
        proxy.up()
        eventually(lambda: httpx.get(f"{gw.url}/admin/adapters", headers=admin).status_code == 200)
    finally:
        proxy.down()
