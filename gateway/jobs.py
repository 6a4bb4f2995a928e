"""Adapter fit jobs, shared by every gateway replica through the ``fit_jobs`` table.

A job starts on any replica (admin API, dashboard, or the bootstrap at first start) and runs on
that one, in a worker thread, one fit at a time per replica. The table is the source of truth:
``get`` and ``list`` read it, so every replica shows every job with the ``replica`` that runs it.
While a job is queued or running its replica saves it every ``save_every_s`` (a heartbeat, kept
through long fit steps and the retry backoff) and at once on a stage or status change. A queued
or running job whose row is older than ``stale_after_s`` is shown as it was with ``stale: true``:
its replica is gone (replicas compare their clocks with the rows' times: keep them in step).

``cancel`` works from any replica. A queued job is ``cancelled`` at once and never starts; a
running one gets ``cancel_requested``, which its replica reads with its next save (within about
``save_every_s``) and stops the fit with ``FitCancelled``: the job ends ``cancelled``, without a
retry or an alert. A stale job has no replica left to read the flag, so it is ``cancelled`` at once.

A finished fit is saved under ``adapters_dir`` and registered as a ``candidate``; a bootstrap fit for
a pair with no active version is promoted at once (actor ``bootstrap``). The bootstrap's second stage
(``bootstrap.then``) registers its version in ``shadow``, where paired shadow evaluation
(``gateway/shadow.py``) promotes it if it beats the active one on live requests; a ``distilled``
second stage starts from the pair's active KV Ridge map rather than fitting one again. A bootstrap job has one id
per (method, sender fingerprint, receiver fingerprint) and is claimed in the database before it
starts, so replicas that start together fit each direction once; a claim takes over a failed,
cancelled or stale job of that id, never a live or a done one.

A fit that raises runs again, up to ``retries`` more times, after ``backoff_s`` doubled per attempt
(the job stays ``running`` meanwhile, and keeps its place: jobs queued behind it wait). After the
last attempt the job is ``failed``, a ``fit.failed`` event goes to the store and
``heterofold_fit_failures_total{method}`` counts it, before the status reads failed. Stopping the
gateway is no user cancel: the replica's queued and running jobs end ``failed`` with the error
``FitCancelled: the gateway is stopping``, without a retry or an alert.
"""

from __future__ import annotations

import asyncio
import builtins
import hashlib
import logging
import os
import socket
import threading
import time
import uuid
from contextlib import suppress
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from engines.local import LocalEngine
from gateway.artifacts import new_folder
from gateway.background import Background
from gateway.engine_pool import EnginePool
from gateway.errors import FitCancelled, InvalidRequest, RegistryError
from gateway.metrics import Metrics
from gateway.registry import fit_jobs as rows
from gateway.registry import versions
from gateway.registry.db import Database
from gateway.registry.fit_jobs import ACTIVE
from gateway.registry.tables import FitJobRow, utcnow
from gateway.resolver import AdapterResolver
from gateway.settings import DistillSettings
from harness.fit_on_engines import METHODS, default_corpus, fit_or_distill
from heterofold.adapter import Adapter
from heterofold.errors import HeteroFoldError
from store.events import EventLog

log = logging.getLogger(__name__)
EVENT_ERROR_CHARS = 500  # of the error message in a fit.failed event
STOPPING = "the gateway is stopping"
CANCELLED = "cancelled on request"


def default_replica() -> str:
    """This process as the other replicas see it: host name and pid."""
    return f"{socket.gethostname()}:{os.getpid()}"


def bootstrap_id(method: str, sender_fingerprint: str, receiver_fingerprint: str) -> str:
    """The one job id a direction's bootstrap fit has on every replica."""
    key = f"bootstrap\0{method}\0{sender_fingerprint}\0{receiver_fingerprint}"
    return hashlib.sha256(key.encode()).hexdigest()[:32]


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
    shadow: bool = False  # its version goes to shadow (a distillation starts from the pair's active KV Ridge)
    status: str = "queued"  # queued, running, done, failed, cancelled
    stage: str = ""
    done: int = 0
    total: int = 0
    attempts: int = 0  # fits started so far, the running one included
    error: str | None = None  # the last attempt's, while it is retried; none once one succeeds
    adapter_id: int | None = None
    started: float = field(default_factory=time.time)
    replica: str = ""  # the gateway that runs it
    cancel_requested: bool = False
    stale: bool = False  # queued or running, but its replica stopped saving it

    def view(self) -> dict[str, Any]:
        out = asdict(self)
        out["progress"] = round(self.done / self.total, 3) if self.total else 0.0
        return out

    @classmethod
    def from_row(cls, row: FitJobRow, stale_before: datetime) -> Job:
        return cls(
            id=row.id, sender=row.sender_name, receiver=row.receiver_name, method=row.method, docs=row.docs,
            max_tokens=row.max_tokens, version=row.version, activate=row.activate, shadow=row.shadow, status=row.status,
            stage=row.stage, done=row.done, total=row.total, attempts=row.attempts, error=row.error,
            adapter_id=row.adapter_id, started=rows.aware(row.created_at).timestamp(), replica=row.replica,
            cancel_requested=row.cancel_requested, stale=rows.is_stale(row, stale_before),
        )  # fmt: skip


class FitJobs:
    def __init__(self, *, db: Database, pool: EnginePool, resolver: AdapterResolver, adapters_dir: Path,
                 background: Background, events: EventLog, metrics: Metrics, retries: int = 0,
                 backoff_s: float = 0.0, replica: str | None = None, stale_after_s: float = 120.0,
                 save_every_s: float = 1.0, distill: DistillSettings | None = None) -> None:  # fmt: skip
        if retries < 0 or backoff_s < 0:
            raise ValueError("retries and backoff_s must not be negative")
        if not 0 < save_every_s < stale_after_s:
            raise ValueError("save_every_s must be positive and under stale_after_s")
        self.db = db
        self.pool = pool
        self.resolver = resolver
        self.adapters_dir = adapters_dir
        self.background = background
        self.events = events
        self.metrics = metrics
        self.retries = retries
        self.backoff_s = backoff_s
        self.replica = replica or default_replica()
        if len(self.replica) > 200:
            raise ValueError("replica must be at most 200 characters")
        self.stale_after_s = stale_after_s
        self.save_every_s = save_every_s
        self.distill = distill or DistillSettings()  # how a ``distilled`` job distils its KV Ridge map
        self.jobs: dict[str, Job] = {}  # the jobs this replica runs, as its runner sees them
        self._one_at_a_time = asyncio.Lock()
        self._stopping = threading.Event()
        self._heartbeat: asyncio.Task[Any] | None = None

    def stop(self) -> None:
        """Make running fits give up (their threads would otherwise hold the process for minutes)."""
        self._stopping.set()

    def start(self, *, sender: str, receiver: str, method: str, docs: int, max_tokens: int,
              version: str | None = None, activate: bool = False) -> Job:  # fmt: skip
        self._check(sender, receiver, method)
        job_id = uuid.uuid4().hex
        label = version or f"{method}-{time.strftime('%Y%m%d-%H%M%S')}-{job_id[:6]}"
        job = Job(job_id, sender, receiver, method, docs, max_tokens, label, activate, replica=self.replica)
        with self.db.session() as session:
            session.add(_new_row(job))
        self._launch(job)
        return job

    def get(self, job_id: str) -> Job:
        """Any replica's job, as its row reads now. Raises NotFound."""
        with self.db.session() as session:
            return Job.from_row(rows.get(session=session, job_id=job_id), self._stale_before())

    def list(self, *, limit: int = 50) -> builtins.list[Job]:
        """The newest ``limit`` jobs of every replica, newest first."""
        with self.db.session() as session:
            before = self._stale_before()
            return [Job.from_row(row, before) for row in rows.recent(session=session, limit=limit)]

    def cancel(self, job_id: str) -> Job:
        """Cancel any replica's queued or running job (see the module docstring); the job as it
        reads after. Raises NotFound, or Conflict for a job that already ended."""
        before = self._stale_before()
        with self.db.session() as session:
            job = Job.from_row(rows.cancel(session=session, job_id=job_id, stale_before=before), before)
        mine = self.jobs.get(job_id)
        if mine is not None:  # this replica runs it: no need to wait for the next save
            _note_cancel(mine, job.status)
        return job

    def bootstrap(
        self, *, method: str, docs: int, max_tokens: int, order: builtins.list[tuple[str, str]],
        then: str | None = None,
    ) -> builtins.list[Job]:  # fmt: skip
        """Fit, in ``order``, every direction between configured engines that has no version yet,
        unless another replica has claimed it; then, with ``then``, a second fit of that method for
        every direction that has no version of it, registered in ``shadow`` (promoted at once only
        where the direction still has no active version), after every first-stage fit. The jobs
        this replica started."""
        if then is not None:
            self._check_method(then)
        with self.db.session() as session:
            kept = [r for r in versions.list_adapters(session=session) if r.status != "retired"]
        have = {(r.sender_fingerprint, r.receiver_fingerprint) for r in kept}
        have_then = {(r.sender_fingerprint, r.receiver_fingerprint) for r in kept if r.method == then}
        stages = [(method, have, False)] + ([(then, have_then, True)] if then and then != method else [])
        jobs = []
        for stage_method, skip, shadow in stages:
            for s, r in order:
                pair = (self.pool[s].engine.spec.fingerprint, self.pool[r].engine.spec.fingerprint)
                if pair in skip:
                    continue
                self._check(s, r, stage_method)
                job = Job(bootstrap_id(stage_method, *pair), s, r, stage_method, docs, max_tokens,
                          f"{stage_method}-bootstrap", not shadow, shadow, replica=self.replica)  # fmt: skip
                with self.db.session() as session:
                    claimed = rows.claim(session=session, row=_new_row(job), stale_before=self._stale_before())
                if not claimed:
                    log.info("bootstrap fit %s -> %s (job %s) is another replica's: skipped", s, r, job.id)
                    continue
                self._launch(job)
                jobs.append(job)
        return jobs

    def _check(self, sender: str, receiver: str, method: str) -> None:
        for name in (sender, receiver):
            if not isinstance(self.pool[name].engine, LocalEngine):
                raise InvalidRequest(f"engine {name} is not a local engine; fit it where it runs")
        if sender == receiver:
            raise InvalidRequest("sender and receiver must be different engines")
        self._check_method(method)

    @staticmethod
    def _check_method(method: str) -> None:
        if method not in METHODS:
            raise InvalidRequest(f"unknown method {method!r}: {', '.join(METHODS)}", param="method")

    def _stale_before(self) -> datetime:
        return utcnow() - timedelta(seconds=self.stale_after_s)

    def _launch(self, job: Job) -> None:
        self.jobs[job.id] = job
        self.background.spawn(self._run(job), f"fit:{job.sender}->{job.receiver}")
        if self._heartbeat is None or self._heartbeat.done():
            self._heartbeat = self.background.spawn(self._beat(), "fit-heartbeat")

    def _write(self, session: Session, job: Job) -> bool:
        """Save the runner's view of ``job`` unless its row already ended; whether to carry on
        (False once a cancel was asked for, from any replica)."""
        row = session.get(FitJobRow, job.id, with_for_update=True)
        if row is None or row.status not in ACTIVE:  # ended elsewhere: a cancel, or the runner's last save
            if row is None or row.status == "cancelled":
                _note_cancel(job, "cancelled")
            return False
        row.status, row.stage, row.done, row.total = job.status, job.stage, job.done, job.total
        row.attempts, row.error, row.adapter_id = job.attempts, job.error, job.adapter_id
        row.updated_at = utcnow()  # also when nothing else changed: the heartbeat
        if row.cancel_requested:
            _note_cancel(job, row.status)
        return not row.cancel_requested

    def _save(self, job: Job) -> bool:
        with self.db.session() as session:
            return self._write(session, job)

    def _save_quietly(self, job: Job) -> bool:
        """A progress save: one the registry misses is logged, and the next one catches up."""
        try:
            return self._save(job)
        except RegistryError as exc:
            log.warning("fit job %s: progress not saved: %s", job.id, exc)
            return not job.cancel_requested

    async def _beat(self) -> None:
        """Save this replica's queued and running jobs every ``save_every_s`` until none is left:
        the heartbeat that keeps them from reading stale, and how a running fit learns of a cancel."""
        while active := [job for job in self.jobs.values() if job.status in ACTIVE]:
            await asyncio.sleep(self.save_every_s)
            try:
                await asyncio.to_thread(self._save_all, active)
            except RegistryError as exc:
                log.warning("fit jobs: heartbeat not saved: %s", exc)

    def _save_all(self, jobs: builtins.list[Job]) -> None:
        with self.db.session() as session:
            for job in jobs:
                self._write(session, job)

    async def _run(self, job: Job) -> None:
        try:
            async with self._one_at_a_time:
                await self._attempts(job)
        except asyncio.CancelledError:  # the gateway stops (Background.aclose): no user cancel
            if job.status in ACTIVE:
                job.status, job.error = "failed", f"FitCancelled: {STOPPING}"
                with suppress(RegistryError):
                    self._save(job)  # on the loop: it is closing, and a stopped job must not read running
            raise
        except RegistryError as exc:  # a status save failed: the heartbeat must not keep a dead job alive
            log.exception("fit job %s: the registry failed", job.id)
            job.error = _describe(exc)
            await self._alert(job)
            job.status = "failed"
            with suppress(RegistryError):
                await asyncio.to_thread(self._save, job)

    async def _attempts(self, job: Job) -> None:
        job.status = "running"
        if not await asyncio.to_thread(self._save, job):  # cancelled while queued: it never starts
            job.status = "cancelled"
            await asyncio.to_thread(self._save, job)  # a no-op unless its row still reads running
            return
        for attempt in range(1, 2 + self.retries):
            job.attempts = attempt
            await asyncio.to_thread(self._save, job)
            try:
                await asyncio.to_thread(self._fit, job)
            except FitCancelled as exc:
                log.warning("fit job %s cancelled: %s", job.id, exc)
                job.status, job.error = ("cancelled", None) if job.cancel_requested else ("failed", _describe(exc))
                break
            except Exception as exc:
                job.error = _describe(exc)
                log.exception("fit job %s: attempt %d of %d failed", job.id, attempt, 1 + self.retries)
                if job.cancel_requested:  # asked to stop meanwhile: no retry, no alert
                    job.status = "cancelled"
                    break
                if attempt > self.retries or self._stopping.is_set():
                    await self._alert(job)  # before the status: whoever sees "failed" finds the alert
                    job.status = "failed"
                    break
                delay = self.backoff_s * 2 ** (attempt - 1)
                job.stage = f"attempt {attempt} failed; retrying in {delay:g} s"
                await asyncio.to_thread(self._save, job)
                if not await self._wait(job, delay):
                    job.status, job.error = "cancelled", None
                    break
            else:
                job.status, job.error = "done", None
                break
        await asyncio.to_thread(self._save, job)
        self.resolver.invalidate()

    async def _wait(self, job: Job, delay: float) -> bool:
        """Sleep ``delay`` (the heartbeat keeps saving); False as soon as a cancel is asked for."""
        deadline = time.monotonic() + delay
        while not job.cancel_requested and (left := deadline - time.monotonic()) > 0:
            await asyncio.sleep(min(left, self.save_every_s))
        return not job.cancel_requested

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
                raise FitCancelled(STOPPING)
            if job.cancel_requested:  # read from the row by the heartbeat, every save_every_s
                raise FitCancelled(CANCELLED)
            changed = stage != job.stage
            job.stage, job.done, job.total = stage, done, total
            if changed and not self._save_quietly(job):
                raise FitCancelled(CANCELLED)

        progress("starting", 0, 0)  # a retry after stop() or a cancel gives up here
        texts = default_corpus(0, job.docs)
        own_start = job.method == "distilled" and self.distill.token_rank > 0  # a token map, fitted here
        reuse = job.shadow and job.method == "distilled" and not own_start  # the direction's active KV Ridge
        start = self._active_ridge(sender, receiver) if reuse else None
        adapter = asyncio.run(
            fit_or_distill(sender, receiver, method=job.method, texts=texts, seed=0, version=job.version,
                           max_tokens=job.max_tokens, distill_docs=self.distill.docs, distill_steps=self.distill.steps,
                           distill_path=self.distill.path, distill_lr=self.distill.lr, distill_clip=self.distill.clip,
                           token_rank=self.distill.token_rank if own_start else 0, progress=progress, start=start)
        )  # fmt: skip
        folder = new_folder(self.adapters_dir, job.sender, job.receiver)
        sha = adapter.save(folder)
        m = adapter.manifest
        with self.db.session() as session:
            row = versions.create_adapter(
                session=session, sender_name=m.sender.name, receiver_name=m.receiver.name,
                sender_fingerprint=m.sender.fingerprint, receiver_fingerprint=m.receiver.fingerprint,
                version=m.version, method=m.method, artifact_path=str(folder), sha256=sha,
                metrics={**m.metrics, "fit": m.fit}, actor="fit",
            )  # fmt: skip
            unserved = not any(
                r.status == "active" and r.sender_fingerprint == row.sender_fingerprint
                and r.receiver_fingerprint == row.receiver_fingerprint
                for r in versions.serving(session=session, statuses=("active",))
            )  # fmt: skip
            if (job.activate or job.shadow) and unserved:
                versions.promote(session=session, adapter_id=row.id, actor="bootstrap")
            elif job.shadow:
                versions.set_shadow(session=session, adapter_id=row.id, actor="bootstrap")
        job.adapter_id = row.id  # once committed: a failed promotion leaves no row behind to point at

    def _active_ridge(self, sender: LocalEngine, receiver: LocalEngine) -> Adapter | None:
        """The pair's active version when it is a KV Ridge map whose artifact loads: where a shadow
        distillation starts, instead of fitting KV Ridge again (None: it fits its own)."""
        s, r = sender.spec.fingerprint, receiver.spec.fingerprint
        with self.db.session() as session:
            active = next((a for a in versions.serving(session=session, statuses=("active",))
                           if a.sender_fingerprint == s and a.receiver_fingerprint == r), None)  # fmt: skip
        if active is None or active.method != "kv-ridge":
            return None
        try:
            return Adapter.load(Path(active.artifact_path), sender_fingerprint=s, receiver_fingerprint=r)
        except HeteroFoldError as exc:
            log.warning("active KV Ridge %s does not load (%s): the distillation fits its own", active.version, exc)
            return None


def _new_row(job: Job) -> FitJobRow:
    return FitJobRow(
        id=job.id, sender_name=job.sender, receiver_name=job.receiver, method=job.method, replica=job.replica,
        version=job.version, docs=job.docs, max_tokens=job.max_tokens, activate=job.activate, shadow=job.shadow,
        status=job.status,
        created_at=datetime.fromtimestamp(job.started, UTC), updated_at=utcnow(),
    )  # fmt: skip


def _note_cancel(job: Job, row_status: str) -> None:
    """A cancel this replica learnt of: the fit stops at its next progress step; a job still
    queued reads cancelled at once (its row already does)."""
    job.cancel_requested = True
    if row_status == "cancelled" and job.status == "queued":
        job.status = "cancelled"


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"
