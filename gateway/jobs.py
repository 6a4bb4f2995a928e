"""Adapter fit jobs: started from the admin API (or at first start), run one at a time in the
background, progress kept in memory and in the ``fit_jobs`` table. A finished fit is saved under
``adapters_dir`` and registered as a ``candidate``; a bootstrap fit for a pair with no active
version is promoted at once (actor ``bootstrap``).

A fit that raises runs again, up to ``retries`` more times, after ``backoff_s`` doubled per attempt
(the job stays ``running`` meanwhile, and keeps its place: jobs queued behind it wait). After the
last attempt the job is ``failed``, a ``fit.failed`` event goes to the store and
``heterofold_fit_failures_total{method}`` counts it. A fit cancelled because the gateway is stopping
(``FitCancelled``) is ``failed`` at once, without a retry or an alert.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from engines.fitting import default_corpus, fit_direction
from engines.local import LocalEngine
from gateway.adapters import AdapterResolver
from gateway.artifacts import new_folder
from gateway.background import Background
from gateway.engine_pool import EnginePool
from gateway.errors import FitCancelled, InvalidRequest, NotFound
from gateway.metrics import Metrics
from gateway.registry import adapters as repo
from gateway.registry.db import Database
from gateway.registry.tables import FitJobRow
from store.events import EventLog

log = logging.getLogger(__name__)
EVENT_ERROR_CHARS = 500  # of the error message in a fit.failed event


@dataclass
class Job:
    id: str
    sender: str  # engine names
    receiver: str
    method: str
    docs: int
    max_tokens: int
    version: str
    activate: bool = False
    status: str = "queued"  # queued, running, done, failed
    stage: str = ""
    done: int = 0
    total: int = 0
    attempts: int = 0  # fits started so far, the running one included
    error: str | None = None  # the last attempt's, while it is retried; none once one succeeds
    adapter_id: int | None = None
    started: float = field(default_factory=time.time)

    def view(self) -> dict[str, Any]:
        out = asdict(self)
        out["progress"] = round(self.done / self.total, 3) if self.total else 0.0
        return out


class FitJobs:
    def __init__(self, *, db: Database, pool: EnginePool, resolver: AdapterResolver, adapters_dir: Path,
                 background: Background, events: EventLog, metrics: Metrics, retries: int = 0,
                 backoff_s: float = 0.0) -> None:  # fmt: skip
        if retries < 0 or backoff_s < 0:
            raise ValueError("retries and backoff_s must not be negative")
        self.db = db
        self.pool = pool
        self.resolver = resolver
        self.adapters_dir = adapters_dir
        self.background = background
        self.events = events
        self.metrics = metrics
        self.retries = retries
        self.backoff_s = backoff_s
        self.jobs: dict[str, Job] = {}
        self._one_at_a_time = asyncio.Lock()
        self._stopping = threading.Event()

    def stop(self) -> None:
        """Make running fits give up (their threads would otherwise hold the process for minutes)."""
        self._stopping.set()

    def start(self, *, sender: str, receiver: str, method: str, docs: int, max_tokens: int,
              version: str | None = None, activate: bool = False) -> Job:  # fmt: skip
        for name in (sender, receiver):
            if not isinstance(self.pool[name].engine, LocalEngine):
                raise InvalidRequest(f"engine {name} is not a local engine; fit it where it runs")
        if sender == receiver:
            raise InvalidRequest("sender and receiver must be different engines")
        if method not in ("heterofold", "kv-ridge"):
            raise InvalidRequest(f"unknown method {method!r}: heterofold or kv-ridge", param="method")
        job_id = uuid.uuid4().hex
        label = version or f"{method}-{time.strftime('%Y%m%d-%H%M%S')}-{job_id[:6]}"
        job = Job(job_id, sender, receiver, method, docs, max_tokens, label, activate)
        self.jobs[job_id] = job
        self._save(job)
        self.background.spawn(self._run(job), f"fit:{sender}->{receiver}")
        return job

    def get(self, job_id: str) -> Job:
        if job_id not in self.jobs:
            raise NotFound(f"no fit job {job_id} on this replica")
        return self.jobs[job_id]

    def _save(self, job: Job) -> None:
        with self.db.session() as session:
            row = session.get(FitJobRow, job.id)
            if row is None:
                row = FitJobRow(id=job.id, sender_name=job.sender, receiver_name=job.receiver, method=job.method)
            row.status, row.stage, row.done, row.total = job.status, job.stage, job.done, job.total
            row.attempts = job.attempts
            row.error, row.adapter_id = job.error, job.adapter_id
            session.add(row)

    async def _run(self, job: Job) -> None:
        async with self._one_at_a_time:
            job.status = "running"
            for attempt in range(1, 2 + self.retries):
                job.attempts = attempt
                await asyncio.to_thread(self._save, job)
                try:
                    await asyncio.to_thread(self._fit, job)
                except FitCancelled as exc:
                    job.status, job.error = "failed", _describe(exc)
                    log.warning("fit job %s cancelled: %s", job.id, exc)
                    break
                except Exception as exc:
                    job.error = _describe(exc)
                    log.exception("fit job %s: attempt %d of %d failed", job.id, attempt, 1 + self.retries)
                    if attempt > self.retries or self._stopping.is_set():
                        await self._alert(job)  # before the status: whoever sees "failed" finds the alert
                        job.status = "failed"
                        break
                    delay = self.backoff_s * 2 ** (attempt - 1)
                    job.stage = f"attempt {attempt} failed; retrying in {delay:g} s"
                    await asyncio.to_thread(self._save, job)
                    await asyncio.sleep(delay)
                else:
                    job.status, job.error = "done", None
                    break
            await asyncio.to_thread(self._save, job)
            self.resolver.invalidate()

    async def _alert(self, job: Job) -> None:
        self.metrics.fit_failures.labels(job.method).inc()
        error = (job.error or "")[:EVENT_ERROR_CHARS]
        fields = {"sender": job.sender, "receiver": job.receiver, "method": job.method, "attempts": job.attempts,
                  "error": error}  # fmt: skip
        await asyncio.to_thread(self.events.emit_quietly, "fit.failed", time.time(), **fields)

    def _fit(self, job: Job) -> None:
        """On a worker thread with its own event loop: the fit's linear algebra must not block the
        gateway's loop; the engines' own inference threads serve both loops in turn."""
        sender, receiver = self.pool[job.sender].engine, self.pool[job.receiver].engine
        assert isinstance(sender, LocalEngine) and isinstance(receiver, LocalEngine)  # checked in start

        def progress(stage: str, done: int, total: int) -> None:
            if self._stopping.is_set():
                raise FitCancelled("the gateway is stopping")
            job.stage, job.done, job.total = stage, done, total

        progress("starting", 0, 0)  # a retry after stop() gives up here
        texts = default_corpus(0, job.docs)
        adapter = asyncio.run(
            fit_direction(sender, receiver, method=job.method, texts=texts, seed=0, version=job.version,
                          max_tokens=job.max_tokens, progress=progress)
        )  # fmt: skip
        folder = new_folder(self.adapters_dir, job.sender, job.receiver)
        sha = adapter.save(folder)
        m = adapter.manifest
        with self.db.session() as session:
            row = repo.create_adapter(
                session=session, sender_name=m.sender.name, receiver_name=m.receiver.name,
                sender_fingerprint=m.sender.fingerprint, receiver_fingerprint=m.receiver.fingerprint,
                version=m.version, method=m.method, artifact_path=str(folder), sha256=sha,
                metrics={**m.metrics, "fit": m.fit}, actor="fit",
            )  # fmt: skip
            if job.activate and not any(
                r.status == "active" and r.sender_fingerprint == row.sender_fingerprint
                and r.receiver_fingerprint == row.receiver_fingerprint
                for r in repo.serving(session=session, statuses=("active",))
            ):  # fmt: skip
                repo.promote(session=session, adapter_id=row.id, actor="bootstrap")
        job.adapter_id = row.id  # once committed: a failed promotion leaves no row behind to point at

    def bootstrap(self, *, method: str, docs: int, max_tokens: int, order: list[tuple[str, str]]) -> list[Job]:
        """Fit, in ``order``, every direction between configured engines that has no version yet."""
        with self.db.session() as session:
            have = {(r.sender_fingerprint, r.receiver_fingerprint) for r in repo.list_adapters(session=session)
                    if r.status != "retired"}  # fmt: skip
        jobs = []
        for s, r in order:
            pair = (self.pool[s].engine.spec.fingerprint, self.pool[r].engine.spec.fingerprint)
            if pair not in have:
                jobs.append(self.start(sender=s, receiver=r, method=method, docs=docs, max_tokens=max_tokens,
                                       version=f"{method}-bootstrap", activate=True))  # fmt: skip
        return jobs


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"
