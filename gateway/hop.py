"""The hop decision (DESIGN.md, "One hop, end to end", steps 2-3 and 5).

1. ``prefix``: the longest cached prefix of the prompt for the receiver's own model (and tenant).
2. A cross-model hop, when step 1 leaves at least ``min_uncached_tokens`` uncached and the
   conversation's latest turn came from another model (or another role on this model) and shares
   text with this prompt (``heterofold.align.shared_sections``). The role's selector for the
   sender (``policy.sender_selectors``, else ``policy.selector``; ``engines/selectors.py``)
   chooses ``recompute_budget`` of the shared context's tokens, and the route's path
   (``policy.path``; by default ``auto`` across families and ``transfer`` between roles on
   one model on an engine that recomputes in place,
   ``quote`` on one that cannot, such as SGLang: ``Hop.path_for``) says what is done with them:
   - ``transfer``: with the adapter that serves (sender fingerprint, receiver fingerprint), map
     the sender's KV and recompute natively the unaligned tokens, the tail window W and the
     chosen ones (``engines.transfer.transfer``); taken when it covers more than step 1;
   - ``map_quote``: the map with no recompute (template tokens aside), and the chosen spans quoted
     as text at the head of the new message, which the receiver prefills with the suffix;
   - ``quote``: no KV at all: the shared text of the earlier messages is cut down to the chosen
     spans (``heterofold.select.elide``) and the shorter prompt is prefilled natively;
   - ``auto``: ``quote`` when the new message names the sentence that answers it (lexical
     confidence, ``engines.selectors.names_its_sentence``) or asks for one detail in other words
     (a paraphrased look-up, ``engines.request_kind``), else ``transfer`` (a summary, a
     continuation: the mapped context with the spans recomputed in place carries what the spans
     miss); ``engines.selectors.auto_path``. ``HopPlan.path`` says which ran.
   The quote paths change the prompt the engine runs (``HopPlan.prompt``).
3. ``native`` otherwise.

Any failure in 1-2 (Redis down, a payload missing or corrupt, a tampered artifact, a fingerprint
mismatch, a KV value the engine refuses) falls back to what is left, ultimately native prefill:
the request succeeds, and ``Fallbacks`` records a metric and a ``transfer.fallback`` event.
``EngineBusy`` is not a fallback: it answers 429.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from engines.base import Engine, Timings
from engines.errors import EngineBusy, EngineError, KVMismatch
from engines.selectors import Evidence, HopText, Selector, auto_path, candidates, make_selector, select
from engines.transfer import TransferResult, transfer
from gateway.background import Background
from gateway.conversations import Conversations, Turn
from gateway.errors import RegistryError, SenderKVMissing, StorageMiss
from gateway.metrics import Metrics
from gateway.resolver import AdapterResolver, VersionRef
from gateway.schemas import Path
from gateway.settings import TransferPolicy
from heterofold.adapter import Adapter, Side
from heterofold.align import Section, shared_sections
from heterofold.errors import HeteroFoldError
from heterofold.kv import KVCache
from heterofold.select import QUOTE_SEPARATOR, elide, quote_into
from store.errors import StoreError
from store.kv_store import KVStore

log = logging.getLogger(__name__)
IDENTITY = "identity"


FALLBACK_ERRORS = (StoreError, HeteroFoldError, EngineError, RegistryError, SenderKVMissing)


@dataclass(frozen=True)
class Hop:
    role: str
    engine_name: str
    engine: Engine
    policy: TransferPolicy
    tail_window: int
    ids: Sequence[int]
    offsets: Sequence[tuple[int, int]]
    text: str  # the receiver's rendered prompt
    messages: Sequence[dict[str, str]]  # the rendered messages, in order
    question: str  # the last user message: what the recompute selector looks for
    tenant: str
    conversation_id: str | None

    @property
    def contents(self) -> list[str]:
        return [m["content"] for m in self.messages]

    def selector(self, inputs: TransferInputs) -> Selector:
        """The policy's selector for a hop from ``inputs``' sender (``sender_selectors``, else ``selector``)."""
        return make_selector(self.policy.selector_for(inputs.sender.engine))

    def path_for(self, pair: tuple[str, str]) -> Path | Literal["auto"]:
        """The route's path for a hop from fingerprint ``pair[0]``: the policy's, else the default
        measured best for the engine kind (BENCHMARKS.md, "One path per hop" and "Does the mapped
        cache carry the context?"): ``quote`` on an engine that cannot recompute in place
        (SGLang); on one that can, ``transfer`` between roles on one model (the identity map is
        exact) and ``auto`` across families (quote's look-ups and TTFT, the mapped context's
        whole-context fidelity: ``engines.selectors.auto_path``)."""
        if self.policy.path is not None:
            return self.policy.path
        if not self.engine.recomputes_in_place:
            return "quote"
        return "transfer" if pair[0] == pair[1] else "auto"


@dataclass(frozen=True)
class Prompt:
    """A prompt the hop rewrote (the quote paths): what the engine runs instead of the hop's."""

    text: str
    ids: Sequence[int]
    offsets: Sequence[tuple[int, int]]


@dataclass(frozen=True)
class TransferInputs:
    """Everything a transfer for this hop needs besides the adapter (shadow evaluation reuses it)."""

    pair: tuple[str, str]
    sender: Turn
    sender_kv: KVCache
    sections: list[Section]


@dataclass(frozen=True)
class HopPlan:
    path: Path
    past: KVCache | None = None
    adapter_version: str | None = None
    adapter_id: int | None = None
    route: str | None = None  # "sender -> receiver" engine names, for metrics
    tokens_transferred: int = 0
    tokens_recomputed: int = 0
    transfer_ms: float = 0.0
    fallback: str | None = None
    selector: str | None = None  # the selector that chose the spans recomputed or quoted (none at budget 0)
    inputs: TransferInputs | None = None  # set when a transfer was possible
    prompt: Prompt | None = None  # set when the path rewrote the prompt
    # the served KV built again with another adapter, on the same path, prompt, spans and budget
    # (paired shadow evaluation); set on the adapter paths (transfer, map_quote)
    rebuild: Callable[[Adapter], Awaitable[KVCache]] | None = field(default=None, repr=False, compare=False)

    @property
    def cached_tokens(self) -> int:
        return 0 if self.past is None else self.past.num_tokens

    def ids(self, hop: Hop) -> Sequence[int]:
        return hop.ids if self.prompt is None else self.prompt.ids


class Fallbacks:
    """Records why a reuse or transfer attempt fell back: a metric at once, an event off the path."""

    def __init__(self, store: KVStore, metrics: Metrics, background: Background) -> None:
        self.store, self.metrics, self.background = store, metrics, background

    def record(self, stage: str, exc: BaseException, role: str) -> str:
        reason = type(exc).__name__
        self.metrics.fallbacks.labels(stage, reason).inc()
        log.info("fallback at %s for role %s: %s: %s", stage, role, reason, exc)

        async def emit() -> None:
            fields = {"stage": stage, "reason": reason, "role": role, "detail": str(exc)[:300]}
            await asyncio.to_thread(self.store.events.emit_quietly, "transfer.fallback", time.time(), **fields)

        self.background.spawn(emit(), "event:transfer.fallback")
        return reason


class StorageImports:
    """Confirms a KV import through HiCache storage after the engine answered: SGLang reports in
    ``meta_info.cached_tokens_details.storage`` (``Timings.storage_tokens``) how many prompt tokens
    it loaded from there. A hit counts ``heterofold_storage_hits_total`` and its tokens and emits
    ``kv.hit`` with tier ``hicache``; a miss (nothing loaded, nothing cached either) is a fallback at stage
    ``import``: the engine prefilled natively, and the turn is accounted as native."""

    def __init__(self, fallbacks: Fallbacks) -> None:
        self.fallbacks = fallbacks
        self.hits = fallbacks.metrics.storage_hits
        self.hit_tokens = fallbacks.metrics.storage_hit_tokens

    def confirm(self, hop: Hop, plan: HopPlan, timings: Timings) -> HopPlan:
        if plan.past is None or timings.storage_tokens is None:
            return plan  # nothing imported, or an engine that imports directly
        if timings.storage_tokens > 0:
            self.hits.labels(hop.engine_name).inc()
            self.hit_tokens.labels(hop.engine_name).inc(timings.storage_tokens)
            fields = {"tier": "hicache", "engine": hop.engine_name, "role": hop.role, "tokens": timings.storage_tokens,
                      "path": plan.path}  # fmt: skip
            emit = asyncio.to_thread(self.fallbacks.store.events.emit_quietly, "kv.hit", time.time(), **fields)
            self.fallbacks.background.spawn(emit, "event:kv.hit")
            return plan
        if timings.cached_tokens > 0:
            return plan  # served from the engine's own cache (an earlier import of the same pages)
        miss = StorageMiss(f"{hop.engine_name} loaded none of the {plan.cached_tokens} imported tokens")
        return HopPlan("native", fallback=self.fallbacks.record("import", miss, hop.role), inputs=plan.inputs)


class HopPlanner:
    def __init__(
        self, *, store: KVStore, conversations: Conversations, resolver: AdapterResolver, fallbacks: Fallbacks,
        names: Callable[[str], str | None], engines: Callable[[str], Engine | None] = lambda fp: None,
        scout: Engine | None = None,
    ) -> None:  # fmt: skip
        self.store = store
        self.conversations = conversations
        self.resolver = resolver
        self.fallbacks = fallbacks
        self.names = names  # fingerprint -> engine name, for route labels
        self.engines = engines  # fingerprint -> engine, for a selector that reads the sender
        self.scout = scout  # the scout selector's reader, when the pool has it
        self._identity: dict[str, Adapter] = {}
        self.imports = StorageImports(fallbacks)

    def confirm(self, hop: Hop, plan: HopPlan, timings: Timings) -> HopPlan:
        """The plan as the engine carried it out (an SGLang storage miss turns it native)."""
        return self.imports.confirm(hop, plan, timings)

    def refused(self, hop: Hop, plan: HopPlan, exc: KVMismatch) -> HopPlan:
        """The plan when the engine refused its KV before answering: native prefill of the original
        prompt, recorded as a fallback at stage ``engine``. A plan without KV has nothing to refuse."""
        if plan.past is None:
            raise exc
        return HopPlan("native", fallback=self.fallbacks.record("engine", exc, hop.role), inputs=plan.inputs)

    async def plan(self, hop: Hop) -> HopPlan:
        best = HopPlan("native")
        if hop.policy.prefix_reuse:
            try:
                past = await asyncio.to_thread(self._cached_prefix, hop)
            except FALLBACK_ERRORS as exc:
                best = replace(best, fallback=self.fallbacks.record("prefix", exc, hop.role))
            else:
                if past is not None:
                    best = HopPlan("prefix", past)
        if not (hop.policy.transfer and hop.conversation_id):
            return best
        if len(hop.ids) - best.cached_tokens < hop.policy.min_uncached_tokens:
            return best
        try:
            inputs = await self._inputs(hop)
            if inputs is None:
                return best
            planned = await self._transfer(hop, inputs)
        except EngineBusy:
            raise
        except FALLBACK_ERRORS as exc:
            return replace(best, fallback=self.fallbacks.record("transfer", exc, hop.role))
        except Exception as exc:  # a defect in the transfer path: logged with its traceback, answered natively
            log.exception("transfer path failed for role %s", hop.role)
            return replace(best, fallback=self.fallbacks.record("transfer", exc, hop.role))
        if planned is not None and (planned.prompt is not None or planned.cached_tokens > best.cached_tokens):
            return planned
        return replace(best, inputs=inputs)

    def _cached_prefix(self, hop: Hop) -> KVCache | None:
        scope = self.store.scope(hop.engine.spec.fingerprint, hop.tenant)
        match = self.store.lookup(scope, hop.ids[:-1])  # at least one token always runs
        return None if match is None else self.store.load(match)

    async def _inputs(self, hop: Hop) -> TransferInputs | None:
        assert hop.conversation_id is not None
        turn = await asyncio.to_thread(self.conversations.latest, hop.tenant, hop.conversation_id)
        if turn is None:
            return None
        sections = shared_sections(turn.text, hop.text, hop.contents)
        if not sections:
            return None
        scope = self.store.scope(turn.fingerprint, hop.tenant)
        match = await asyncio.to_thread(self.store.lookup, scope, turn.token_ids)
        if match is None:
            raise SenderKVMissing(f"no KV value in the store for the turn of {turn.engine}")
        sender_kv = await asyncio.to_thread(self.store.load, match)
        return TransferInputs((turn.fingerprint, hop.engine.spec.fingerprint), turn, sender_kv, sections)

    async def _adapter(self, hop: Hop, pair: tuple[str, str]) -> tuple[Adapter, VersionRef | None] | None:
        if pair[0] == pair[1]:
            if not hop.policy.same_model:
                return None
            spec = hop.engine.spec
            if spec.fingerprint not in self._identity:
                self._identity[spec.fingerprint] = Adapter.identity(Side.of(spec), IDENTITY)
            return self._identity[spec.fingerprint], None
        resolved = await self.resolver.active(pair)
        return None if resolved is None else (resolved.adapter, resolved.ref)

    async def _transfer(self, hop: Hop, inputs: TransferInputs) -> HopPlan | None:
        path = hop.path_for(inputs.pair)
        ev = self.evidence(hop, inputs) if path != "transfer" else None  # built once for the quote paths
        if path == "auto":
            assert ev is not None
            chosen_path: Literal["quote", "transfer", "map_quote"] = await asyncio.to_thread(auto_path, ev)
            path = chosen_path  # off the event loop: the request classifier runs a model (~18 ms)
        if path == "quote":
            assert ev is not None
            return await self._quote(hop, inputs, ev)
        chosen = await self._adapter(hop, inputs.pair)
        if chosen is None:
            return None
        adapter, ref = chosen
        prompt = None
        selector = hop.selector(inputs)
        if path == "map_quote":
            assert ev is not None
            selection = await select(selector, ev, hop.policy.recompute_budget)
            last, head = quoted_last(hop, inputs.sections, selection.positions)
            prompt = hop_prompt(hop, [*hop.messages[:-1], last])
            q_hop = replace(hop, text=prompt.text, ids=prompt.ids, offsets=prompt.offsets)
            sections = shared_sections(inputs.sender.text, prompt.text, [*hop.contents[:-1], head])
            if not sections:  # nothing shared before the quote: nothing to map
                return None
            q_inputs = replace(inputs, sections=sections)

            async def build(other: Adapter) -> TransferResult:
                return await run_transfer(other, q_hop, q_inputs, selector, budget=0.0)

        else:
            sender = self.engines(inputs.pair[0])

            async def build(other: Adapter) -> TransferResult:
                return await run_transfer(other, hop, inputs, selector, sender=sender, scout=self.scout)

        async def rebuild(other: Adapter) -> KVCache:
            return (await build(other)).kv

        result = await build(adapter)
        if path == "map_quote":
            result = replace(result, select_ms=selection.ms)
        return HopPlan(
            path,
            result.kv,
            adapter_version=ref.version if ref else adapter.manifest.version,
            adapter_id=ref.id if ref else None,
            route=f"{self.names(inputs.pair[0]) or '?'} -> {hop.engine_name}",
            tokens_transferred=result.mapped,
            tokens_recomputed=result.recomputed,
            transfer_ms=result.total_ms,
            selector=selector.name if hop.policy.recompute_budget > 0 else None,
            inputs=inputs,
            prompt=prompt,
            rebuild=rebuild,
        )

    def evidence(self, hop: Hop, inputs: TransferInputs) -> Evidence:
        text = hop_text(hop, inputs)
        prefix = text.transferable_prefix()
        return Evidence(text, candidates(text, prefix), self.engines(inputs.pair[0]),
                        hop.engine, None, self.scout)  # fmt: skip

    async def _quote(self, hop: Hop, inputs: TransferInputs, ev: Evidence) -> HopPlan:
        """No KV: the messages' shared text cut down to the selector's spans (``ev``: this hop's evidence)."""
        selector = hop.selector(inputs)
        selection = await select(selector, ev, hop.policy.recompute_budget)
        prompt = hop_prompt(hop, quoted_messages(hop, inputs.sections, selection.positions))
        return HopPlan(
            "quote", route=f"{self.names(inputs.pair[0]) or '?'} -> {hop.engine_name}", transfer_ms=selection.ms,
            selector=selector.name if hop.policy.recompute_budget > 0 else None, inputs=inputs, prompt=prompt,
        )  # fmt: skip


def hop_text(hop: Hop, inputs: TransferInputs) -> HopText:
    n = inputs.sender_kv.num_tokens
    return HopText(inputs.sender_kv, inputs.sender.text, inputs.sender.offsets[:n], hop.text, hop.ids, hop.offsets,
                   inputs.sections, asked(hop, inputs.sections))  # fmt: skip


def asked(hop: Hop, sections: Sequence[Section]) -> str:
    """What the new message asks, as the selectors read it: its text before the first shared
    section inside it and after the last one (a document pasted with the question is context, not
    question, the lines between its shared pieces included; ``heterofold eval`` asks the item's
    question alone the same way), else the whole message when nothing else is left."""
    content = hop.question
    start = hop.text.rfind(content) if content else -1
    end = start + len(content)
    inside = [(s.receiver_start, s.receiver_start + s.length) for s in sections
              if start >= 0 and start <= s.receiver_start and s.receiver_start + s.length <= end]  # fmt: skip
    if not inside:
        return content
    own = f"{hop.text[start : inside[0][0]].strip()} {hop.text[max(b for _, b in inside) : end].strip()}".strip()
    return own or content


async def run_transfer(
    adapter: Adapter, hop: Hop, inputs: TransferInputs, selector: Selector | None = None, *,
    budget: float | None = None, sender: Engine | None = None, scout: Engine | None = None,
) -> TransferResult:  # fmt: skip
    """``engines.transfer.transfer`` for this hop, with the role's selector (for this sender) and budget."""
    return await transfer(
        adapter, hop_text(hop, inputs), hop.engine, selector=selector or hop.selector(inputs),
        budget=hop.policy.recompute_budget if budget is None else budget, tail=hop.tail_window,
        sender=sender, scout=scout,
    )  # fmt: skip


def hop_prompt(hop: Hop, messages: Sequence[dict[str, str]]) -> Prompt:
    text = hop.engine.render(messages)
    enc = hop.engine.encode(text)
    return Prompt(text, enc.ids, enc.offsets)


def quoted_last(hop: Hop, sections: Sequence[Section], positions: Sequence[int]) -> tuple[dict[str, str], str]:
    """The new message with the chosen spans quoted (the ``map_quote`` path,
    ``heterofold.select.quote_into``), and the part of it before the quote."""
    quote = elide(hop.text, [hop.offsets[j] for j in positions])
    last = dict(hop.messages[-1])
    content = last["content"]
    start = hop.text.rfind(content) if content else -1
    last["content"], head = quote_into(content, start, [(s.receiver_start, s.length) for s in sections], quote)
    return last, head


def quoted_messages(hop: Hop, sections: Sequence[Section], positions: Sequence[int]) -> list[dict[str, str]]:
    """The hop's messages with their shared text cut down to the chosen spans
    (``heterofold.select.elide``), the new message's too (a document pasted with the question, as
    ``heterofold eval``'s quote drops the item's context); system messages stay whole."""
    spans = [hop.offsets[j] for j in positions]
    out, at = [], 0
    for message in hop.messages:
        content = message["content"]
        start = hop.text.find(content, at) if content else -1
        if start < 0:
            out.append(dict(message))
            continue
        at = end = start + len(content)
        shared = [(s.receiver_start, s.receiver_start + s.length) for s in sections
                  if start <= s.receiver_start and s.receiver_start + s.length <= end]  # fmt: skip
        if not shared or message["role"] == "system":
            out.append(dict(message))
            continue
        keep = _outside(start, end, shared) + [(a, b) for a, b in spans if start <= a and b <= end]
        rel = [(a - start, b - start) for a, b in keep]
        out.append({**message, "content": elide(content, rel) or QUOTE_SEPARATOR.strip()})
    return out


def _outside(start: int, end: int, shared: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """The parts of ``[start, end)`` outside every ``shared`` span (sorted, disjoint)."""
    out, at = [], start
    for a, b in sorted(shared):
        if a > at:
            out.append((at, a))
        at = max(at, b)
    if at < end:
        out.append((at, end))
    return out
