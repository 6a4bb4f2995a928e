"""Work that runs after the answer (storing the turn, shadow evaluation, fit jobs): tasks the app
holds until they end, whose failures are logged, never raised into a request."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

log = logging.getLogger(__name__)


class Background:
    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("background task %s failed", task.get_name(), exc_info=task.exception())

    @property
    def pending(self) -> int:
        return len(self._tasks)

    async def drain(self, timeout_s: float | None = None) -> None:
        """Wait for the tasks running now (tests; shutdown)."""
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=timeout_s)

    async def aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
