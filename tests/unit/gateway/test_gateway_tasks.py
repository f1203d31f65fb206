"""gateway.tasks.SupervisedTasks: a task that raises reaches its owner's failure path; one that ends or is
cancelled does not."""

from __future__ import annotations

import asyncio

from gateway.tasks import SupervisedTasks


async def test_only_a_task_that_raised_is_reported_with_its_error() -> None:
    failed: list[tuple[str, str]] = []
    tasks = SupervisedTasks(lambda task, error: failed.append((task.get_name(), repr(error))))

    async def raises() -> None:
        raise ZeroDivisionError("boom")

    async def ends() -> None:
        return None

    async def waits() -> None:
        await asyncio.Event().wait()

    started = [tasks.start(raises(), "raises"), tasks.start(ends(), "ends"), tasks.start(waits(), "waits")]
    await asyncio.sleep(0)
    started[2].cancel()
    await asyncio.gather(*started, return_exceptions=True)
    await asyncio.sleep(0)  # done callbacks run on the loop's next turn
    assert failed == [("raises", "ZeroDivisionError('boom')")]
    assert list(tasks) == started
