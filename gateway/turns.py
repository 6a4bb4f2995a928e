"""After a turn (off the hot path): its KV value goes into the store for the next hop, and the
conversation's latest turn points at it.

The value stored is the whole turn as the engine exports it (prompt plus reply, in the model's own
layout). A Gemma-style sliding-window value longer than its window can be cut nowhere, so the
store indexes it only at its own length and only when that is a whole number of pages, otherwise
``put`` skips it. The conversation then keeps pointing at its previous turn, whose value the store
does hold: the next hop transfers from the most recent turn that can be reused.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from engines.base import Completion
from gateway.conversations import Conversations, Turn
from gateway.engine_pool import PooledEngine
from gateway.metrics import Metrics
from store.errors import StoreError
from store.kv_store import KVStore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FinishedTurn:
    pooled: PooledEngine
    tenant: str
    conversation_id: str | None
    prompt_text: str
    prompt_offsets: tuple[tuple[int, int], ...]
    completion: Completion


class TurnRecorder:
    def __init__(self, *, store: KVStore, conversations: Conversations, metrics: Metrics) -> None:
        self.store = store
        self.conversations = conversations
        self.metrics = metrics

    async def record(self, turn: FinishedTurn) -> str:
        """Store the turn's KV and point the conversation at it; returns the put outcome."""
        kv = turn.completion.kv
        if kv is None:
            return "none"
        engine = turn.pooled.engine
        scope = self.store.scope(engine.spec.fingerprint, turn.tenant)
        try:
            result = await asyncio.to_thread(self.store.put, scope, kv)
        except StoreError as exc:
            self.metrics.store_puts.labels("error").inc()
            log.warning("turn KV not stored: %s", exc)
            return "error"
        self.metrics.store_puts.labels(result.outcome).inc()
        if result.outcome == "skipped" or turn.conversation_id is None:
            return result.outcome
        latest = covered_turn(turn, kv.token_ids.tolist(), engine.decode)
        try:
            await asyncio.to_thread(self.conversations.record, turn.tenant, turn.conversation_id, latest)
        except StoreError as exc:
            log.warning("conversation not recorded: %s", exc)
            return "error"
        return result.outcome


def covered_turn(turn: FinishedTurn, token_ids: Sequence[int], decode: Callable[[Sequence[int]], str]) -> Turn:
    """The conversation's record of ``turn``, whose exported KV holds ``token_ids``: the prompt's
    tokens and the reply's but the last. An engine that keeps its KV in whole pages (SGLang's
    storage) may hold fewer tokens than the prompt; the record then has that many of the prompt's
    offsets (its text stays whole: the next hop aligns sections on the text, tokens up to the KV)."""
    n = len(turn.prompt_offsets)
    reply, offsets = reply_offsets(decode, len(turn.prompt_text), token_ids[n:])
    return Turn(
        engine=turn.pooled.name,
        fingerprint=turn.pooled.engine.spec.fingerprint,
        text=turn.prompt_text + reply,
        token_ids=tuple(token_ids),
        offsets=(turn.prompt_offsets + tuple(offsets))[: len(token_ids)],
    )


def reply_offsets(
    decode: Callable[[Sequence[int]], str], start: int, reply_ids: Sequence[int]
) -> tuple[str, list[tuple[int, int]]]:
    """The decoded reply and each reply token's span, counted from ``start`` (the prompt's length).
    A token that completes a multi-byte character owns the whole character; special tokens
    decode to nothing and own an empty span."""
    offsets: list[tuple[int, int]] = []
    before, text = 0, ""
    for i in range(len(reply_ids)):
        text = decode(reply_ids[: i + 1])
        offsets.append((start + min(before, len(text)), start + len(text)))
        before = len(text)
    return text, offsets
