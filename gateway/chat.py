"""One chat turn for a role: render and check the prompt, plan the hop, generate, account, and hand
the turn's KV to the store afterwards. Routes call ``prepare`` and then ``stream``."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass

from engines.base import Completion, Export, SamplingParams, StreamEvent
from engines.errors import BadPrompt, EngineBusy, KVMismatch, PromptTooLong
from gateway.background import Background
from gateway.engine_pool import EnginePool, PooledEngine
from gateway.errors import EngineFailed, EngineTimeout, GatewayError, InvalidRequest, UnknownRole
from gateway.hop import Fallbacks, Hop, HopPlan, HopPlanner
from gateway.metrics import Metrics
from gateway.request_log import RequestLog, RequestRecord
from gateway.resolver import AdapterResolver
from gateway.schemas import ChatRequest, HeteroFoldUsage, PromptTokensDetails, Usage
from gateway.settings import Settings, TransferPolicy
from gateway.shadow import ShadowEvaluator
from gateway.turns import FinishedTurn, TurnRecorder
from store.errors import StoreError
from store.kv_store import KVStore

log = logging.getLogger(__name__)
STORE_WAIT_S = 5.0
NO_REUSE = TransferPolicy(prefix_reuse=False, store_turns=False, transfer=False, same_model=False)


@dataclass(frozen=True)
class Prepared:
    pooled: PooledEngine
    hop: Hop
    params: SamplingParams
    export: Export


@dataclass(frozen=True)
class TurnResult:
    text: str
    finish_reason: str
    usage: Usage


class ChatService:
    def __init__(
        self, *, settings: Settings, pool: EnginePool, planner: HopPlanner, recorder: TurnRecorder,
        shadow: ShadowEvaluator, resolver: AdapterResolver, fallbacks: Fallbacks, store: KVStore, metrics: Metrics,
        background: Background, journal: RequestLog | None = None,
    ) -> None:  # fmt: skip
        self.settings = settings
        self.pool = pool
        self.planner = planner
        self.recorder = recorder
        self.shadow = shadow
        self.resolver = resolver
        self.fallbacks = fallbacks
        self.store = store
        self.metrics = metrics
        self.background = background
        self.journal = journal  # the request log the dashboard reads
        self._pending: dict[tuple[str, str], asyncio.Task[None]] = {}  # a conversation's unfinished after-turn

    def prepare(self, *, role: str, request: ChatRequest, tenant: str, conversation_id: str | None) -> Prepared:
        cfg = self.settings.roles.get(role)
        if cfg is None:
            raise UnknownRole(f"no role {role!r}; roles: {', '.join(self.settings.roles)}", param="model")
        if len(request.messages) > self.settings.limits.max_messages:
            raise InvalidRequest(f"at most {self.settings.limits.max_messages} messages", param="messages")
        pooled = self.pool[cfg.engine]
        engine = pooled.engine
        messages = [m.as_engine_message() for m in request.messages]
        if cfg.system_prompt and messages[0]["role"] != "system":
            messages.insert(0, {"role": "system", "content": cfg.system_prompt})
        text = engine.render(messages)
        enc = engine.encode(text)
        limit = pooled.settings.max_prompt_tokens
        if len(enc.ids) > limit:
            raise PromptTooLong(f"the prompt has {len(enc.ids)} tokens; role {role} takes at most {limit}")
        max_tokens = request.max_completion_tokens or request.max_tokens or cfg.generation.max_tokens
        if max_tokens > pooled.settings.max_tokens:
            raise InvalidRequest(f"max_tokens is at most {pooled.settings.max_tokens} for role {role}",
                                 param="max_tokens", code="max_tokens_too_large")  # fmt: skip
        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=cfg.generation.temperature if request.temperature is None else request.temperature,
            top_p=cfg.generation.top_p if request.top_p is None else request.top_p,
            seed=request.seed,
            stop=request.stops,
        )
        users = [m["content"] for m in messages if m["role"] == "user"]
        policy = cfg.policy if request.kv_reuse else NO_REUSE
        hop = Hop(
            role=role, engine_name=cfg.engine, engine=engine, policy=policy, tail_window=cfg.tail_window,
            ids=enc.ids, offsets=enc.offsets, text=text, messages=messages,
            question=users[-1] if users else "", tenant=tenant, conversation_id=conversation_id,
        )  # fmt: skip
        return Prepared(pooled, hop, params, "turn" if policy.store_turns else "none")

    async def stream(self, prepared: Prepared) -> AsyncGenerator[str | TurnResult, None]:
        """Text deltas as they become final, then one TurnResult."""
        hop, engine = prepared.hop, prepared.pooled.engine
        t0 = time.perf_counter()
        await self._previous_turn_stored(hop)
        plan = await self.planner.plan(hop)
        plan_ms = (time.perf_counter() - t0) * 1000
        events = engine.stream(plan.ids(hop), prepared.params, past=plan.past, export=prepared.export)
        try:
            try:
                first = await self._next(prepared, events)
            except KVMismatch as exc:
                if plan.past is None:
                    raise
                plan = HopPlan("native", fallback=self.fallbacks.record("engine", exc, hop.role), inputs=plan.inputs)
                await _close(events)
                events = engine.stream(hop.ids, prepared.params, export=prepared.export)
                first = await self._next(prepared, events)
            event: StreamEvent = first
            while not isinstance(event, Completion):
                if event.text:
                    yield event.text
                event = await self._next(prepared, events)
        finally:
            await _close(events)
        yield self._finish(prepared, plan, plan_ms, event)

    async def _next(self, prepared: Prepared, events: AsyncIterator[StreamEvent]) -> StreamEvent:
        """The engine's next event within its ``timeout_s``. A full queue is counted and stays a
        429; an engine that raises or goes silent ends the request with a clean 503 or 504, and a
        metric and an ``engine.failure`` event record it (a timed-out stream is cancelled, which
        stops the engine's work and frees its queue slot)."""
        pooled = prepared.pooled
        try:
            return await asyncio.wait_for(anext(events), pooled.settings.timeout_s)
        except EngineBusy:
            self.metrics.rate_limited.labels(pooled.name).inc()
            raise
        except (PromptTooLong, BadPrompt, KVMismatch):
            raise
        except TimeoutError as exc:
            timeout = EngineTimeout(f"engine {pooled.name} sent nothing for {pooled.settings.timeout_s:g} s")
            raise self._engine_failed(prepared, timeout, "timeout") from exc
        except Exception as exc:
            log.warning("engine %s failed for role %s", pooled.name, prepared.hop.role, exc_info=exc)
            failed = EngineFailed(f"engine {pooled.name} failed while answering ({type(exc).__name__}); retry later")
            raise self._engine_failed(prepared, failed, type(exc).__name__) from exc

    def _engine_failed(self, prepared: Prepared, error: GatewayError, reason: str) -> GatewayError:
        role, engine = prepared.hop.role, prepared.pooled.name
        self.metrics.errors.labels(role, error.code or "").inc()
        fields = {"engine": engine, "role": role, "reason": reason, "detail": str(error)[:300]}
        emit = asyncio.to_thread(self.store.events.emit_quietly, "engine.failure", time.time(), **fields)
        self.background.spawn(emit, "event:engine.failure")
        return error

    def _finish(self, prepared: Prepared, plan: HopPlan, plan_ms: float, done: Completion) -> TurnResult:
        hop, pooled = prepared.hop, prepared.pooled
        plan = self.planner.confirm(hop, plan, done.timings)  # an SGLang storage miss prefilled natively
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
        task = self.background.spawn(self._after(prepared, plan, done, saved_ms), f"after-turn:{hop.role}")
        if hop.conversation_id is not None:
            key = (hop.tenant, hop.conversation_id)
            self._pending[key] = task
            task.add_done_callback(lambda _: self._pending.pop(key, None) if self._pending.get(key) is task else None)
        return TurnResult(done.text, "stop" if done.finish_reason == "cancelled" else done.finish_reason, usage)

    async def _previous_turn_stored(self, hop: Hop) -> None:
        """A client that hops at once must not miss the turn before: wait (bounded) until its KV is
        in the store and the conversation points at it."""
        task = self._pending.get((hop.tenant, hop.conversation_id or ""))
        if task is not None:
            await asyncio.wait({task}, timeout=STORE_WAIT_S)

    async def _after(self, prepared: Prepared, plan: HopPlan, done: Completion, saved_ms: float) -> None:
        hop = prepared.hop
        text, offsets = (hop.text, hop.offsets) if plan.prompt is None else (plan.prompt.text, plan.prompt.offsets)
        finished = FinishedTurn(prepared.pooled, hop.tenant, hop.conversation_id, text, tuple(offsets), done)
        await self.recorder.record(finished)
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
        served = plan.path == "transfer" and plan.adapter_id is not None and plan.past is not None
        if served and plan.adapter_id is not None and plan.past is not None and self.shadow.sample_served():
            await self.shadow.served(ref_id=plan.adapter_id, version=plan.adapter_version or "", hop=hop,
                                     kv=plan.past, answer=answer)  # fmt: skip
        if plan.inputs is not None and self.shadow.sample_shadow():
            refs = await self.resolver.shadows(plan.inputs.pair)
            if refs:
                await self.shadow.candidates(refs=refs, hop=hop, inputs=plan.inputs, answer=answer)

    async def complete(self, prepared: Prepared) -> TurnResult:
        async for item in self.stream(prepared):
            if isinstance(item, TurnResult):
                return item
        raise RuntimeError("the turn ended without a result")


async def _close(events: AsyncIterator[StreamEvent]) -> None:
    """Stop an engine stream early (the engine then stops decoding)."""
    close = getattr(events, "aclose", None)
    if close is not None:
        await close()
