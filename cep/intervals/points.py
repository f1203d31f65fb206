"""From point readings to intervals (Li 2010 5.4.2, "pushing down interval abstraction").

A source that samples a value (a temperature every 2 s) need not send intervals itself: this operator keeps the
current *level* (e.g. LOW / MEDIUM / HIGH by thresholds) and emits

* an :class:`IntervalBegin` (IBP) at the first reading of a level (the interval of that level has begun), and
* the :class:`Interval` of the previous level when the level changes, ending at the first reading of the new level.

Consecutive intervals therefore *meet* (Li's Example 5.4.1: MEDIUM(:00, :08), HIGH(:08, :12), MEDIUM(:12, :16), with
LOW still open at :16).  The end is the first reading of the next level, not the last reading of this one: the
level is only known to have changed when a reading shows it (sampling cannot say when in between it happened).
Readings must come in time order (put the per-source reorder stage in front).
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .events import Interval, IntervalBegin, IntervalError, Item

__all__ = ["PointToIntervalOperator", "ThresholdLevels"]


@dataclass(frozen=True, slots=True)
class ThresholdLevels:
    """``names[i]`` for ``bounds[i-1] < value <= bounds[i]`` (``names[0]`` up to bounds[0], the last above all).

    The default is Li's example: LOW <= 50 < MEDIUM <= 100 < HIGH.
    """

    bounds: Sequence[float] = (50, 100)
    names: Sequence[str] = ("LOW", "MEDIUM", "HIGH")

    def __post_init__(self) -> None:
        if len(self.names) != len(self.bounds) + 1:
            raise IntervalError("ThresholdLevels needs one more name than bounds")
        if list(self.bounds) != sorted(set(self.bounds)):
            raise IntervalError("ThresholdLevels bounds must be strictly increasing")

    def level(self, value: float) -> str:
        return self.names[bisect.bisect_left(list(self.bounds), value)]


class PointToIntervalOperator:
    """Turns one source's readings into level intervals.  Pure: the caller feeds readings and reads items."""

    def __init__(self, source: str, levels: ThresholdLevels | None = None) -> None:
        self.source = source
        self.levels = levels or ThresholdLevels()
        self._level: str | None = None
        self._since_us: int | None = None
        self._last_us: int | None = None
        self._count = 0

    def _id(self) -> str:
        return f"{self.source}:{self._count}"

    def on_reading(self, ts_us: int, value: float) -> list[Item]:
        """One reading; returns the items it completes (an interval) and begins (an IBP)."""
        if self._last_us is not None and ts_us < self._last_us:
            raise IntervalError(f"reading at {ts_us} is older than the previous one at {self._last_us}")
        self._last_us = ts_us
        level = self.levels.level(value)
        if level == self._level:
            return []
        out: list[Item] = []
        attrs: Mapping[str, Any] = {"source": self.source}
        if self._level is not None and self._since_us is not None:
            out.append(Interval(self._level, self._since_us, ts_us, attrs, self._id()))
            self._count += 1
        self._level, self._since_us = level, ts_us
        out.append(IntervalBegin(level, ts_us, self._id(), attrs))
        return out

    def close(self, ts_us: int) -> list[Item]:
        """End of the source (or of its observation): the open level interval ends at ``ts_us``."""
        if self._level is None or self._since_us is None:
            return []
        out: list[Item] = [Interval(self._level, self._since_us, max(ts_us, self._since_us),
                                    {"source": self.source}, self._id())]
        self._count += 1
        self._level = self._since_us = None
        return out

    @property
    def open_level(self) -> tuple[str, int] | None:
        """The level whose interval is still open and since when."""
        return None if self._level is None or self._since_us is None else (self._level, self._since_us)

    def export_state(self) -> dict[str, Any]:
        return {"level": self._level, "since_us": self._since_us, "last_us": self._last_us, "count": self._count}

    def import_state(self, state: Mapping[str, Any]) -> None:
        self._level = state["level"]
        self._since_us = state["since_us"]
        self._last_us = state["last_us"]
        self._count = int(state["count"])
