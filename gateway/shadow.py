"""Shadow evaluation: how far a transfer's next-token distributions drift from native prefill.

For a sampled share of transferred requests (``shadow.sample_rate``; paths ``transfer`` and
``map_quote``, the latter re-run on the quoted prompt the engine ran), and of requests a
``shadow``-status version could have served (``shadow.shadow_rate``; it never serves them), the
gateway re-runs the prompt natively off the hot path and compares, teacher-forced over the first
``answer_tokens`` tokens of the served answer: first-token KL(native || transfer), the mean
per-token KL over those tokens, and top-1 agreement. Samples go to the registry per adapter
version. When the mean first-token KL over the last ``window`` samples (at least ``min_samples``)
crosses ``drift_kl_threshold``, an ``adapter.drift`` event and a metric are raised once per
version, and with ``auto_rollback`` an active version is rolled back to the one it replaced.

Paired: when an active version served the request (``transfer`` or ``map_quote``), each shadow
version's KV is built again on that same path, prompt, spans and budget (``HopPlan.rebuild``) and
scored against the same native re-run as the served KV; the sample keeps both answer KLs. With
``auto_promote``, a shadow version whose last ``window`` pairs against the active version number
at least ``promote_min_pairs``, with a mean answer KL at least ``promote_margin`` nats below the
active's and lower on more than half of them, is promoted (actor ``auto``; the active version goes
back to candidate, so a rollback restores it), with an ``adapter.status`` event that says why.
A request served by no adapter (``quote``, ``native``) evaluates shadow versions on the
``transfer`` path, unpaired.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import torch

from engines.base import Engine
from gateway.errors import GatewayError
from gateway.hop import Hop, TransferInputs, run_transfer
from gateway.metrics import Metrics
from gateway.registry import versions
from gateway.registry.db import Database
from gateway.registry.versions import Pairs
from gateway.resolver import AdapterResolver, VersionRef
from gateway.settings import ShadowSettings
from heterofold.adapter import Adapter
from heterofold.errors import HeteroFoldError
from heterofold.fidelity import first_token_kl, mean_kl, top1_agreement
from heterofold.kv import KVCache
from store.kv_store import KVStore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Fidelity:
    first_token_kl: float
    top1: float
    answer_kl: float  # mean per-token KL over the answer's rows (the first token's included)


async def native_rows(engine: Engine, ids: Sequence[int], answer: Sequence[int]) -> torch.Tensor:
    """Native next-token logits from the prompt's last token on, ``(1 + len(answer), V)``."""
    native = await engine.score(list(ids) + list(answer))
    return native[len(ids) - 1 :]


async def fidelity_of(
    engine: Engine, ids: Sequence[int], answer: Sequence[int], kv: KVCache, ref: torch.Tensor
) -> Fidelity:
    """Continuing from ``kv`` against the native rows ``ref`` (``native_rows``)."""
    other = await engine.score(list(ids) + list(answer), past=kv)  # (T - kv.num_tokens, V)
    got = other[len(ids) - 1 - kv.num_tokens :]
    top1 = top1_agreement(ref[:-1], got[:-1]) if answer else top1_agreement(ref, got)
    rows = max(1, len(answer))  # the rows after the last answer token predict past the answer
    return Fidelity(first_token_kl(ref[0], got[0]), top1, mean_kl(ref[:rows], got[:rows]))


async def fidelity(engine: Engine, ids: Sequence[int], answer: Sequence[int], kv: KVCache) -> Fidelity:
    """Continuing from ``kv`` against a native prefill."""
    return await fidelity_of(engine, ids, answer, kv, await native_rows(engine, ids, answer))


@dataclass(frozen=True)
class Promotion:
    pairs: Pairs
    reason: str


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
        got = await fidelity(hop.engine, hop.ids, answer[: self.settings.answer_tokens], kv)
        await self._record(ref_id, version, got)

    async def candidates(self, *, refs: Sequence[VersionRef], hop: Hop, inputs: TransferInputs,
                         answer: Sequence[int]) -> None:  # fmt: skip
        """Build the transfer with each shadow version (never served) and evaluate it, unpaired."""
        for ref in refs:
            try:
                adapter = await self.resolver.load(ref)
                result = await run_transfer(adapter, hop, inputs)
                got = await fidelity(hop.engine, hop.ids, answer[: self.settings.answer_tokens], result.kv)
            except HeteroFoldError as exc:
                log.warning("shadow version %s not evaluated: %s", ref.version, exc)
                continue
            await self._record(ref.id, ref.version, got)

    async def paired(
        self, *, refs: Sequence[VersionRef], baseline_id: int, baseline_version: str, record_baseline: bool,
        hop: Hop, kv: KVCache, rebuild: Callable[[Adapter], Awaitable[KVCache]], answer: Sequence[int],
    ) -> None:  # fmt: skip
        """Each shadow version on the path that served this request (``hop``: the prompt the
        engine ran; ``kv``: what ``baseline_id`` built for it), beside the served KV, against one
        native re-run; then the promotion rule for each. ``record_baseline``: the request was also
        sampled for the serving version's own drift, which this evaluation records (one native
        re-run for both)."""
        answer = answer[: self.settings.answer_tokens]
        ref_rows = await native_rows(hop.engine, hop.ids, answer)
        base = await fidelity_of(hop.engine, hop.ids, answer, kv, ref_rows)
        if record_baseline:
            await self._record(baseline_id, baseline_version, base)
        for ref in refs:
            try:
                adapter = await self.resolver.load(ref)
                got = await fidelity_of(hop.engine, hop.ids, answer, await rebuild(adapter), ref_rows)
            except HeteroFoldError as exc:
                log.warning("shadow version %s not evaluated: %s", ref.version, exc)
                continue
            await self._record(ref.id, ref.version, got, baseline_id=baseline_id, baseline_kl=base.answer_kl)
            if self.settings.auto_promote:
                await self._consider(ref, baseline_id)

    async def _consider(self, ref: VersionRef, baseline_id: int) -> None:
        """Promote ``ref`` if its pairs against ``baseline_id`` pass ``ShadowSettings.promotes``."""
        try:
            promoted = await asyncio.to_thread(self._promote_if_better, ref.id, baseline_id)
        except GatewayError as exc:  # retired or replaced meanwhile, or the registry failed
            log.warning("shadow version %s not promoted: %s", ref.version, exc)
            return
        if promoted is None:
            return
        self.resolver.invalidate()
        self.metrics.auto_promotions.labels(ref.version).inc()
        log.warning("shadow version %s promoted: %s", ref.version, promoted.reason)
        fields = {
            "adapter": ref.id, "version": ref.version, "action": "promote", "from": "shadow", "to": "active",
            "actor": "auto", "replaced": baseline_id, "reason": promoted.reason, **promoted.pairs.view(),
        }  # fmt: skip
        await asyncio.to_thread(self.store.events.emit_quietly, "adapter.status", time.time(), **fields)

    def _promote_if_better(self, adapter_id: int, baseline_id: int) -> Promotion | None:
        with self.db.session() as session:
            p = versions.pairs(session=session, adapter_id=adapter_id, baseline_id=baseline_id,
                               window=self.settings.window)  # fmt: skip
            if not self.settings.promotes(p):
                return None
            row = versions.get_adapter(session=session, adapter_id=adapter_id)
            base = versions.get_adapter(session=session, adapter_id=baseline_id)
            if row.status != "shadow" or base.status != "active":  # decided meanwhile, here or elsewhere
                return None
            reason = (f"shadow: mean answer KL {p.kl:.4f} against the active version's {p.baseline_kl:.4f} "
                      f"over {p.samples} paired requests, lower on {p.wins}")  # fmt: skip
            versions.promote(session=session, adapter_id=adapter_id, actor="auto", reason=reason)
            return Promotion(p, reason)

    async def _record(self, adapter_id: int, version: str, got: Fidelity, *, baseline_id: int | None = None,
                      baseline_kl: float | None = None) -> None:  # fmt: skip
        n, mean_kl, mean_top1 = await asyncio.to_thread(self._store_sample, adapter_id, got, baseline_id, baseline_kl)
        self.metrics.shadow_samples.labels(version).inc()
        self.metrics.drift_kl.labels(version).set(mean_kl)
        self.metrics.drift_top1.labels(version).set(mean_top1)
        if self.settings.drifted(n, mean_kl) and adapter_id not in self._alerted:
            self._alerted.add(adapter_id)
            await self._alert(adapter_id, version, n, mean_kl, mean_top1)

    def _store_sample(self, adapter_id: int, got: Fidelity, baseline_id: int | None,
                      baseline_kl: float | None) -> tuple[int, float, float]:  # fmt: skip
        with self.db.session() as session:
            versions.record_shadow(
                session=session, adapter_id=adapter_id, kl=got.first_token_kl, top1=got.top1,
                answer_kl=got.answer_kl, baseline_id=baseline_id, baseline_kl=baseline_kl,
            )  # fmt: skip
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
