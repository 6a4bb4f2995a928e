"""One inference thread per engine, behind a bounded queue.

The event loop never runs model code: work is submitted to a single worker thread, so an engine
runs one request at a time in arrival order. ``capacity`` counts the running request plus the
waiting ones; a submission beyond it raises ``EngineBusy`` at once instead of queueing forever.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from engines.errors import EngineBusy

T = TypeVar("T")


class Worker:
    def __init__(self, name: str, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self.name = name
        self.capacity = capacity
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"engine-{name}")
        self._lock = threading.Lock()
        self._pending = 0

    @property
    def pending(self) -> int:
        return self._pending

    def can_submit(self) -> bool:
        return self._pending < self.capacity

    async def submit(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the worker thread and await its result. Raises EngineBusy when full."""
        with self._lock:
            if self._pending >= self.capacity:
                raise EngineBusy(f"engine {self.name} is busy: {self._pending} requests queued")
            self._pending += 1
        try:
            future = self._executor.submit(fn)
        except RuntimeError:
            self._release()
            raise
        # Released when the work itself ends, not when the awaiting task is cancelled.
        future.add_done_callback(lambda _: self._release())
        return await asyncio.wrap_future(future)

    def _release(self) -> None:
        with self._lock:
            self._pending -= 1

    def shutdown(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)
