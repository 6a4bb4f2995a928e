"""Fit jobs that raise: retried with backoff, then failed with a ``fit.failed`` alert and a counted
failure; a cancelled fit is not retried; the ``heterofold run`` summary of the bootstrap fits.

The fit itself (``engines.fitting.fit_direction``, minutes of CPU) is swapped for one that raises,
or returns a small random adapter of the right shapes: the retry logic is under test, not fitting.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from cli.gateway import fit_summary
from engines.local import LocalEngine
from gateway import jobs as jobs_module
from gateway.errors import FitCancelled
from gateway.jobs import Job
from gateway.registry.tables import FitJobRow
from gateway.settings import BootstrapSettings
from heterofold.adapter import Adapter
from tests.gateway.conftest import GEMMA, SMOL, Gateway
from tests.gateway.helpers import small_adapter

RETRY = BootstrapSettings(fit_retries=2, fit_retry_backoff_s=0.01)
FIT = {"sender": SMOL, "receiver": GEMMA, "method": "kv-ridge", "docs": 2, "max_tokens": 96}
Fit = Callable[..., Any]


def fit_failing(times: int, error: Exception) -> tuple[Fit, list[int]]:
    """A stand-in for ``fit_direction`` that raises ``error`` on its first ``times`` calls, then
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
    monkeypatch.setattr(jobs_module, "fit_direction", fit)
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
