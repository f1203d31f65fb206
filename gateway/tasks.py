"""The gateway's background tasks, never failing silently: each task's failure reaches its owner's failure path
(which logs, counts and shows it in /healthz); a cancelled task is no failure."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterator
from typing import Any


class SupervisedTasks:
    """The tasks one owner (the gateway, a shard) started, with ``on_failure(task, error)`` called for each that
    raised."""

    def __init__(self, on_failure: Callable[[asyncio.Task[None], BaseException], None]) -> None:
        self._on_failure = on_failure
        self._tasks: list[asyncio.Task[None]] = []

    def start(self, coroutine: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = asyncio.create_task(coroutine, name=name)
        task.add_done_callback(self._done)
        self._tasks.append(task)
        return task

    def __iter__(self) -> Iterator[asyncio.Task[None]]:
        return iter(list(self._tasks))

    def _done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        error = task.exception()
        if error is not None:
            self._on_failure(task, error)
