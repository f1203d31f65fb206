"""LOW / MIDDLE / HIGH window assignment under clock uncertainty (thesis 003, Sec. 3.2.3.1, Query 4.4).

A reference timestamp ``x`` is only known to within ``±s`` of the true event time (``s = T_a / 2`` in the thesis,
Eq. 3.14/3.16).  Next to the estimated window ``MIDDLE = [t, t + w)`` the thesis keeps two windows shifted by the
uncertainty: ``LOW = [t - s, t - s + w)`` and ``HIGH = [t + s, t + s + w)``.  All three share the nominal start ``t``
(a point of the MIDDLE grid), which is how an aggregator groups them back together (Query 4.5/5.7).

Solving ``t - s <= x < t - s + w`` for ``t`` shows the LOW slot of ``x`` is the MIDDLE-grid window that contains
``x + s``, and the HIGH slot the one that contains ``x - s``; that is the whole assignment.  Pure integer
arithmetic on microseconds, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

__all__ = [
    "WindowSlot",
    "WindowType",
    "assign_sliding",
    "assign_tumbling",
    "final_release_time_us",
    "release_time_us",
    "sliding_starts",
    "tumbling_start",
    "type_offset_us",
]


class WindowType(StrEnum):
    """The thesis' ``windowType`` attribute on expired events (Sec. 4, Query 4.5)."""

    LOW = "LOW"
    MIDDLE = "MIDDLE"
    HIGH = "HIGH"


WINDOW_TYPES: tuple[WindowType, WindowType, WindowType] = (WindowType.LOW, WindowType.MIDDLE, WindowType.HIGH)


@dataclass(frozen=True, slots=True)
class WindowSlot:
    """One window an event lands in: ``[start_us, end_us)`` = nominal window shifted by the type's offset."""

    window_type: WindowType
    nominal_start_us: int
    start_us: int
    end_us: int


def type_offset_us(window_type: WindowType, shift_us: int) -> int:
    """How far the window of ``window_type`` sits from its nominal (MIDDLE) window: -s, 0 or +s."""
    if window_type is WindowType.LOW:
        return -shift_us
    if window_type is WindowType.HIGH:
        return shift_us
    return 0


def tumbling_start(ts_us: int, width_us: int, origin_us: int = 0) -> int:
    """Start of the tumbling window ``[t, t + width)`` (grid anchored at ``origin_us``) that contains ``ts_us``."""
    # Python's floor division rounds towards -inf, so timestamps before the origin land in the right window too.
    return origin_us + ((ts_us - origin_us) // width_us) * width_us


def sliding_starts(ts_us: int, width_us: int, slide_us: int, origin_us: int = 0) -> list[int]:
    """Starts ``t = origin + k * slide`` (ascending) of every sliding window ``[t, t + width)`` holding ``ts_us``."""
    last = origin_us + ((ts_us - origin_us) // slide_us) * slide_us  # the latest start <= ts
    # t > ts - width  <=>  t >= ts - width + 1; the first grid point at or above that bound.
    low_bound = ts_us - width_us + 1
    first = origin_us - ((origin_us - low_bound) // slide_us) * slide_us
    return list(range(first, last + 1, slide_us))


def _check(width_us: int, shift_us: int) -> None:
    if width_us <= 0:
        raise ValueError(f"window width must be positive, got {width_us}")
    if shift_us < 0:
        raise ValueError(f"shift must be >= 0, got {shift_us}")


def _slot(window_type: WindowType, nominal_start_us: int, width_us: int, shift_us: int) -> WindowSlot:
    start = nominal_start_us + type_offset_us(window_type, shift_us)
    return WindowSlot(window_type, nominal_start_us, start, start + width_us)


def assign_tumbling(
    ts_us: int, width_us: int, shift_us: int, origin_us: int = 0
) -> tuple[WindowSlot, WindowSlot, WindowSlot]:
    """The LOW, MIDDLE and HIGH slot (in that order) of an event at reference time ``ts_us``."""
    _check(width_us, shift_us)
    return (
        _slot(WindowType.LOW, tumbling_start(ts_us + shift_us, width_us, origin_us), width_us, shift_us),
        _slot(WindowType.MIDDLE, tumbling_start(ts_us, width_us, origin_us), width_us, shift_us),
        _slot(WindowType.HIGH, tumbling_start(ts_us - shift_us, width_us, origin_us), width_us, shift_us),
    )


def assign_sliding(ts_us: int, width_us: int, slide_us: int, shift_us: int, origin_us: int = 0) -> list[WindowSlot]:
    """Every LOW, MIDDLE and HIGH slot of ``ts_us`` with sliding windows (the thesis' future work).

    Ordered by type (LOW, MIDDLE, HIGH), then by nominal start.  ``slide == width`` gives the tumbling slots.
    """
    _check(width_us, shift_us)
    if slide_us <= 0:
        raise ValueError(f"slide must be positive, got {slide_us}")
    slots: list[WindowSlot] = []
    for window_type, probe in (
        (WindowType.LOW, ts_us + shift_us),
        (WindowType.MIDDLE, ts_us),
        (WindowType.HIGH, ts_us - shift_us),
    ):
        slots.extend(
            _slot(window_type, t, width_us, shift_us) for t in sliding_starts(probe, width_us, slide_us, origin_us)
        )
    return slots


def release_time_us(window_type: WindowType, nominal_start_us: int, width_us: int, shift_us: int) -> int:
    """Watermark at which the slot is complete: its end, ``t + offset + w`` (the window is half-open)."""
    return nominal_start_us + type_offset_us(window_type, shift_us) + width_us


def final_release_time_us(nominal_start_us: int, width_us: int, shift_us: int) -> int:
    """Watermark at which all three windows of ``t`` are complete: ``t + s + w`` (the HIGH window closes last)."""
    return nominal_start_us + shift_us + width_us
