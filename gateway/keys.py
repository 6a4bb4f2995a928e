"""Every Redis key the gateway writes (the store's own keys are in ``store/keys.py``).

    {prefix}:conv:{tenant}:{conversation}   HASH  the conversation's latest turn (see ``Conversations``)

``tenant`` and ``conversation`` are digests: neither a client key nor a client's conversation id
appears in Redis in clear. Every key carries a TTL.
"""

from __future__ import annotations

import hashlib


def conversation(prefix: str, tenant: str, conversation_id: str) -> str:
    digest = hashlib.sha256(conversation_id.encode()).hexdigest()[:32]
    return f"{prefix}:conv:{tenant or '-'}:{digest}"
