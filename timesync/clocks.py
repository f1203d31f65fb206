"""Every clock of the project, in one place.

One sign convention, used by every module and record: a clock that reads *ahead* of another by ``ahead_us`` is
described by how far it is ahead (``SimulatedClock(ahead_us=...)``, ``ReferenceClock(ahead_us=...)``), and the
*offset* of a source is what must be added to its reading to get reference time::

    t_ref = t_source + offset_us          (so a source ahead by 5 ms has offset_us = -5_000)

Three kinds of clock live here:

* source clocks (``system_time_us``, :class:`SimulatedClock`), callables returning integer microseconds;
* the gateway's :class:`ReferenceClock` (CLOCK_REALTIME shifted for demos, disciplined upstream);
* :class:`ReferenceMapping` and its adapters: how the merger turns ``(source_id, source_ts_us)`` into
  ``(ref_ts_us, error_bound_us)``.

A clock that can also convert a CLOCK_REALTIME kernel timestamp (``from_realtime_ns``) lets time sync take T4 from
the kernel's receive timestamp instead of a read after the event loop woke up; :func:`for_time_sync` adds that
conversion where it is known.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Protocol

__all__ = [
    "MAX_SKEW_PPM", "UNKNOWN_ERROR_BOUND_US", "ClockEstimateLike", "ClockUs", "EstimateMapping",
    "FixedOffsetMapping", "IdentityMapping", "ReferenceClock", "ReferenceMapping", "SimulatedClock",
    "for_time_sync", "system_time_us",
]

ClockUs = Callable[[], int]
# Quartz oscillators drift by tens of ppm; 1000 ppm (86 s a day) is broken hardware, not a clock to simulate.
MAX_SKEW_PPM = 1000.0
# A source without an estimate has an unknown clock: this bound keeps it from advancing any watermark.
UNKNOWN_ERROR_BOUND_US = 3_600_000_000


def system_time_us() -> int:
    """CLOCK_REALTIME in integer microseconds since the epoch: the default source and reference clock."""
    return time.time_ns() // 1000


def realtime_ns_to_us(realtime_ns: int) -> int:
    return realtime_ns // 1000


# ------------------------------------------------------------------------------------------------ source clocks


class SimulatedClock:
    """``clock() = base() + ahead_us + skew_ppm * 1e-6 * (base() - origin_us)`` in integer microseconds.

    ``origin_us`` (default: ``base()`` at construction) is where the drift starts, so at construction the clock
    is exactly ``ahead_us`` ahead of its base and the gap grows by ``skew_ppm`` µs per second of base time.
    Pass a virtual ``base`` in tests; the default is the system clock. Measured against an exact reference, a
    source ahead by ``ahead_us`` has offset ``-ahead_us``.
    """

    def __init__(self, ahead_us: int = 0, skew_ppm: float = 0.0, base: ClockUs = system_time_us,
                 origin_us: int | None = None) -> None:
        if abs(skew_ppm) > MAX_SKEW_PPM:
            raise ValueError(f"|skew_ppm| must be <= {MAX_SKEW_PPM}")
        self.ahead_us = ahead_us
        self.skew_ppm = skew_ppm
        self.base = base
        self.origin_us = base() if origin_us is None else origin_us

    def at(self, base_us: int) -> int:
        """What this clock reads when its base reads ``base_us`` (pure)."""
        return base_us + self.ahead_us + round(self.skew_ppm * 1e-6 * (base_us - self.origin_us))

    def ahead_of_base_us(self, base_us: int) -> int:
        """How far ahead of the base this clock is at ``base_us``."""
        return self.at(base_us) - base_us

    def __call__(self) -> int:
        return self.at(self.base())

    def realtime_converter(self) -> Callable[[int], int] | None:
        """CLOCK_REALTIME ns -> this clock, when its base is the system clock."""
        if self.base is not system_time_us:
            return None
        return lambda realtime_ns: self.at(realtime_ns // 1000)

    def __repr__(self) -> str:
        return f"SimulatedClock(ahead_us={self.ahead_us}, skew_ppm={self.skew_ppm})"


class _KernelStampedClock:
    """A source clock plus its CLOCK_REALTIME converter, in the shape time sync looks for."""

    def __init__(self, clock: ClockUs, from_realtime_ns: Callable[[int], int]) -> None:
        self._clock = clock
        self.from_realtime_ns = from_realtime_ns

    def __call__(self) -> int:
        return self._clock()


def for_time_sync(clock: ClockUs) -> ClockUs:
    """The clock to hand to time sync: the same readings, plus kernel-timestamp conversion where it is known."""
    if clock is system_time_us:
        return _KernelStampedClock(clock, realtime_ns_to_us)
    if isinstance(clock, SimulatedClock):
        converter = clock.realtime_converter()
        if converter is not None:
            return _KernelStampedClock(clock, converter)
    return clock


# ---------------------------------------------------------------------------------------------- reference clock


class ReferenceClock:
    """The gateway's reference clock: CLOCK_REALTIME, ``ahead_us`` ahead and running ``skew_ppm`` fast (demos
    and benchmarks: a reference that drifts away from the system clock from construction on), plus the
    ``correction_us`` an upstream discipline sets (0 when not disciplined)."""

    def __init__(self, ahead_us: int = 0, skew_ppm: float = 0.0) -> None:
        self.ahead_us = ahead_us
        self.skew_ppm = skew_ppm
        self.correction_us = 0
        self.origin_realtime_us = time.time_ns() // 1000

    def ahead_of_realtime_us(self, realtime_us: int) -> float:
        """How far the reference is ahead of CLOCK_REALTIME at ``realtime_us`` (ground truth)."""
        drift = self.skew_ppm * 1e-6 * (realtime_us - self.origin_realtime_us)
        return self.ahead_us + self.correction_us + drift

    def from_realtime_ns(self, realtime_ns: int) -> int:
        """Map a CLOCK_REALTIME reading (e.g. a kernel packet timestamp) onto the reference clock."""
        realtime_us = realtime_ns // 1000
        if self.skew_ppm == 0.0:
            return realtime_us + self.ahead_us + self.correction_us
        return realtime_us + round(self.ahead_of_realtime_us(realtime_us))

    def now_us(self) -> int:
        return self.from_realtime_ns(time.time_ns())

    __call__ = now_us


# ------------------------------------------------------------------------------ source time -> reference time


class ReferenceMapping(Protocol):
    """Maps ``(source_id, source_ts_us)`` to ``(ref_ts_us, error_bound_us)``: ``t_ref = t_source + offset_us``."""

    def to_reference(self, source_id: str, source_ts_us: int) -> tuple[int, int]: ...

    def rtt_us(self, source_id: str) -> int | None:
        """The round trip of the source's current estimate (the thesis' T_s; T_a is its maximum over a stream's
        sources), None where the mapping has none."""
        ...


class ClockEstimateLike(Protocol):
    """The part of a clock estimate (``timesync.estimator.ClockEstimate``, ``SourceInfo``) a mapping needs."""

    @property
    def rtt_us(self) -> int: ...

    def to_reference_us(self, source_ts_us: int) -> int: ...

    def error_bound_us(self, at_ref_us: int) -> int: ...


class IdentityMapping:
    """Every source clock is taken as the reference clock (no sync; thesis Table 5.10 'without')."""

    def to_reference(self, source_id: str, source_ts_us: int) -> tuple[int, int]:
        return source_ts_us, 0

    def rtt_us(self, source_id: str) -> int | None:
        return None


class FixedOffsetMapping:
    """Known constant offsets per source (tests, or sources already disciplined by NTP)."""

    def __init__(self, offsets_us: Mapping[str, int], error_bound_us: int = 0) -> None:
        self._offsets = dict(offsets_us)
        self._error = error_bound_us

    @property
    def offsets_us(self) -> dict[str, int]:
        """A copy of the offsets (the mapping's own never change once built)."""
        return dict(self._offsets)

    @property
    def error_bound_us(self) -> int:
        return self._error

    def to_reference(self, source_id: str, source_ts_us: int) -> tuple[int, int]:
        return source_ts_us + self._offsets.get(source_id, 0), self._error

    def rtt_us(self, source_id: str) -> int | None:
        return None


class EstimateMapping:
    """Per-source clock estimates, looked up by ``lookup`` (a dict's ``get``, or a Source Information Store's).

    A source without an estimate yet maps through unchanged with an unknown (huge) error bound, so it cannot
    advance a watermark by accident.
    """

    UNKNOWN_ERROR_US = UNKNOWN_ERROR_BOUND_US

    def __init__(self, lookup: Callable[[str], ClockEstimateLike | None] | None = None) -> None:
        self._estimates: dict[str, ClockEstimateLike] = {}
        self._lookup = lookup if lookup is not None else self._estimates.get

    @property
    def lookup(self) -> Callable[[str], ClockEstimateLike | None]:
        """How the estimate of a source is found (given, or this mapping's own dict's ``get``)."""
        return self._lookup

    def update(self, source_id: str, estimate: ClockEstimateLike) -> None:
        self._estimates[source_id] = estimate

    def to_reference(self, source_id: str, source_ts_us: int) -> tuple[int, int]:
        est = self._lookup(source_id)
        if est is None:
            return source_ts_us, UNKNOWN_ERROR_BOUND_US
        ref = est.to_reference_us(source_ts_us)
        return ref, est.error_bound_us(ref)

    def rtt_us(self, source_id: str) -> int | None:
        est = self._lookup(source_id)
        return None if est is None else est.rtt_us


class ReferenceErrorMapping:
    """A mapping on a gateway whose own reference clock is off common time by up to ``reference_error_us()``:
    gateways on different hosts stamp with different clocks, so each event's error bound grows by its gateway's
    (its host's NTP discipline, e.g. chrony's bound; zero for gateways sharing one host's clock)."""

    def __init__(self, inner: ReferenceMapping, reference_error_us: Callable[[], int]) -> None:
        self._inner = inner
        self._reference_error_us = reference_error_us

    def to_reference(self, source_id: str, source_ts_us: int) -> tuple[int, int]:
        ref_us, error_us = self._inner.to_reference(source_id, source_ts_us)
        if error_us >= UNKNOWN_ERROR_BOUND_US:
            return ref_us, error_us  # unknown stays unknown, not "unknown + 2 ms"
        return ref_us, error_us + self._reference_error_us()

    def rtt_us(self, source_id: str) -> int | None:
        return self._inner.rtt_us(source_id)
