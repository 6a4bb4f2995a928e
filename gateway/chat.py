"""One chat turn for a role: render and check the prompt, plan the hop, generate, and prefill
natively if the engine refuses the planned KV (the planner's ``refused`` decides and records it).
Routes call ``prepare`` and then ``stream``; what the turn leaves behind (usage, metrics, the
request log, the turn's KV for the next hop, shadow runs) is ``gateway/accounting.py``'s."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass

from engines.base import Completion, Export, SamplingParams, StreamEvent
from engines.errors import BadPrompt, EngineBusy, KVMismatch, PromptTooLong
from gateway.accounting import TurnAccounting
from gateway.engine_pool import EnginePool, PooledEngine
from gateway.errors import EngineFailed, EngineTimeout, GatewayError, InvalidRequest, UnknownRole
from gateway.hop import Hop, HopPlan, HopPlanner
from gateway.schemas import ChatRequest, Usage
from gateway.settings import Settings, TransferPolicy

log = logging.getLogger(__name__)
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
        self, *, settings: Settings, pool: EnginePool, planner: HopPlanner, accounting: TurnAccounting
    ) -> None:
        self.settings = settings
        self.pool = pool
        self.planner = planner
        self.accounting = accounting

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
        await self.accounting.previous_turn_stored(hop)
        plan = await self.planner.plan(hop)
        plan_ms = (time.perf_counter() - t0) * 1000
        events = engine.stream(plan.ids(hop), prepared.params, past=plan.past, export=prepared.export)
        try:
            try:
                first = await self._next(prepared, events)
            except KVMismatch as exc:
                plan = self.planner.refused(hop, plan, exc)
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
            self.accounting.rate_limited(pooled.name)
            raise
        except (PromptTooLong, BadPrompt, KVMismatch):
            raise
        except TimeoutError as exc:
            timeout = EngineTimeout(f"engine {pooled.name} sent nothing for {pooled.settings.timeout_s:g} s")
            raise self._failed(prepared, timeout, "timeout") from exc
        except Exception as exc:
            log.warning("engine %s failed for role %s", pooled.name, prepared.hop.role, exc_info=exc)
            failed = EngineFailed(f"engine {pooled.name} failed while answering ({type(exc).__name__}); retry later")
            raise self._failed(prepared, failed, type(exc).__name__) from exc

    def _failed(self, prepared: Prepared, error: GatewayError, reason: str) -> GatewayError:
        return self.accounting.engine_failed(role=prepared.hop.role, engine=prepared.pooled.name, error=error,
                                             reason=reason)  # fmt: skip

    def _finish(self, prepared: Prepared, plan: HopPlan, plan_ms: float, done: Completion) -> TurnResult:
        hop = prepared.hop
        plan = self.planner.confirm(hop, plan, done.timings)  # an SGLang storage miss prefilled natively
        usage = self.accounting.finish(hop, prepared.pooled, plan, plan_ms, done)
        return TurnResult(done.text, "stop" if done.finish_reason == "cancelled" else done.finish_reason, usage)

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
