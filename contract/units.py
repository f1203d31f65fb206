"""The one duration syntax of the project: CLI options, config files, environment variables, pattern text
(WITHIN 2 s) and SASE queries (WITHIN 1 hour).

A duration is a number and a unit, ``"250ms"``, ``"5s"``, ``"2m"``, ``"1.5 min"``, ``"1 hour"``; every result is
integer microseconds. A bare number is read in the unit the option or key names (``--linger-ms 2`` = 2 ms,
``max_future_s = 60`` = 60 s); where the name carries no unit, the unit is required.
"""

from __future__ import annotations

import re
from collections.abc import Callable

__all__ = ["UNIT_US", "DurationError", "duration_parser", "format_duration", "parse_duration_us"]

UNIT_US: dict[str, int] = {
    "us": 1,
    "ms": 1_000,
    "s": 1_000_000, "sec": 1_000_000, "secs": 1_000_000, "second": 1_000_000, "seconds": 1_000_000,
    "m": 60_000_000, "min": 60_000_000, "mins": 60_000_000, "minute": 60_000_000, "minutes": 60_000_000,
    "h": 3_600_000_000, "hour": 3_600_000_000, "hours": 3_600_000_000,
}
_DURATION = re.compile(r"\s*(-?\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*")
# Shortest spelling first: what format_duration writes.
_FORMAT_UNITS = ("h", "min", "s", "ms")


class DurationError(ValueError):
    pass


def parse_duration_us(text: str, *, require_unit: bool = False, allow_negative: bool = False,
                      bare_unit: str = "us") -> int:
    """``text`` in integer microseconds; raises :class:`DurationError` (a ValueError) with the accepted units.

    A number without a unit is in ``bare_unit``, or refused with ``require_unit``."""
    m = _DURATION.fullmatch(text)
    unit = m.group(2).lower() if m else ""
    if m is None or (unit and unit not in UNIT_US) or (require_unit and not unit):
        raise DurationError(f"not a duration: {text!r} (a number and a unit, e.g. 250ms, 5s, 2m; units: "
                            f"{', '.join(UNIT_US)})")
    value = round(float(m.group(1)) * UNIT_US[unit or bare_unit])
    if value < 0 and not allow_negative:
        raise DurationError(f"duration {text!r} must not be negative")
    return value


def duration_parser(bare_unit: str | None, *, allow_negative: bool = False) -> Callable[[str | int], int]:
    """A parser for a CLI option (typer's ``parser=``): a duration in any unit, a bare number in ``bare_unit``
    (None: a unit is required); the result is integer microseconds. An int passes through (a default in µs)."""
    def parse(text: str | int) -> int:
        if isinstance(text, int):
            return text
        return parse_duration_us(text, require_unit=bare_unit is None, allow_negative=allow_negative,
                                 bare_unit=bare_unit or "us")
    return parse


def format_duration(us: int) -> str:
    """The largest whole unit: 2_000_000 -> ``"2 s"``, 1_500 -> ``"1500 us"``; parse_duration_us reads it back."""
    for unit in _FORMAT_UNITS:
        if us % UNIT_US[unit] == 0 and abs(us) >= UNIT_US[unit]:
            return f"{us // UNIT_US[unit]} {unit}"
    return f"{us} us"
