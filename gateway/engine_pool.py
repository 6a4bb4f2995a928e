"""The engines named in the config, loaded once, with each one's measured prefill rate.

The prefill rate (ms per prompt token) seeds from a short prefill at start and then follows every
native prefill as a moving average; the usage block's ``prefill_ms_saved`` is estimated from it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass

from engines.base import Engine
from engines.local import LocalEngine
from engines.page_sink import PageSink
from engines.sglang import SGLangEngine
from engines.zoo import Zoo
from gateway.errors import UnknownRole
from gateway.settings import EngineSettings
from heterofold.corpus import stdlib_text
from store.connection import connect
from store.hicache.page_keys import PageKeys
from store.hicache.page_store import PageStore

WARM_TOKENS = 128
EWMA = 0.2  # weight of the newest observation


@dataclass
class PooledEngine:
    name: str
    engine: Engine
    settings: EngineSettings
    ms_per_token: float = 0.0

    def observe_prefill(self, tokens: int, ms: float) -> None:
        if tokens < 16 or ms <= 0:
            return  # too short to say anything about the rate
        rate = ms / tokens
        self.ms_per_token = rate if self.ms_per_token == 0.0 else (1 - EWMA) * self.ms_per_token + EWMA * rate


class EnginePool:
    def __init__(self, engines: Mapping[str, PooledEngine]) -> None:
        self._engines = dict(engines)
        self._by_fp = {p.engine.spec.fingerprint: p for p in self._engines.values()}

    @classmethod
    async def load(cls, settings: Mapping[str, EngineSettings], zoo: Zoo) -> EnginePool:
        pooled: dict[str, PooledEngine] = {}
        for name, s in settings.items():
            engine: Engine
            if s.kind == "sglang":
                engine = await connect_sglang(name, s)
            else:
                engine = await asyncio.to_thread(
                    LocalEngine.from_zoo, s.model, zoo=zoo, device=s.device, capacity=s.queue_capacity
                )
            pooled[name] = PooledEngine(name, engine, s)
        return cls(pooled)

    async def warm(self) -> None:
        """One short prefill per engine: the first forward pays one-time costs, and it seeds the rate.
        An SGLang server warms itself; the rate then follows its first native prefills."""
        for p in self._engines.values():
            if isinstance(p.engine, SGLangEngine):
                continue
            ids = list(p.engine.encode(stdlib_text(2000)).ids)[:WARM_TOKENS]
            await p.engine.prefill(ids)
            _, timings = await p.engine.prefill(ids)
            p.observe_prefill(len(ids), timings.prefill_ms)

    def __getitem__(self, name: str) -> PooledEngine:
        try:
            return self._engines[name]
        except KeyError:
            raise UnknownRole(f"no engine {name!r}") from None

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self._engines.values())

    def by_fingerprint(self, fingerprint: str) -> PooledEngine | None:
        return self._by_fp.get(fingerprint)

    @property
    def fingerprints(self) -> set[str]:
        return set(self._by_fp)

    async def aclose(self) -> None:
        for p in self._engines.values():
            await p.engine.aclose()


async def connect_sglang(name: str, s: EngineSettings) -> SGLangEngine:
    """An SGLang engine from its settings; with ``hicache_redis_url``, bound to its page store."""
    assert s.url is not None and s.model_dir is not None  # EngineSettings validates it
    pages: PageSink | None = None
    if s.hicache_redis_url:
        info = await SGLangEngine.probe(s.url)
        keys = PageKeys("hf", s.hicache_namespace or name, 0, info.tp_size)
        pages = PageStore(connect(s.hicache_redis_url, 1.0, 5.0), keys)
    return await SGLangEngine.connect(
        s.url, name=name, model_dir=s.model_dir, template=s.template, pages=pages, fingerprint=s.fingerprint,
        capacity=s.queue_capacity, export_wait_s=s.export_wait_s,
    )  # fmt: skip
