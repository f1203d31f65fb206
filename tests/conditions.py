"""Waiting on conditions, not on time: a loaded 2-core CI machine makes every fixed sleep a future flake."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


async def wait_until(condition: Callable[[], bool], timeout_s: float = 30.0, what: str = "condition",
                     poll_s: float = 0.01) -> None:
    """Return as soon as ``condition()`` holds; fail with ``what`` after ``timeout_s`` (a ceiling, not a pace)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(poll_s)
