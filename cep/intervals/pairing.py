"""IO3's endpoint model: each interval arrives as two endpoint items, ``OS_x`` (start) and ``OE_x`` (end), paired
by event id, possibly in either order under disorder.  :class:`EndpointPairer` turns them into the engine's items:
a start seen first becomes an :class:`IntervalBegin` (the interval is open); the interval is complete, and becomes
an :class:`Interval`, only once both endpoints have arrived.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .events import Interval, IntervalBegin, IntervalError, Item

__all__ = ["EndpointPairer"]


@dataclass(slots=True)
class _Half:
    event_type: str
    ts_us: int
    attrs: Mapping[str, Any] = field(default_factory=dict)


class EndpointPairer:
    """Pairs start and end endpoints by id.  State: the endpoints whose partner has not arrived yet."""

    def __init__(self) -> None:
        self._starts: dict[str, _Half] = {}
        self._ends: dict[str, _Half] = {}

    def start(self, event_type: str, event_id: str, start_ts_us: int,
              attrs: Mapping[str, Any] | None = None) -> list[Item]:
        """``OS_x(t)``: an IBP, or the complete interval when its end came first."""
        attrs = dict(attrs or {})
        end = self._ends.pop(event_id, None)
        if end is not None:
            return [self._complete(event_type, event_id, start_ts_us, end.ts_us, {**attrs, **end.attrs})]
        if event_id in self._starts:
            raise IntervalError(f"second start for interval {event_id!r}")
        self._starts[event_id] = _Half(event_type, start_ts_us, attrs)
        return [IntervalBegin(event_type, start_ts_us, event_id, attrs)]

    def end(self, event_type: str, event_id: str, end_ts_us: int,
            attrs: Mapping[str, Any] | None = None) -> list[Item]:
        """``OE_x(t)``: the complete interval, or nothing while its start has not arrived."""
        attrs = dict(attrs or {})
        start = self._starts.pop(event_id, None)
        if start is None:
            if event_id in self._ends:
                raise IntervalError(f"second end for interval {event_id!r}")
            self._ends[event_id] = _Half(event_type, end_ts_us, attrs)
            return []
        return [self._complete(event_type, event_id, start.ts_us, end_ts_us, {**start.attrs, **attrs})]

    def discard(self, event_id: str) -> bool:
        """Forget the endpoint of ``event_id`` still waiting for its partner (the caller decided the pair can no
        longer be used, e.g. an end whose start could only come too late); True if there was one."""
        start = self._starts.pop(event_id, None)
        end = self._ends.pop(event_id, None)
        return start is not None or end is not None

    @staticmethod
    def _complete(event_type: str, event_id: str, ts: int, te: int, attrs: Mapping[str, Any]) -> Interval:
        return Interval(event_type, ts, te, attrs, event_id)

    @property
    def open_count(self) -> int:
        return len(self._starts) + len(self._ends)

    def export_state(self) -> dict[str, Any]:
        def dump(d: dict[str, _Half]) -> list[list[Any]]:
            return [[k, h.event_type, h.ts_us, dict(h.attrs)] for k, h in d.items()]
        return {"starts": dump(self._starts), "ends": dump(self._ends)}

    def import_state(self, state: Mapping[str, Any]) -> None:
        self._starts = {str(k): _Half(str(t), int(ts), dict(a)) for k, t, ts, a in state["starts"]}
        self._ends = {str(k): _Half(str(t), int(ts), dict(a)) for k, t, ts, a in state["ends"]}
