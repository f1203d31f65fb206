"""How the merger maps a source timestamp onto the reference clock.

Sign convention (as in :mod:`timesync.estimator`): ``t_ref = t_source + offset_us``.

The merger depends only on the :class:`ReferenceClock` protocol, so the gateway can plug in its
Source Information Store; this module also holds small adapters used by tests and the replay.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

__all__ = ["ClockEstimateLike", "EstimateClock", "FixedOffsetClock", "IdentityClock", "ReferenceClock"]


class ReferenceClock(Protocol):
    """Maps ``(source_id, source_ts_us)`` to ``(ref_ts_us, error_bound_us)``."""

    def to_reference(self, source_id: str, source_ts_us: int) -> tuple[int, int]: ...


class ClockEstimateLike(Protocol):
    """The part of ``timesync.estimator.ClockEstimate`` the adapter needs (structural, no import)."""

    def to_reference_us(self, source_ts_us: int) -> int: ...

    def error_bound_us(self, at_ref_us: int) -> int: ...


class IdentityClock:
    """Every source clock is taken as the reference clock (no sync; thesis Table 5.10 'without')."""

    def to_reference(self, source_id: str, source_ts_us: int) -> tuple[int, int]:
        return source_ts_us, 0


class FixedOffsetClock:
    """Known constant offsets per source (tests, or sources already disciplined by NTP)."""

    def __init__(self, offsets_us: Mapping[str, int], error_bound_us: int = 0) -> None:
        self._offsets = dict(offsets_us)
        self._error = error_bound_us

    def to_reference(self, source_id: str, source_ts_us: int) -> tuple[int, int]:
        return source_ts_us + self._offsets.get(source_id, 0), self._error


class EstimateClock:
    """Adapter over per-source clock estimates (e.g. ``timesync`` ``ClockEstimate`` objects).

    A source without an estimate yet maps through unchanged with an unknown (huge) error bound, so it
    cannot advance a watermark by accident.
    """

    UNKNOWN_ERROR_US = 3_600_000_000

    def __init__(self) -> None:
        self._estimates: dict[str, ClockEstimateLike] = {}

    def update(self, source_id: str, estimate: ClockEstimateLike) -> None:
        self._estimates[source_id] = estimate

    def to_reference(self, source_id: str, source_ts_us: int) -> tuple[int, int]:
        est = self._estimates.get(source_id)
        if est is None:
            return source_ts_us, self.UNKNOWN_ERROR_US
        ref = est.to_reference_us(source_ts_us)
        return ref, est.error_bound_us(ref)
