"""Source clocks for the client side: the system clock, or a simulated one with offset and skew.

A clock is any ``Callable[[], int]`` returning microseconds.  If it also has
``from_realtime_ns(realtime_ns) -> int``, the asyncio client can convert the kernel's receive
timestamp of a reply (CLOCK_REALTIME) into that clock and use it as T4, which removes the event
loop's wake-up latency from the measurement.
"""

from __future__ import annotations

import time

__all__ = ["SimulatedClock", "SystemClock"]


class SystemClock:
    """CLOCK_REALTIME in microseconds (the default source clock)."""

    def __call__(self) -> int:
        return time.time_ns() // 1000

    def from_realtime_ns(self, realtime_ns: int) -> int:
        return realtime_ns // 1000


class SimulatedClock:
    """A source clock ``offset_us`` ahead of CLOCK_REALTIME and running ``skew_ppm`` fast.

    ``t_source = t_real + offset_us + skew_ppm * 1e-6 * (t_real - origin_us)``; ``origin_us``
    defaults to the creation time.  Demos and tests use it to play a badly set source (the thesis
    evaluates offsets from 1 ms to 1 h); with the sign convention ``t_ref = t_source + offset``,
    a source ahead by ``offset_us`` is measured with offset ``-offset_us`` against an exact
    reference.
    """

    def __init__(self, offset_us: int = 0, skew_ppm: float = 0.0, origin_us: int | None = None) -> None:
        self.offset_us = offset_us
        self.skew_ppm = skew_ppm
        self.origin_us = time.time_ns() // 1000 if origin_us is None else origin_us

    def ahead_of_realtime_us(self, realtime_us: int) -> float:
        return self.offset_us + self.skew_ppm * 1e-6 * (realtime_us - self.origin_us)

    def from_realtime_ns(self, realtime_ns: int) -> int:
        realtime_us = realtime_ns // 1000
        return realtime_us + round(self.ahead_of_realtime_us(realtime_us))

    def __call__(self) -> int:
        return self.from_realtime_ns(time.time_ns())
