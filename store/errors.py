"""Errors of the store package. Every failure a caller can act on is one of these; the gateway
turns any ``StoreError`` on the hot path into native prefill and records the class as the reason.

StoreError
├── StoreUnavailable       Redis cannot be reached or timed out (fail fast, short socket timeouts)
│   └── EmbeddedRedisError     the embedded redis-server did not start
├── IndexFailure           Redis answered with an error (its own OOM, a key of the wrong type)
├── NodeInUse              another live process holds this node's lease (``store/lease.py``)
├── BadRequest             token ids outside uint32, an empty sequence, a value of another model
├── PayloadError           a payload the index names cannot be returned
│   ├── PayloadMissing         its tier no longer holds it (evicted meanwhile, or lost at a restart)
│   └── PayloadCorrupt         its bytes fail their checksum; already removed from the index
└── TierError              a tier cannot take a payload; raised by tiers, caught by the placer
    ├── TierFull               not enough of the budget left (making room is the placer's job)
    └── TierUnavailable        the medium failed: disk full or unwritable
        └── EnginePressure         the engine holding the device tier reports memory pressure

``TierError`` never reaches callers of ``KVStore``: ``put`` skips the tier, emits ``oom.alert``
and reports the outcome in its result, and the request goes on without caching.
"""


class StoreError(Exception):
    """Base of every error raised by ``store``."""


class StoreUnavailable(StoreError):
    pass


class EmbeddedRedisError(StoreUnavailable):
    pass


class IndexFailure(StoreError):
    pass


class NodeInUse(StoreError):
    pass


class BadRequest(StoreError):
    pass


class PayloadError(StoreError):
    pass


class PayloadMissing(PayloadError):
    pass


class PayloadCorrupt(PayloadError):
    pass


class TierError(StoreError):
    pass


class TierFull(TierError):
    pass


class TierUnavailable(TierError):
    pass


class EnginePressure(TierUnavailable):
    pass
