"""The gateway's shared objects, built once in the app's lifespan and closed with it.

store ─┬─ conversations ─┐
pool ──┼─ resolver ──────┼─ planner ─┬─ chat
db ────┘                 └─ shadow ──┘
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from engines.zoo import Zoo
from gateway.adapters import AdapterResolver
from gateway.auth import KeyRing
from gateway.background import Background
from gateway.chat import ChatService
from gateway.conversations import Conversations
from gateway.engine_pool import EnginePool
from gateway.hop import Fallbacks, HopPlanner
from gateway.jobs import FitJobs
from gateway.metrics import Metrics
from gateway.registry import adapters as repo
from gateway.registry import db as registry_db
from gateway.registry.db import Database
from gateway.request_log import RequestLog
from gateway.settings import Settings
from gateway.shadow import ShadowEvaluator
from gateway.turns import TurnRecorder
from store.errors import StoreError
from store.kv_store import KVStore

log = logging.getLogger(__name__)


@dataclass
class Services:
    settings: Settings
    keys: KeyRing
    metrics: Metrics
    store: KVStore
    db: Database
    pool: EnginePool
    resolver: AdapterResolver
    chat: ChatService
    jobs: FitJobs
    background: Background
    requests: RequestLog
    event_tail: asyncio.Task[None] | None = None

    async def aclose(self) -> None:
        if self.event_tail is not None:
            self.event_tail.cancel()
        self.jobs.stop()
        await self.background.aclose()
        await self.pool.aclose()
        self.db.close()
        await asyncio.to_thread(self.store.close)


async def build_services(settings: Settings, *, pool: EnginePool | None = None) -> Services:
    """Everything the routes need. ``pool`` lets tests share loaded engines between apps."""
    keys = KeyRing([k.get_secret_value() for k in settings.auth.client_keys],
                   settings.auth.admin_key.get_secret_value() if settings.auth.admin_key else None)  # fmt: skip
    metrics = Metrics()
    if settings.migrate_on_start:
        await asyncio.to_thread(registry_db.upgrade, settings.registry_url)
    db = Database(settings.registry_url)
    store = await asyncio.to_thread(KVStore, settings.store_config())
    if pool is None:
        pool = await EnginePool.load(settings.engines, Zoo(settings.cache_dir))
        await pool.warm()
    await asyncio.to_thread(_register_models, db, pool)
    metrics.watch_tiers(lambda: [(u.tier, u.used, u.budget) for u in store.usage()])
    background = Background()
    resolver = AdapterResolver(db)
    conversations = Conversations(store.client, prefix=settings.store_config().key_prefix,
                                  ttl_s=settings.store.conversation_ttl_s)  # fmt: skip
    fallbacks = Fallbacks(store, metrics, background)

    def name_of(fingerprint: str) -> str | None:
        p = pool.by_fingerprint(fingerprint)
        return p.name if p else None

    planner = HopPlanner(store=store, conversations=conversations, resolver=resolver, fallbacks=fallbacks,
                         names=name_of)  # fmt: skip
    shadow = ShadowEvaluator(settings=settings.shadow, db=db, resolver=resolver, store=store, metrics=metrics)
    requests = RequestLog(db, keep=settings.dashboard.requests_kept)
    recorder = TurnRecorder(store=store, conversations=conversations, metrics=metrics)
    chat = ChatService(
        settings=settings, pool=pool, planner=planner, recorder=recorder, shadow=shadow, resolver=resolver,
        fallbacks=fallbacks, store=store, metrics=metrics, background=background, journal=requests,
    )  # fmt: skip
    jobs = FitJobs(db=db, pool=pool, resolver=resolver, adapters_dir=settings.adapters_dir, background=background)
    services = Services(settings, keys, metrics, store, db, pool, resolver, chat, jobs, background, requests)
    services.event_tail = asyncio.get_running_loop().create_task(tail_events(store, metrics), name="event-tail")
    if settings.bootstrap.fit_missing:  # on the loop: the jobs are tasks of it (a few quick SQL reads)
        b = settings.bootstrap
        jobs.bootstrap(method=b.method, docs=b.docs, max_tokens=b.max_tokens, order=hop_directions(settings))
    return services


def hop_directions(settings: Settings) -> list[tuple[str, str]]:
    """Every ordered pair of distinct engines, in the order the roles are listed (planner ->
    executor -> summarizer first: the hops a pipeline takes), then the reverse hops."""
    engines = list(dict.fromkeys(role.engine for role in settings.roles.values()))
    forward = [(a, b) for i, a in enumerate(engines) for b in engines[i + 1 :]]
    forward.sort(key=lambda p: engines.index(p[1]) - engines.index(p[0]))
    return forward + [(b, a) for a, b in forward]


def _register_models(db: Database, pool: EnginePool) -> None:
    with db.session() as session:
        for p in pool:
            spec = p.engine.spec
            repo.upsert_model(session=session, name=spec.name, family=spec.family, fingerprint=spec.fingerprint)


async def tail_events(store: KVStore, metrics: Metrics, block_ms: int = 250) -> None:
    """Count the store's evictions and OOM alerts (raised inside the store) into the metrics. The
    block stays under the store client's socket timeout."""
    after = "$"
    while True:
        try:
            events = await asyncio.to_thread(store.events.read, after, 200, block_ms)
        except StoreError:
            await asyncio.sleep(1.0)
            continue
        for event in events:
            after = event.id
            if event.kind == "kv.evicted":
                metrics.evictions.labels(event.fields.get("reason", "")).inc()
            elif event.kind == "oom.alert":
                metrics.oom_alerts.labels(event.fields.get("reason", "")).inc()
