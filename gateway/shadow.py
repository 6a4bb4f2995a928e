"""Shadow evaluation: how far a transfer's next-token distributions drift from native prefill.

For a sampled share of transferred requests (``shadow.sample_rate``; paths ``transfer`` and
``map_quote``, the latter re-run on the quoted prompt the engine ran), and of requests a
``shadow``-status version could have served (``shadow.shadow_rate``; it never serves them), the
gateway re-runs the prompt natively off the hot path and compares, teacher-forced over the first
``answer_tokens`` tokens of the served answer: first-token KL(native || transfer) and top-1
agreement. Samples go to the registry per adapter version. When the mean KL over the last
``window`` samples (at least ``min_samples``) crosses ``drift_kl_threshold``, an
``adapter.drift`` event and a metric are raised once per version, and with ``auto_rollback`` an
active version is rolled back to the one it replaced.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Sequence

from engines.base import Engine
from gateway.errors import GatewayError
from gateway.hop import Hop, TransferInputs, run_transfer
from gateway.metrics import Metrics
from gateway.registry import versions
from gateway.registry.db import Database
from gateway.resolver import AdapterResolver, VersionRef
from gateway.settings import ShadowSettings
from heterofold.errors import HeteroFoldError
from heterofold.fidelity import first_token_kl, top1_agreement
from heterofold.kv import KVCache
from store.kv_store import KVStore

log = logging.getLogger(__name__)


async def fidelity(engine: Engine, ids: Sequence[int], answer: Sequence[int], kv: KVCache) -> tuple[float, float]:
    """(first-token KL, top-1 agreement) of continuing from ``kv`` against a native prefill."""
    full = list(ids) + list(answer)
    native = await engine.score(full)  # (T, V)
    other = await engine.score(full, past=kv)  # (T - kv.num_tokens, V)
    ref = native[len(ids) - 1 :]  # (1 + len(answer), V): the next-token rows from the prompt's last token
    got = other[len(ids) - 1 - kv.num_tokens :]
    top1 = top1_agreement(ref[:-1], got[:-1]) if answer else top1_agreement(ref, got)
    return first_token_kl(ref[0], got[0]), top1


class ShadowEvaluator:
    def __init__(
        self, *, settings: ShadowSettings, db: Database, resolver: AdapterResolver, store: KVStore, metrics: Metrics,
        rng: random.Random | None = None,
    ) -> None:  # fmt: skip
        self.settings = settings
        self.db = db
        self.resolver = resolver
        self.store = store
        self.metrics = metrics
        self.rng = rng or random.Random()
        self._alerted: set[int] = set()

    def sample_served(self) -> bool:
        return self.rng.random() < self.settings.sample_rate

    def sample_shadow(self) -> bool:
        return self.rng.random() < self.settings.shadow_rate

    async def served(self, *, ref_id: int, version: str, hop: Hop, kv: KVCache, answer: Sequence[int]) -> None:
        """Evaluate the transfer that served this request (its KV value, already built)."""
        kl, top1 = await fidelity(hop.engine, hop.ids, answer[: self.settings.answer_tokens], kv)
        await self._record(ref_id, version, kl, top1)

    async def candidates(self, *, refs: Sequence[VersionRef], hop: Hop, inputs: TransferInputs,
                         answer: Sequence[int]) -> None:  # fmt: skip
        """Build the transfer with each shadow version (never served) and evaluate it."""
        for ref in refs:
            try:
                adapter = await self.resolver.load(ref)
                result = await run_transfer(adapter, hop, inputs)
                kl, top1 = await fidelity(hop.engine, hop.ids, answer[: self.settings.answer_tokens], result.kv)
            except HeteroFoldError as exc:
                log.warning("shadow version %s not evaluated: %s", ref.version, exc)
                continue
            await self._record(ref.id, ref.version, kl, top1)

    async def _record(self, adapter_id: int, version: str, kl: float, top1: float) -> None:
        n, mean_kl, mean_top1 = await asyncio.to_thread(self._store_sample, adapter_id, kl, top1)
        self.metrics.shadow_samples.labels(version).inc()
        self.metrics.drift_kl.labels(version).set(mean_kl)
        self.metrics.drift_top1.labels(version).set(mean_top1)
        if self.settings.drifted(n, mean_kl) and adapter_id not in self._alerted:
            self._alerted.add(adapter_id)
            await self._alert(adapter_id, version, n, mean_kl, mean_top1)

    def _store_sample(self, adapter_id: int, kl: float, top1: float) -> tuple[int, float, float]:
        with self.db.session() as session:
            versions.record_shadow(session=session, adapter_id=adapter_id, kl=kl, top1=top1)
        with self.db.session() as session:
            return versions.drift(session=session, adapter_id=adapter_id, window=self.settings.window)

    async def _alert(self, adapter_id: int, version: str, n: int, kl: float, top1: float) -> None:
        self.metrics.drift_alerts.labels(version).inc()
        log.warning("adapter %s drifted: mean first-token KL %.3f over %d samples", version, kl, n)
        fields = {"adapter": adapter_id, "version": version, "samples": n, "first_token_kl": round(kl, 4),
                  "top1_agreement": round(top1, 4), "threshold": self.settings.drift_kl_threshold}  # fmt: skip
        await asyncio.to_thread(self.store.events.emit_quietly, "adapter.drift", time.time(), **fields)
        if not self.settings.auto_rollback:
            return
        try:
            await asyncio.to_thread(self._rollback, adapter_id, kl)
        except GatewayError as exc:  # not active (a shadow version), or nothing to restore
            log.warning("drift: no automatic rollback of %s: %s", version, exc)
            return
        self.resolver.invalidate()

    def _rollback(self, adapter_id: int, kl: float) -> None:
        with self.db.session() as session:
            versions.rollback(session=session, adapter_id=adapter_id, actor="auto", reason=f"drift: mean KL {kl:.3f}")
