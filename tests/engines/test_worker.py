import asyncio
import threading

import pytest

from engines.errors import EngineBusy
from engines.worker import Worker


def test_full_queue_answers_busy_at_once_and_frees_up_after() -> None:
    async def main() -> None:
        worker = Worker("w", capacity=2)
        gate = threading.Event()
        first = asyncio.ensure_future(worker.submit(gate.wait))
        second = asyncio.ensure_future(worker.submit(lambda: 2))
        await asyncio.sleep(0.05)
        assert worker.pending == 2 and not worker.can_submit()
        with pytest.raises(EngineBusy):
            await worker.submit(lambda: 3)
        gate.set()
        assert await first is True and await second == 2
        assert await worker.submit(lambda: 4) == 4
        assert worker.pending == 0
        worker.shutdown()

    asyncio.run(main())


def test_work_runs_off_the_event_loop_thread() -> None:
    async def main() -> None:
        worker = Worker("w", capacity=1)
        name = await worker.submit(lambda: threading.current_thread().name)
        assert name.startswith("engine-w") and name != threading.current_thread().name
        worker.shutdown()

    asyncio.run(main())
