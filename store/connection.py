"""The Redis client the store uses, and the one place Redis exceptions become ``StoreError``s."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from store.errors import IndexFailure, StoreUnavailable


def connect(url: str, connect_timeout_s: float, socket_timeout_s: float) -> redis.Redis:
    """A pooled client with short timeouts. One immediate retry lets a pooled connection that a
    Redis restart broke reconnect without the caller noticing; a Redis that is really down still
    fails within about two connect timeouts."""
    return redis.Redis.from_url(
        url,
        socket_connect_timeout=connect_timeout_s,
        socket_timeout=socket_timeout_s,
        retry=Retry(NoBackoff(), 1),
        health_check_interval=0,
    )


@contextmanager
def redis_errors(what: str) -> Iterator[None]:
    """Translate redis-py errors raised inside the block; ``what`` names the operation."""
    try:
        yield
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:  # BusyLoading too
        raise StoreUnavailable(f"{what}: Redis unreachable: {exc}") from exc
    except redis.exceptions.RedisError as exc:
        raise IndexFailure(f"{what}: {exc}") from exc
