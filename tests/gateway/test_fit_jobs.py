"""Fit jobs that raise: retried with backoff, then failed with a ``fit.failed`` alert and a counted
failure; a cancelled fit is not retried; the ``heterofold run`` summary of the bootstrap fits.

Fit jobs across replicas: two ``FitJobs`` (two "replicas", each with its own connection pool,
background tasks and metrics) on one real SQLite file or PostgreSQL schema. One lists, reads and
cancels the other's jobs; a job whose replica is gone reads stale and is cancelled at once; a live
one keeps its heartbeat through long fit steps and the retry backoff; bootstraps racing in two
threads fit each direction once. Then the admin API and the dashboard of a real gateway cancel one.

The fit itself (``harness.fit_on_engines.fit_or_distill``, minutes of CPU) is swapped for one that raises,
reports progress for as long as it is told, or returns a small random adapter of the right shapes:
the job logic is under test, not fitting.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import threading
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from cli.gateway import fit_summary
from engines.local import LocalEngine
from gateway import jobs as jobs_module
from gateway.background import Background
from gateway.engine_pool import EnginePool
from gateway.errors import Conflict, FitCancelled, NotFound
from gateway.jobs import FitJobs, Job, bootstrap_id
from gateway.metrics import Metrics
from gateway.registry import db as registry_db
from gateway.registry import versions
from gateway.registry.db import Database
from gateway.registry.tables import FitJobRow
from gateway.resolver import AdapterResolver
from gateway.settings import BootstrapSettings, DistillSettings
from heterofold.adapter import Adapter
from store.events import EventLog
from store.redis_server import EmbeddedRedis
from tests.gateway.conftest import ADMIN_KEY, GEMMA, SMOL, Gateway
from tests.gateway.helpers import small_adapter

RETRY = BootstrapSettings(fit_retries=2, fit_retry_backoff_s=0.01)
FIT: dict[str, Any] = {"sender": SMOL, "receiver": GEMMA, "method": "kv-ridge", "docs": 2, "max_tokens": 96}
Fit = Callable[..., Any]


def fit_failing(times: int, error: Exception) -> tuple[Fit, list[int]]:
    """A stand-in for ``fit_or_distill`` that raises ``error`` on its first ``times`` calls, then
    returns a small adapter; and the list its calls are counted in."""
    calls: list[int] = []

    async def fit(sender: LocalEngine, receiver: LocalEngine, **kwargs: Any) -> Adapter:
        calls.append(len(calls) + 1)
        kwargs["progress"]("collect", 1, 2)
        if len(calls) <= times:
            raise error
        return small_adapter(sender, receiver, kwargs["version"], seed=len(calls))

    return fit, calls


def run_fit(gateway: Gateway) -> dict[str, Any]:
    """Start a fit through the admin API and wait for it to end."""
    with gateway.http() as admin:
        r = admin.post("/admin/fits", json=FIT)
        assert r.status_code == 202, r.text
        job: dict[str, Any] = r.json()
        deadline = time.monotonic() + 60
        while job["status"] in ("queued", "running") and time.monotonic() < deadline:
            time.sleep(0.05)
            job = admin.get(f"/admin/fits/{job['id']}").json()
    return job


def fit_failures(gateway: Gateway) -> float:
    """``heterofold_fit_failures_total{method="kv-ridge"}`` as scraped from /metrics (0 if absent)."""
    with gateway.http(None) as http:
        text = http.get("/metrics").text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "heterofold_fit_failures_total" and sample.labels == {"method": "kv-ridge"}:
                return float(sample.value)
    return 0.0


def fit_failed_events(gateway: Gateway) -> list[dict[str, str]]:
    return [e.fields for e in gateway.services.store.events.read(count=10_000) if e.kind == "fit.failed"]


def stored_attempts(gateway: Gateway, job_id: str) -> int:
    with gateway.services.db.session() as session:
        row = session.get(FitJobRow, job_id)
        assert row is not None
        return row.attempts


def gateway_fitting(
    start_gateway: Callable[..., Gateway], monkeypatch: pytest.MonkeyPatch, failures: int, error: Exception
) -> tuple[Gateway, list[int]]:
    """A gateway (with ``RETRY``) whose fits raise ``error`` ``failures`` times, then succeed; the
    attempts seen so far."""
    fit, calls = fit_failing(failures, error)
    monkeypatch.setattr(jobs_module, "fit_or_distill", fit)
    return start_gateway(bootstrap=RETRY), calls


@pytest.mark.models
def test_fit_that_fails_twice_then_succeeds_ends_done_after_three_attempts(
    start_gateway: Callable[..., Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    gateway, calls = gateway_fitting(start_gateway, monkeypatch, 2, ValueError("flaky"))
    job = run_fit(gateway)
    assert job["status"] == "done", job
    assert job["attempts"] == 3 and calls == [1, 2, 3] and job["error"] is None and job["adapter_id"]
    assert stored_attempts(gateway, job["id"]) == 3
    with gateway.http() as admin:
        adapters = {a["id"]: a for a in admin.get("/admin/adapters").json()}
    assert adapters[job["adapter_id"]]["status"] == "candidate"
    assert fit_failed_events(gateway) == [] and fit_failures(gateway) == 0.0


@pytest.mark.models
def test_fit_that_always_fails_alerts_once_after_its_last_attempt(
    start_gateway: Callable[..., Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    gateway, calls = gateway_fitting(start_gateway, monkeypatch, 99, ValueError("no luck"))
    assert fit_failures(gateway) == 0.0
    job = run_fit(gateway)
    assert job["status"] == "failed", job
    assert job["attempts"] == 1 + RETRY.fit_retries == len(calls) and job["error"] == "ValueError: no luck"
    assert stored_attempts(gateway, job["id"]) == 3
    (event,) = fit_failed_events(gateway)
    assert {k: event[k] for k in ("sender", "receiver", "method", "attempts", "error")} == {
        "sender": SMOL, "receiver": GEMMA, "method": "kv-ridge", "attempts": "3", "error": "ValueError: no luck",
    }  # fmt: skip
    assert fit_failures(gateway) == 1.0
    with gateway.http(None) as http:
        overview = http.get("/dashboard").text
    alerts = overview.split('id="alerts"', 1)[1]  # the Overview's active alerts list
    assert "fit failed" in alerts and f"{SMOL} -&gt; {GEMMA} (kv-ridge) failed after 3 attempts" in alerts


@pytest.mark.models
def test_cancelled_fit_is_not_retried_and_does_not_alert(
    start_gateway: Callable[..., Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    gateway, calls = gateway_fitting(start_gateway, monkeypatch, 99, FitCancelled("the gateway is stopping"))
    job = run_fit(gateway)
    assert job["status"] == "failed" and job["attempts"] == 1 and len(calls) == 1
    assert job["error"] == "FitCancelled: the gateway is stopping"
    assert fit_failed_events(gateway) == [] and fit_failures(gateway) == 0.0


def job(sender: str, status: str, error: str | None = None) -> Job:
    return Job(f"id-{sender}", sender, "qwen", "kv-ridge", 8, 512, "v", True, status=status, error=error)


def test_summary_counts_done_jobs_and_names_each_failure() -> None:
    jobs = [job("a", "done"), job("b", "failed", "ValueError: bad shapes"), job("c", "done")]
    assert fit_summary(jobs) == "2 of 3 adapters fitted and active; b -> qwen failed: ValueError: bad shapes."
    assert fit_summary([job("a", "done"), job("b", "done")]) == "2 of 2 adapters fitted and active."


def test_summary_claims_no_more_than_finished_when_interrupted() -> None:
    jobs = [job("a", "done"), job("b", "running"), job("c", "queued"), job("d", "failed", "OSError: disk full.")]
    said = "1 of 4 adapters fitted and active; d -> qwen failed: OSError: disk full; 2 not finished."
    assert fit_summary(jobs) == said
    nothing = [job("a", "running"), job("b", "queued")]
    assert fit_summary(nothing) == "0 of 2 adapters fitted and active; 2 not finished."
    cancelled = [job("a", "done"), job("b", "cancelled")]  # ended: not "not finished"
    assert fit_summary(cancelled) == "1 of 2 adapters fitted and active; b -> qwen cancelled."
    stopped = [job("a", "done"), job("b", "failed", "FitCancelled: the gateway is stopping")]  # Ctrl-C
    assert fit_summary(stopped) == "1 of 2 adapters fitted and active; 1 not finished."


def test_summary_counts_the_shadow_stage_apart() -> None:
    def second(sender: str, status: str, error: str | None = None) -> Job:
        return Job(f"id2-{sender}", sender, "qwen", "distilled", 8, 512, "v", False, True, status=status, error=error)

    jobs = [job("a", "done"), job("b", "done"), second("a", "done"), second("b", "failed", "ValueError: nan loss")]
    assert fit_summary(jobs) == (
        "2 of 2 adapters fitted and active; 1 of 2 distilled fits in shadow (each replaces the active version if it "
        "beats it on live requests); b -> qwen (distilled, shadow) failed: ValueError: nan loss."
    )
    assert fit_summary([job("a", "done"), second("a", "running")]).endswith("in shadow (each replaces the active "
                                                                            "version if it beats it on live "
                                                                            "requests); 1 not finished.")  # fmt: skip


# Across replicas ----------------------------------------------------------------------------------

DIRECTIONS = [(SMOL, GEMMA), (GEMMA, SMOL)]
T = TypeVar("T")
FAST = {"save_every_s": 0.05, "stale_after_s": 2.0}  # a heartbeat every 50 ms; stale after 2 s without one


class Steps:
    """A stand-in for ``fit_or_distill`` that reports ``steps`` progress steps ``step_s`` apart (the
    job's progress callback raises ``FitCancelled`` from one, as the real fit would let it), then
    returns a small adapter; it counts the fits started and the steps taken."""

    def __init__(self, steps: int, step_s: float, fail: bool = False) -> None:
        self.steps, self.step_s, self.fail = steps, step_s, fail
        self.started: list[tuple[str, str]] = []  # (sender, receiver) per fit started
        self.taken = 0
        self._lock = threading.Lock()

    async def __call__(self, sender: LocalEngine, receiver: LocalEngine, **kwargs: Any) -> Adapter:
        with self._lock:
            self.started.append((sender.spec.name, receiver.spec.name))
        for i in range(self.steps):
            kwargs["progress"]("collect", i + 1, self.steps)
            self.taken += 1
            await asyncio.sleep(self.step_s)
        if self.fail:
            raise ValueError("no luck")
        return small_adapter(sender, receiver, kwargs["version"], seed=len(self.started))


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with EmbeddedRedis(tmp_path_factory.mktemp("redis")) as server:
        yield server.url


@pytest.fixture
def events(redis_server: str) -> Iterator[EventLog]:
    client = redis.Redis.from_url(redis_server)
    yield EventLog(client, f"hftest-{uuid.uuid4().hex[:12]}:events", "test", maxlen=1000, ttl_s=600)
    client.close()


@pytest.fixture
def replica(database_url: str, pool: EnginePool, events: EventLog, tmp_path: Path) -> Iterator[Callable[..., FitJobs]]:
    """Makes replicas on one migrated registry; each has its own ``Database`` (connection pool),
    background tasks and metrics, as separate gateway processes would."""
    registry_db.upgrade(database_url)
    made: list[FitJobs] = []

    def make(name: str, **overrides: Any) -> FitJobs:
        db = Database(database_url)
        jobs = FitJobs(db=db, pool=pool, resolver=AdapterResolver(db), adapters_dir=tmp_path / name,
                       background=Background(), events=events, metrics=Metrics(), replica=name,
                       **{**FAST, **overrides})  # fmt: skip
        made.append(jobs)
        return jobs

    yield make
    for jobs in made:
        jobs.db.close()


async def until(check: Callable[[], Any], timeout_s: float = 30.0) -> Any:
    """Poll ``check`` (off the loop: it reads the registry) until it returns something truthy."""
    deadline = time.monotonic() + timeout_s
    while not (value := await asyncio.to_thread(check)):
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)
    return value


def run(scenario: Coroutine[Any, Any, T], *replicas: FitJobs) -> T:
    """``asyncio.run(scenario)``, then stop the replicas: a failed check must leave no fake fit
    running (``asyncio.run`` waits for the worker threads)."""

    async def go() -> T:
        try:
            return await scenario
        finally:
            for jobs in replicas:
                jobs.stop()
                await jobs.background.aclose()

    return asyncio.run(go())


def failures_of(jobs: FitJobs) -> float:
    return float(jobs.metrics.fit_failures.labels("kv-ridge")._value.get())


def fit_failed(events: EventLog) -> list[dict[str, str]]:
    return [e.fields for e in events.read(count=10_000) if e.kind == "fit.failed"]


@pytest.mark.models
def test_second_replica_lists_and_reads_the_first_ones_job_and_its_progress(
    replica: Callable[..., FitJobs], monkeypatch: pytest.MonkeyPatch
) -> None:
    fit = Steps(steps=30, step_s=0.05)
    monkeypatch.setattr(jobs_module, "fit_or_distill", fit)
    a, b = replica("replica-a"), replica("replica-b")

    async def scenario() -> None:
        job = a.start(**FIT)
        seen = await until(lambda: (j := b.get(job.id)).done >= 3 and j)
        assert (seen.replica, seen.status, seen.stage, seen.total) == ("replica-a", "running", "collect", 30)
        assert not seen.stale and not seen.cancel_requested and seen.attempts == 1
        listed = {j.id: j for j in b.list()}
        assert listed[job.id].replica == "replica-a" and listed[job.id].version == job.version
        await a.background.drain(60)
        assert b.jobs == {}  # b runs nothing: all it showed came from the table

    run(scenario(), a, b)
    (job,) = a.jobs.values()
    final = b.get(job.id).view()
    assert final["status"] == "done" and final["progress"] == 1.0 and final["adapter_id"] and not final["stale"]
    assert final.keys() == job.view().keys() >= {"replica", "cancel_requested", "stale", "progress", "started"}
    assert {k: final[k] for k in ("sender", "receiver", "method", "docs", "max_tokens", "version", "activate")} == {
        "sender": SMOL, "receiver": GEMMA, "method": "kv-ridge", "docs": 2, "max_tokens": 96,
        "version": job.version, "activate": False,
    }  # fmt: skip
    with pytest.raises(NotFound, match=r"^no fit job nope$"):
        b.get("nope")


@pytest.mark.models
def test_second_replica_cancels_the_first_ones_running_fit_which_stops_cancelled_without_retry_or_alert(
    replica: Callable[..., FitJobs], monkeypatch: pytest.MonkeyPatch, events: EventLog
) -> None:
    fit = Steps(steps=100_000, step_s=0.01)  # 1000 s unless cancelled
    monkeypatch.setattr(jobs_module, "fit_or_distill", fit)
    a, b = replica("replica-a", retries=2), replica("replica-b")

    async def scenario() -> float:
        job = a.start(**FIT)
        await until(lambda: b.get(job.id).done >= 1)
        asked = time.monotonic()
        view = b.cancel(job.id)
        assert view.cancel_requested and view.status == "running"
        await until(lambda: b.get(job.id).status == "cancelled")
        took = time.monotonic() - asked
        await a.background.drain(10)
        return took

    took = run(scenario(), a, b)
    (job,) = a.jobs.values()
    assert job.status == "cancelled" and b.get(job.id).status == "cancelled"
    assert took < 5.0, took  # within a few heartbeats of 50 ms, with room for a loaded machine
    taken = fit.taken
    time.sleep(0.3)
    assert fit.taken == taken and len(fit.started) == 1 and b.get(job.id).attempts == 1  # stopped; no retry
    assert fit_failed(events) == [] and failures_of(a) == 0.0
    with pytest.raises(Conflict, match="already cancelled"):
        b.cancel(job.id)
    with pytest.raises(NotFound):
        b.cancel("nope")


@pytest.mark.models
def test_queued_job_cancelled_from_another_replica_never_starts(
    replica: Callable[..., FitJobs], monkeypatch: pytest.MonkeyPatch
) -> None:
    fit = Steps(steps=100_000, step_s=0.01)
    monkeypatch.setattr(jobs_module, "fit_or_distill", fit)
    a, b = replica("replica-a"), replica("replica-b")

    async def scenario() -> tuple[str, str]:
        first, second = a.start(**FIT), a.start(**FIT)  # one fit at a time per replica: the second waits
        await until(lambda: b.get(first.id).status == "running")
        assert b.get(second.id).status == "queued"
        assert b.cancel(second.id).status == "cancelled"  # at once: nothing runs it yet
        await until(lambda: a.jobs[second.id].status == "cancelled")  # a learns of it by its heartbeat
        b.cancel(first.id)
        await a.background.drain(10)
        return first.id, second.id

    first_id, second_id = run(scenario(), a, b)
    assert len(fit.started) == 1
    assert (b.get(second_id).status, b.get(second_id).attempts) == ("cancelled", 0)
    assert b.get(first_id).status == "cancelled"


@pytest.mark.models
def test_stale_job_of_a_gone_replica_is_flagged_and_any_replica_cancels_it_at_once(
    replica: Callable[..., FitJobs],
) -> None:
    b = replica("replica-b")
    long_ago = datetime.now(UTC) - timedelta(minutes=10)
    with b.db.session() as session:  # a job whose replica died mid-fit: its row stopped changing
        session.add(FitJobRow(id="d" * 32, sender_name=SMOL, receiver_name=GEMMA, method="kv-ridge",
                              replica="gone-host:4242", version="v-gone", docs=2, max_tokens=96, status="running",
                              stage="collect", done=1, total=4, attempts=1, created_at=long_ago,
                              updated_at=long_ago))  # fmt: skip
    seen = b.get("d" * 32)
    assert seen.stale and seen.status == "running" and seen.replica == "gone-host:4242"
    assert [j.stale for j in b.list() if j.id == "d" * 32] == [True]
    cancelled = b.cancel("d" * 32)
    assert cancelled.status == "cancelled" and not cancelled.stale and cancelled.cancel_requested
    assert cancelled.error == "its replica gone-host:4242 stopped updating it"
    assert b.get("d" * 32).status == "cancelled"
    with pytest.raises(Conflict):
        b.cancel("d" * 32)


@pytest.mark.models
def test_running_job_keeps_its_heartbeat_through_a_long_fit_step_and_the_retry_backoff(
    replica: Callable[..., FitJobs], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []

    async def fit(sender: LocalEngine, receiver: LocalEngine, **kwargs: Any) -> Adapter:
        calls.append(len(calls) + 1)
        kwargs["progress"]("collect", 1, 2)
        await asyncio.sleep(2.5)  # one step longer than stale_after_s, without a progress call
        if len(calls) == 1:
            raise ValueError("flaky")
        return small_adapter(sender, receiver, kwargs["version"], seed=1)

    monkeypatch.setattr(jobs_module, "fit_or_distill", fit)
    quick = {"save_every_s": 0.05, "stale_after_s": 1.0}
    a, b = replica("replica-a", retries=1, backoff_s=2.5, **quick), replica("replica-b", **quick)

    async def scenario() -> set[str]:
        job = a.start(**FIT)
        stages = set()
        while (seen := await asyncio.to_thread(b.get, job.id)).status in ("queued", "running"):
            assert not seen.stale, seen
            stages.add(seen.stage)
            await asyncio.sleep(0.05)
        return stages

    stages = run(scenario(), a, b)
    assert "attempt 1 failed; retrying in 2.5 s" in stages and "collect" in stages
    (job,) = a.jobs.values()
    assert job.status == "done" and job.attempts == 2 and calls == [1, 2]


@pytest.mark.models
def test_stopping_a_replica_fails_its_fits_as_stopped_not_cancelled_and_without_alert(
    replica: Callable[..., FitJobs], monkeypatch: pytest.MonkeyPatch, events: EventLog
) -> None:
    monkeypatch.setattr(jobs_module, "fit_or_distill", Steps(steps=100_000, step_s=0.01))
    a, b = replica("replica-a", retries=2), replica("replica-b")

    async def scenario() -> tuple[str, str]:
        running, queued = a.start(**FIT), a.start(**FIT)
        await until(lambda: b.get(running.id).status == "running")
        a.stop()  # as Services.aclose does: stop, then cancel the background tasks
        await a.background.aclose()
        return running.id, queued.id

    for job_id in run(scenario(), a, b):
        job = b.get(job_id)
        assert (job.status, job.error, job.cancel_requested) == ("failed", "FitCancelled: the gateway is stopping",
                                                                 False)  # fmt: skip
    assert fit_failed(events) == [] and failures_of(a) == 0.0


def race(replicas: list[FitJobs]) -> list[list[Job]]:
    """Each replica bootstraps every direction at once, on its own thread and event loop (as two
    gateways starting together would), and waits for its jobs; the jobs each one started."""
    barrier = threading.Barrier(len(replicas))

    def boot(jobs: FitJobs) -> list[Job]:
        async def go() -> list[Job]:
            barrier.wait(30)
            started = jobs.bootstrap(method="kv-ridge", docs=2, max_tokens=64, order=DIRECTIONS)
            await jobs.background.drain(120)
            return started

        return asyncio.run(go())

    with ThreadPoolExecutor(len(replicas)) as threads:
        return list(threads.map(boot, replicas))


@pytest.mark.models
def test_two_bootstraps_racing_on_one_database_fit_each_direction_once_and_retake_failed_ones(
    replica: Callable[..., FitJobs], monkeypatch: pytest.MonkeyPatch, pool: EnginePool
) -> None:
    ids = {bootstrap_id("kv-ridge", pool[s].engine.spec.fingerprint, pool[r].engine.spec.fingerprint)
           for s, r in DIRECTIONS}  # fmt: skip
    failing = Steps(steps=3, step_s=0.05, fail=True)
    monkeypatch.setattr(jobs_module, "fit_or_distill", failing)
    started = race([replica("replica-a"), replica("replica-b")])
    assert sorted(failing.started) == sorted(DIRECTIONS)  # each direction fitted once, by one replica
    assert sorted(j.id for jobs in started for j in jobs) == sorted(ids)
    assert all(j.status == "failed" for jobs in started for j in jobs)

    fitting = Steps(steps=3, step_s=0.05)  # both replicas restart: the failed jobs are taken over once each
    monkeypatch.setattr(jobs_module, "fit_or_distill", fitting)
    c, d = replica("replica-c"), replica("replica-d")
    started = race([c, d])
    assert sorted(fitting.started) == sorted(DIRECTIONS)
    assert sorted(j.id for jobs in started for j in jobs) == sorted(ids)
    for job_id in ids:
        job = c.get(job_id)
        assert job.status == "done" and job.attempts == 1 and job.error is None
        assert job.replica in ("replica-c", "replica-d") and job.activate and job.adapter_id
    with c.db.session() as session:
        active = {(r.sender_name, r.receiver_name) for r in versions.serving(session=session, statuses=("active",))}
    assert active == set(DIRECTIONS)
    assert replica("replica-e").bootstrap(method="kv-ridge", docs=2, max_tokens=64, order=DIRECTIONS) == []


class Staged:
    """A stand-in for ``fit_or_distill`` that records each fit (method, the version it started
    from, direction) and returns a small adapter of the method asked for."""

    def __init__(self) -> None:
        self.fits: list[tuple[str, str | None, tuple[str, str]]] = []

    async def __call__(self, sender: LocalEngine, receiver: LocalEngine, **kwargs: Any) -> Adapter:
        start = kwargs.get("start")
        self.fits.append((kwargs["method"], start.manifest.version if start else None,
                          (sender.spec.name, receiver.spec.name)))  # fmt: skip
        kwargs["progress"]("collect", 1, 1)
        made = small_adapter(sender, receiver, kwargs["version"], seed=len(self.fits))
        return Adapter(dataclasses.replace(made.manifest, method=kwargs["method"]), made.maps)


async def bootstrapped(jobs: FitJobs, order: list[tuple[str, str]]) -> list[Job]:
    """``jobs`` bootstraps ``order`` with KV Ridge, then distilled in shadow, and waits for its jobs."""
    started = jobs.bootstrap(method="kv-ridge", docs=2, max_tokens=64, order=order, then="distilled")
    await jobs.background.drain(120)
    return started


@pytest.mark.models
def test_bootstrap_then_fits_every_direction_first_then_a_shadow_distillation_from_the_active_ridge(
    replica: Callable[..., FitJobs], monkeypatch: pytest.MonkeyPatch
) -> None:
    staged = Staged()
    monkeypatch.setattr(jobs_module, "fit_or_distill", staged)
    a = replica("replica-a")
    started = asyncio.run(bootstrapped(a, DIRECTIONS))
    assert [(j.method, j.shadow, j.activate) for j in started] == [("kv-ridge", False, True)] * 2 + [
        ("distilled", True, False)] * 2  # fmt: skip
    assert all(j.status == "done" and a.get(j.id).shadow == j.shadow for j in started)
    # every first-stage fit before any distillation; each distillation from its direction's active KV Ridge
    assert staged.fits == [
        ("kv-ridge", None, DIRECTIONS[0]), ("kv-ridge", None, DIRECTIONS[1]),
        ("distilled", "kv-ridge-bootstrap", DIRECTIONS[0]), ("distilled", "kv-ridge-bootstrap", DIRECTIONS[1]),
    ]  # fmt: skip
    with a.db.session() as session:
        status = {(r.sender_name, r.receiver_name, r.method): r.status for r in versions.list_adapters(session=session)}
        audit = versions.audit_log(session=session)
    assert status == {(s, r, "kv-ridge"): "active" for s, r in DIRECTIONS} | {
        (s, r, "distilled"): "shadow" for s, r in DIRECTIONS}  # fmt: skip
    assert sum(x.action == "shadow" and x.actor == "bootstrap" for x in audit) == 2
    # a restart: nothing left to fit
    assert asyncio.run(bootstrapped(replica("replica-b"), DIRECTIONS)) == []
    assert len(staged.fits) == 4


@pytest.mark.models
def test_a_token_rank_distillation_fits_its_own_start_not_the_active_ridge(
    replica: Callable[..., FitJobs], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``distill.token_rank``, the shadow distillation is asked for a token-map start at that
    rank and given no start (the active KV Ridge map reads no tokens); the first stage is not."""
    staged = Staged()
    ranks: list[tuple[str, int]] = []

    async def recording(sender: LocalEngine, receiver: LocalEngine, **kwargs: Any) -> Adapter:
        ranks.append((kwargs["method"], kwargs["token_rank"]))
        return await staged(sender, receiver, **kwargs)

    monkeypatch.setattr(jobs_module, "fit_or_distill", recording)
    a = replica("replica-t", distill=DistillSettings(token_rank=256))
    asyncio.run(bootstrapped(a, DIRECTIONS[:1]))
    assert ranks == [("kv-ridge", 0), ("distilled", 256)]
    assert staged.fits == [("kv-ridge", None, DIRECTIONS[0]), ("distilled", None, DIRECTIONS[0])]


def test_fit_or_distill_refuses_a_token_rank_it_would_not_use() -> None:
    from harness.fit_on_engines import fit_or_distill

    for kwargs in ({"method": "kv-ridge"}, {"method": "distilled", "start": object()}):
        with pytest.raises(ValueError, match="token_rank"):
            asyncio.run(fit_or_distill(None, None, texts=[], seed=0, version="v", token_rank=8, **kwargs))  # type: ignore[arg-type]


@pytest.mark.models
def test_a_shadow_stage_for_a_direction_with_no_active_version_is_promoted_at_once(
    replica: Callable[..., FitJobs], monkeypatch: pytest.MonkeyPatch
) -> None:
    staged = Staged()
    monkeypatch.setattr(jobs_module, "fit_or_distill", staged)
    a = replica("replica-a")
    with a.db.session() as session:  # the direction's KV Ridge job is done elsewhere, yet no version serves it
        session.add(FitJobRow(id=bootstrap_id("kv-ridge", *fingerprints(a, DIRECTIONS[0])),
                              sender_name=SMOL, receiver_name=GEMMA, method="kv-ridge", status="done"))  # fmt: skip
    (job,) = asyncio.run(bootstrapped(a, DIRECTIONS[:1]))  # the KV Ridge job's id is taken: only the distillation
    assert (job.method, job.shadow, job.status) == ("distilled", True, "done")
    assert staged.fits == [("distilled", None, DIRECTIONS[0])]  # no active KV Ridge to start from: fits its own
    with a.db.session() as session:
        (row,) = versions.list_adapters(session=session)
    assert (row.method, row.status) == ("distilled", "active")


def fingerprints(jobs: FitJobs, direction: tuple[str, str]) -> tuple[str, str]:
    return jobs.pool[direction[0]].engine.spec.fingerprint, jobs.pool[direction[1]].engine.spec.fingerprint


# Admin API and dashboard of a real gateway --------------------------------------------------------


def wait_status(admin: httpx.Client, job_id: str, statuses: tuple[str, ...], timeout_s: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while (job := admin.get(f"/admin/fits/{job_id}").json())["status"] not in statuses:
        assert time.monotonic() < deadline, job
        time.sleep(0.05)
    result: dict[str, Any] = job
    return result


@pytest.mark.models
def test_admin_api_lists_and_cancels_a_running_fit_which_ends_cancelled(
    start_gateway: Callable[..., Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    fit = Steps(steps=100_000, step_s=0.01)
    monkeypatch.setattr(jobs_module, "fit_or_distill", fit)
    gateway = start_gateway(bootstrap=RETRY)
    with gateway.http() as admin:
        job = admin.post("/admin/fits", json=FIT).json()
        assert job["replica"] == gateway.services.jobs.replica and job["cancel_requested"] is False
        wait_status(admin, job["id"], ("running",))
        listed = admin.get("/admin/fits", params={"limit": 5}).json()
        assert [(j["id"], j["replica"], j["stale"]) for j in listed] == [(job["id"], job["replica"], False)]
        r = admin.post(f"/admin/fits/{job['id']}/cancel")
        assert r.status_code == 200 and r.json()["cancel_requested"] is True
        ended = wait_status(admin, job["id"], ("done", "failed", "cancelled"), timeout_s=30)
        assert ended["status"] == "cancelled" and ended["attempts"] == 1 and ended["error"] is None
        r = admin.post(f"/admin/fits/{job['id']}/cancel")
        assert r.status_code == 409 and r.json()["error"]["code"] == "conflict"
        r = admin.post("/admin/fits/nope/cancel")
        assert r.status_code == 404 and r.json()["error"]["message"] == "no fit job nope"
        assert admin.get("/admin/fits", params={"limit": 0}).status_code == 400
    assert len(fit.started) == 1 and fit_failed_events(gateway) == [] and fit_failures(gateway) == 0.0


@pytest.mark.models
def test_dashboard_lists_every_replicas_fit_jobs_and_cancels_one_from_its_page(
    start_gateway: Callable[..., Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(jobs_module, "fit_or_distill", Steps(steps=100_000, step_s=0.01))
    gateway = start_gateway()
    with gateway.services.db.session() as session:  # a job another replica ran
        session.add(FitJobRow(id="b" * 32, sender_name=GEMMA, receiver_name=SMOL, method="kv-ridge",
                              replica="other-host:7", version="v-elsewhere", status="done", done=4,
                              total=4))  # fmt: skip
    with gateway.http() as admin:
        job_id = admin.post("/admin/fits", json={**FIT, "version": "v-here"}).json()["id"]
        wait_status(admin, job_id, ("running",))
    with httpx.Client(base_url=gateway.url, timeout=60) as client:
        page = client.get("/dashboard/adapters").text
        jobs = page.split('id="jobs"', 1)[1].split("</table>", 1)[0]
        assert "<h2>Fit jobs</h2>" in page and "on this replica" not in page
        assert f'served by replica <code id="this-replica">{gateway.services.jobs.replica}</code>' in page
        assert "v-elsewhere" in jobs and "other-host:7" in jobs and "v-here" in jobs and "(this one)" in jobs
        assert "Sign in" in client.get(f"/dashboard/fits/{job_id}").text  # no cancel without a session
        r = client.post("/dashboard/login", data={"key": ADMIN_KEY, "next": f"/dashboard/fits/{job_id}"})
        assert r.status_code == 303
        page = client.get(f"/dashboard/fits/{job_id}").text
        assert f'action="/dashboard/fits/{job_id}/cancel"' in page
        match = re.search(r'id="job-cancel">\s*<input type="hidden" name="csrf" value="([0-9a-f]+)"', page)
        assert match is not None, page
        r = client.post(f"/dashboard/fits/{job_id}/cancel", data={"csrf": "wrong"})
        assert r.status_code == 403 and gateway.services.jobs.get(job_id).status == "running"
        r = client.post(f"/dashboard/fits/{job_id}/cancel", data={"csrf": match.group(1)})
        assert r.status_code == 303 and r.headers["location"].startswith(f"/dashboard/fits/{job_id}?notice=")
        assert "Cancel requested" in client.get(r.headers["location"]).text
        with gateway.http() as admin:
            assert wait_status(admin, job_id, ("done", "failed", "cancelled"), 30)["status"] == "cancelled"
        page = client.get(f"/dashboard/fits/{job_id}").text
        assert 'id="job-cancel"' not in page and 'id="job-status">cancelled<' in page
        r = client.post(f"/dashboard/fits/{'b' * 32}/cancel", data={"csrf": match.group(1)})
        assert r.status_code == 409 and "already done" in r.text
