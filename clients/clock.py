"""Source clocks for demos and tests: a base clock shifted by an offset and drifting at a constant rate.

Sign convention (the simulated clock's own, stated once): ``SimulatedClock(offset_us=+5_000)`` reads 5 ms *ahead*
of its base. The record contract's ``offset_us`` is the other way round (``t_ref = t_source + offset_us``), so a
gateway whose reference clock is the base will estimate ``offset_us ≈ -5_000`` for it.
"""

from __future__ import annotations

from collections.abc import Callable

from skewless.clock import system_time_us

__all__ = ["MAX_SKEW_PPM", "SimulatedClock", "for_time_sync"]

# Quartz oscillators drift by tens of ppm; 1000 ppm (86 s a day) is broken hardware, not a clock to simulate.
MAX_SKEW_PPM = 1000.0


class SimulatedClock:
    """``clock() = base() + offset_us + skew_ppm * 1e-6 * (base() - origin_us)`` in integer microseconds.

    ``origin_us`` (default: ``base()`` at construction) is where the drift starts, so at construction the clock
    is exactly ``offset_us`` ahead of its base and the gap grows by ``skew_ppm`` µs per second of base time.
    Pass a virtual ``base`` in tests; the default is the system clock.
    """

    def __init__(self, offset_us: int = 0, skew_ppm: float = 0.0, base: Callable[[], int] = system_time_us,
                 origin_us: int | None = None) -> None:
        if abs(skew_ppm) > MAX_SKEW_PPM:
            raise ValueError(f"|skew_ppm| must be <= {MAX_SKEW_PPM}")
        self.offset_us = offset_us
        self.skew_ppm = skew_ppm
        self.base = base
        self.origin_us = base() if origin_us is None else origin_us

    def at(self, base_us: int) -> int:
        """What this clock reads when its base reads ``base_us`` (pure)."""
        return base_us + self.offset_us + round(self.skew_ppm * 1e-6 * (base_us - self.origin_us))

    def error_us(self, base_us: int) -> int:
        """How far ahead of the base this clock is at ``base_us``."""
        return self.at(base_us) - base_us

    def __call__(self) -> int:
        return self.at(self.base())

    def realtime_converter(self) -> Callable[[int], int] | None:
        """CLOCK_REALTIME ns -> this clock, when its base is the system clock (time sync then takes T4 from the
        kernel's receive timestamp instead of a read after the event loop woke up)."""
        if self.base is not system_time_us:
            return None
        return lambda realtime_ns: self.at(realtime_ns // 1000)

    def __repr__(self) -> str:
        return f"SimulatedClock(offset_us={self.offset_us}, skew_ppm={self.skew_ppm})"


class _KernelStampedClock:
    """A source clock plus its CLOCK_REALTIME converter, in the shape timesync's client looks for."""

    def __init__(self, clock: Callable[[], int], from_realtime_ns: Callable[[int], int]) -> None:
        self._clock = clock
        self.from_realtime_ns = from_realtime_ns

    def __call__(self) -> int:
        return self._clock()


def for_time_sync(clock: Callable[[], int]) -> Callable[[], int]:
    """The clock to hand to time sync: the same readings, plus kernel-timestamp conversion where it is known."""
    if clock is system_time_us:
        return _KernelStampedClock(clock, lambda realtime_ns: realtime_ns // 1000)
    if isinstance(clock, SimulatedClock):
        converter = clock.realtime_converter()
        if converter is not None:
            return _KernelStampedClock(clock, converter)
    return clock
