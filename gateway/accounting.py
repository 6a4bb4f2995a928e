"""What a chat turn leaves behind, off its answer's path: the usage the client gets and the metrics,
the request-log row the dashboard reads, the turn's KV handed to the store (the next hop of the
same conversation waits for that, bounded), the ``prefill.saved`` event, sampled shadow re-runs;
and the record of an engine that refused or failed a request. ``gateway/chat.py`` runs the turn and
calls in here; nothing here changes what the client is answered."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace

from engines.base import Completion
from gateway.background import Background
from gateway.engine_pool import PooledEngine
from gateway.errors import GatewayError
from gateway.hop import Hop, HopPlan
from gateway.metrics import Metrics
from gateway.request_log import RequestLog, RequestRecord
from gateway.resolver import AdapterResolver
from gateway.schemas import HeteroFoldUsage, PromptTokensDetails, Usage
from gateway.shadow import ShadowEvaluator
from gateway.turns import FinishedTurn, TurnRecorder
from store.errors import StoreError
from store.kv_store import KVStore

log = logging.getLogger(__name__)
STORE_WAIT_S = 5.0  # the longest a hop waits for its conversation's previous turn to be stored


class TurnAccounting:
    def __init__(
        self, *, recorder: TurnRecorder, shadow: ShadowEvaluator, resolver: AdapterResolver, store: KVStore,
        metrics: Metrics, background: Background, journal: RequestLog | None = None,
    ) -> None:  # fmt: skip
        self.recorder = recorder
        self.shadow = shadow
        self.resolver = resolver
        self.store = store
        self.metrics = metrics
        self.background = background
        self.journal = journal  # the request log the dashboard reads
        self._pending: dict[tuple[str, str], asyncio.Task[None]] = {}  # a conversation's unfinished after-turn

    def rate_limited(self, engine: str) -> None:
        self.metrics.rate_limited.labels(engine).inc()

    def engine_failed(self, *, role: str, engine: str, error: GatewayError, reason: str) -> GatewayError:
        """Count ``error`` and raise an ``engine.failure`` event; returns ``error`` to raise."""
        self.metrics.errors.labels(role, error.code or "").inc()
        fields = {"engine": engine, "role": role, "reason": reason, "detail": str(error)[:300]}
        emit = asyncio.to_thread(self.store.events.emit_quietly, "engine.failure", time.time(), **fields)
        self.background.spawn(emit, "event:engine.failure")
        return error

    async def previous_turn_stored(self, hop: Hop) -> None:
        """A client that hops at once must not miss the turn before: wait (bounded) until its KV is
        in the store and the conversation points at it."""
        task = self._pending.get((hop.tenant, hop.conversation_id or ""))
        if task is not None:
            await asyncio.wait({task}, timeout=STORE_WAIT_S)

    def finish(self, hop: Hop, pooled: PooledEngine, plan: HopPlan, plan_ms: float, done: Completion) -> Usage:
        """The turn's usage; its metrics and request-log row; its after-turn work started."""
        t = done.timings
        cached = t.cached_tokens
        if plan.path == "native":
            pooled.observe_prefill(t.prompt_tokens - cached, t.prefill_ms)
        skipped = cached + len(hop.ids) - len(plan.ids(hop))  # imported, or cut from the prompt by a quote
        saved_ms = pooled.ms_per_token * skipped - plan.transfer_ms if skipped else 0.0
        ttft_ms = plan_ms + t.ttft_ms
        usage = Usage(
            prompt_tokens=t.prompt_tokens,
            completion_tokens=t.completion_tokens,
            total_tokens=t.prompt_tokens + t.completion_tokens,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=cached),
            heterofold=HeteroFoldUsage(
                path=plan.path,
                adapter_version=plan.adapter_version,
                selector=plan.selector,
                tokens_transferred=plan.tokens_transferred,
                tokens_recomputed=plan.tokens_recomputed,
                transfer_ms=round(plan.transfer_ms, 2),
                ttft_ms=round(ttft_ms, 2),
                prefill_ms_saved=round(saved_ms, 2),
                fallback=plan.fallback,
                engine_ms=round(t.ttft_ms + t.decode_ms, 2),
            ),
        )
        m = self.metrics
        m.requests.labels(hop.role, plan.path).inc()
        m.ttft.labels(hop.role, plan.path).observe(ttft_ms / 1000)
        if skipped:
            m.prefill_tokens_saved.labels(hop.role, plan.path).inc(skipped)
            m.prefill_seconds_saved.labels(hop.role, plan.path).inc(max(saved_ms, 0.0) / 1000)
        if plan.path in ("transfer", "map_quote", "quote") and plan.route:
            m.transfer.labels(plan.route).observe(plan.transfer_ms / 1000)
            m.transferred_tokens.labels(plan.route).inc(plan.tokens_transferred)
        if self.journal is not None:
            record = RequestRecord(
                hop.role, plan.inputs.sender.engine if plan.inputs else None, hop.engine_name, plan.path,
                t.prompt_tokens, cached, plan.tokens_transferred, ttft_ms, plan.transfer_ms, saved_ms,
                plan.adapter_version,
            )  # fmt: skip
            self.background.spawn(self.journal.record(record), "request-log")
        task = self.background.spawn(self._after(hop, pooled, plan, done, saved_ms), f"after-turn:{hop.role}")
        if hop.conversation_id is not None:
            key = (hop.tenant, hop.conversation_id)
            self._pending[key] = task
            task.add_done_callback(lambda _: self._pending.pop(key, None) if self._pending.get(key) is task else None)
        return usage

    async def _after(self, hop: Hop, pooled: PooledEngine, plan: HopPlan, done: Completion, saved_ms: float) -> None:
        text, offsets = (hop.text, hop.offsets) if plan.prompt is None else (plan.prompt.text, plan.prompt.offsets)
        await self.recorder.record(FinishedTurn(pooled, hop.tenant, hop.conversation_id, text, tuple(offsets), done))
        if plan.cached_tokens:
            scope = self.store.scope(hop.engine.spec.fingerprint, hop.tenant)
            try:
                await asyncio.to_thread(self.store.prefill_saved, scope, plan.cached_tokens, ms=round(saved_ms, 1),
                                        path=plan.path, role=hop.role)  # fmt: skip
            except StoreError as exc:
                log.warning("prefill.saved not recorded: %s", exc)
        self.background.spawn(self._shadow(hop, plan, list(done.token_ids)), f"shadow:{hop.role}")

    async def _shadow(self, hop: Hop, plan: HopPlan, answer: list[int]) -> None:
        """Sampled native re-runs (long: a whole native prefill); the next hop never waits for them."""
        served = plan.path in ("transfer", "map_quote") and plan.adapter_id is not None and plan.past is not None
        ran = (
            hop
            if plan.prompt is None
            else replace(hop, text=plan.prompt.text, ids=plan.prompt.ids, offsets=plan.prompt.offsets)
        )  # the prompt the engine ran
        sample_served = served and self.shadow.sample_served()
        refs = []
        if plan.inputs is not None and self.shadow.sample_shadow():
            refs = await self.resolver.shadows(plan.inputs.pair)
        if served and refs and plan.rebuild is not None:  # beside the version that served, on its path
            assert plan.adapter_id is not None and plan.past is not None
            await self.shadow.paired(
                refs=refs, baseline_id=plan.adapter_id, baseline_version=plan.adapter_version or "",
                record_baseline=sample_served, hop=ran, kv=plan.past, rebuild=plan.rebuild, answer=answer,
            )  # fmt: skip
            return
        if sample_served:
            assert plan.adapter_id is not None and plan.past is not None
            await self.shadow.served(
                ref_id=plan.adapter_id, version=plan.adapter_version or "", hop=ran, kv=plan.past, answer=answer
            )
        if refs:
            assert plan.inputs is not None
            await self.shadow.candidates(refs=refs, hop=hop, inputs=plan.inputs, answer=answer)
