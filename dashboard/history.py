"""Tier memory over time: the store's usage sampled every ``interval_s`` into a bounded ring buffer.

Usage is per node (the tiers live in this process and its engines), so each gateway replica keeps
its own history; it starts empty when the gateway starts.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import NamedTuple

from store.errors import StoreError
from store.node_tiers import TierUsage

log = logging.getLogger(__name__)


class TierSample(NamedTuple):
    ts: float
    tiers: tuple[TierUsage, ...]


class TierHistory:
    def __init__(self, maxlen: int) -> None:
        if maxlen < 1:
            raise ValueError("maxlen must be positive")
        self._samples: deque[TierSample] = deque(maxlen=maxlen)

    def add(self, ts: float, tiers: Sequence[TierUsage]) -> None:
        self._samples.append(TierSample(ts, tuple(tiers)))

    def samples(self) -> list[TierSample]:
        return list(self._samples)

    def __len__(self) -> int:
        return len(self._samples)

    def percent_series(self) -> dict[str, list[tuple[float, float]]]:
        """Per tier with a budget: (time, percent of budget used)."""
        out: dict[str, list[tuple[float, float]]] = {}
        for s in self._samples:
            for t in s.tiers:
                if t.budget > 0:
                    out.setdefault(t.tier, []).append((s.ts, 100.0 * t.used / t.budget))
        return out


async def sample_forever(
    history: TierHistory, usage: Callable[[], Sequence[TierUsage]], interval_s: float,
    clock: Callable[[], float] = time.time,
) -> None:  # fmt: skip
    """Append one sample every ``interval_s`` until cancelled; a store that fails skips a sample."""
    while True:
        try:
            tiers = await asyncio.to_thread(usage)
        except StoreError as exc:
            log.debug("tier usage not sampled: %s", exc)
        else:
            history.add(clock(), tiers)
        await asyncio.sleep(interval_s)
