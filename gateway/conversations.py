"""A conversation's latest turn, kept in Redis so that any gateway replica can take the next hop.

A turn names the model that ran it and the exact tokens of its KV value (prompt plus reply), with
each token's character span in ``text`` (the sender's prompt plus its decoded reply). The next hop
finds the KV value in the store by those tokens, and aligns it by those spans.

The one Redis key the gateway writes (the store's own keys are in ``store/redis_keys.py``):

    {prefix}:conv:{tenant}:{conversation}   HASH  the conversation's latest turn (see ``Conversations``)

``tenant`` and ``conversation`` are digests: neither a client key nor a client's conversation id
appears in Redis in clear. Every key carries a TTL.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import redis

from store.connection import redis_errors


@dataclass(frozen=True)
class Turn:
    engine: str
    fingerprint: str
    text: str
    token_ids: tuple[int, ...]
    offsets: tuple[tuple[int, int], ...]

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.offsets):
            raise ValueError(f"{len(self.token_ids)} tokens but {len(self.offsets)} offsets")


def conversation_key(prefix: str, tenant: str, conversation_id: str) -> str:
    digest = hashlib.sha256(conversation_id.encode()).hexdigest()[:32]
    return f"{prefix}:conv:{tenant or '-'}:{digest}"


class Conversations:
    """Raises ``StoreUnavailable``/``IndexFailure`` (``store.errors``) when Redis fails."""

    def __init__(self, client: redis.Redis, *, prefix: str, ttl_s: int) -> None:
        self.client = client
        self.prefix = prefix
        self.ttl_s = ttl_s

    def latest(self, tenant: str, conversation_id: str) -> Turn | None:
        with redis_errors("conversation read"):
            raw: dict[bytes, bytes] = self.client.hgetall(conversation_key(self.prefix, tenant, conversation_id))  # type: ignore[assignment]
        if not raw:
            return None
        ids = np.frombuffer(raw[b"ids"], dtype="<u4").astype(np.int64)
        offsets = np.frombuffer(raw[b"offsets"], dtype="<i4").reshape(-1, 2)
        return Turn(
            engine=raw[b"engine"].decode(),
            fingerprint=raw[b"fingerprint"].decode(),
            text=raw[b"text"].decode(),
            token_ids=tuple(int(i) for i in ids),
            offsets=tuple((int(a), int(b)) for a, b in offsets),
        )

    def record(self, tenant: str, conversation_id: str, turn: Turn) -> None:
        key = conversation_key(self.prefix, tenant, conversation_id)
        fields = {
            "engine": turn.engine,
            "fingerprint": turn.fingerprint,
            "text": turn.text,
            "ids": np.asarray(turn.token_ids, dtype="<u4").tobytes(),
            "offsets": np.asarray(turn.offsets, dtype="<i4").reshape(-1, 2).tobytes(),
        }
        with redis_errors("conversation write"), self.client.pipeline(transaction=True) as pipe:
            pipe.delete(key)
            pipe.hset(key, mapping=fields)  # type: ignore[arg-type]
            pipe.expire(key, self.ttl_s)
            pipe.execute()
