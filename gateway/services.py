"""The gateway's shared objects, built once in the app's lifespan and closed with it.

store ─┬─ conversations ─┐
pool ──┼─ resolver ──────┼─ planner ─┬─ chat
db ────┘                 └─ shadow ──┘
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy.exc import SQLAlchemyError

from engines.base import Engine
from engines.selectors import SCOUT, warm
from engines.zoo import Zoo
from gateway.accounting import TurnAccounting
from gateway.auth import KeyRing
from gateway.background import Background
from gateway.chat import ChatService
from gateway.conversations import Conversations
from gateway.engine_pool import EnginePool
from gateway.errors import RegistryError
from gateway.hop import Fallbacks, HopPlanner
from gateway.jobs import FitJobs
from gateway.metrics import Metrics
from gateway.registry import db as registry_db
from gateway.registry import versions
from gateway.registry.db import Database
from gateway.request_log import RequestLog
from gateway.resolver import AdapterResolver
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
    registry_connect: asyncio.Task[None] | None = None  # while the registry was unreachable at start

    async def aclose(self) -> None:
        for task in (self.event_tail, self.registry_connect):
            if task is not None:
                task.cancel()
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
    db = Database(settings.registry_url)
    # A configured Redis may come later (chat falls back to native meanwhile); the embedded one must start.
    store = await asyncio.to_thread(KVStore, settings.store_config(), wait_for_redis=True)
    if pool is None:
        pool = await EnginePool.load(settings.engines, Zoo(settings.cache_dir))
        await pool.warm()
    metrics.watch_tiers(lambda: [(u.tier, u.used, u.budget) for u in store.usage()])
    background = Background()
    metrics.watch_background(lambda: background.pending)
    resolver = AdapterResolver(db)
    conversations = Conversations(store.client, prefix=settings.store_config().key_prefix,
                                  ttl_s=settings.store.conversation_ttl_s)  # fmt: skip
    fallbacks = Fallbacks(store, metrics, background)

    def name_of(fingerprint: str) -> str | None:
        p = pool.by_fingerprint(fingerprint)
        return p.name if p else None

    def engine_of(fingerprint: str) -> Engine | None:
        p = pool.by_fingerprint(fingerprint)
        return p.engine if p else None

    for role in settings.roles.values():  # the meaning selector's table, read from the gateway's zoo
        auto = role.policy.path in (None, "auto")  # the auto path's request classifier reads it too
        for name in {role.policy.selector, *role.policy.sender_selectors.values()}:
            await asyncio.to_thread(warm, name, Zoo(settings.cache_dir), auto=auto)
    scout = next((p.engine for p in pool if p.engine.spec.name == SCOUT and hasattr(p.engine, "attention")),
                 None)  # fmt: skip
    planner = HopPlanner(store=store, conversations=conversations, resolver=resolver, fallbacks=fallbacks,
                         names=name_of, engines=engine_of, scout=scout)  # fmt: skip
    shadow = ShadowEvaluator(settings=settings.shadow, db=db, resolver=resolver, store=store, metrics=metrics)
    requests = RequestLog(db, keep=settings.dashboard.requests_kept)
    recorder = TurnRecorder(store=store, conversations=conversations, metrics=metrics)
    accounting = TurnAccounting(recorder=recorder, shadow=shadow, resolver=resolver, store=store, metrics=metrics,
                                background=background, journal=requests)  # fmt: skip
    chat = ChatService(settings=settings, pool=pool, planner=planner, accounting=accounting)
    b = settings.bootstrap
    jobs = FitJobs(
        db=db, pool=pool, resolver=resolver, adapters_dir=settings.adapters_dir, background=background,
        events=store.events, metrics=metrics, retries=b.fit_retries, backoff_s=b.fit_retry_backoff_s,
        replica=store.config.node,  # the name the dashboard's tier memory and the jobs table show
        distill=b.distill,
    )  # fmt: skip
    services = Services(settings, keys, metrics, store, db, pool, resolver, chat, jobs, background, requests)
    loop = asyncio.get_running_loop()
    services.event_tail = loop.create_task(tail_events(store, metrics), name="event-tail")

    def registry_ready() -> None:
        resolver.invalidate()
        if b.fit_missing:  # on the loop: the jobs are tasks of it (a few quick SQL reads)
            jobs.bootstrap(method=b.method, docs=b.docs, max_tokens=b.max_tokens, order=hop_directions(settings),
                           then=b.then)  # fmt: skip

    try:
        await connect_registry(settings, db, pool)
    except RegistryError as exc:
        log.warning("registry unreachable at start, serving chat natively and retrying every %g s: %s",
                    settings.registry_retry_s, exc)  # fmt: skip
        services.registry_connect = loop.create_task(
            keep_connecting(settings, db, pool, registry_ready), name="registry-connect"
        )
    else:
        registry_ready()
    return services


async def connect_registry(settings: Settings, db: Database, pool: EnginePool) -> None:
    """Migrations to head (unless ``migrate_on_start`` is off) and the engines' models in the
    registry. Raises RegistryError when the database cannot be reached or written."""
    if settings.migrate_on_start:
        try:
            await asyncio.to_thread(registry_db.upgrade, settings.registry_url)
        except (SQLAlchemyError, OSError) as exc:
            first = str(exc).splitlines()[0] if str(exc) else ""
            raise RegistryError(f"registry: migrations failed: {type(exc).__name__}: {first}") from exc
    await asyncio.to_thread(_register_models, db, pool, settings.registry_url)


async def keep_connecting(settings: Settings, db: Database, pool: EnginePool, ready: Callable[[], None]) -> None:
    """Until the registry answers: meanwhile chat runs (native and same-model paths; transfers
    through the registry's adapters fall back), and the admin API and readiness answer 503."""
    while True:
        await asyncio.sleep(settings.registry_retry_s)
        try:
            await connect_registry(settings, db, pool)
        except RegistryError as exc:
            log.info("registry still unreachable: %s", exc)
            continue
        log.warning("registry reachable again: connected")
        ready()
        return


def hop_directions(settings: Settings) -> list[tuple[str, str]]:
    """Every ordered pair of distinct engines, in the order the roles are listed (planner ->
    executor -> summarizer first: the hops a pipeline takes), then the reverse hops."""
    engines = list(dict.fromkeys(role.engine for role in settings.roles.values()))
    forward = [(a, b) for i, a in enumerate(engines) for b in engines[i + 1 :]]
    forward.sort(key=lambda p: engines.index(p[1]) - engines.index(p[0]))
    return forward + [(b, a) for a, b in forward]


def _register_models(db: Database, pool: EnginePool, url: str) -> None:
    """Upsert the engines' models, one replica at a time (replicas starting at once take turns)."""
    try:
        with registry_db.start_lock(url), db.session() as session:
            for p in pool:
                spec = p.engine.spec
                versions.upsert_model(session=session, name=spec.name, family=spec.family, fingerprint=spec.fingerprint)
    except (SQLAlchemyError, OSError) as exc:
        raise RegistryError(f"registry: models not registered: {type(exc).__name__}: {exc}") from exc


async def tail_events(store: KVStore, metrics: Metrics, block_ms: int = 250) -> None:
    """Count the store's evictions and OOM alerts (raised inside the store) into the metrics. The
    block stays under the store client's socket timeout. The cursor is a real id from the start: a
    read from ``$`` each time would miss the events written between two reads."""
    after: str | None = None
    while True:
        try:
            if after is None:
                after = await asyncio.to_thread(store.events.last_id)
            await asyncio.to_thread(store.events.flush)  # events kept while Redis was down
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
