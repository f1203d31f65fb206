"""Clocks are injected everywhere; these are the real ones the shells pass in."""

from __future__ import annotations

import time
from collections.abc import Callable

ClockUs = Callable[[], int]


def system_time_us() -> int:
    """The gateway's reference clock by default: the local system clock, integer microseconds since the epoch."""
    return time.time_ns() // 1000
