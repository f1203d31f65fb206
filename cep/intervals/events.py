"""Input items and output records of the interval (ISEQ) engine, and its errors.

Li 2010's model (chapter 5): an interval event is atomic, it arrives once it has ended, with both endpoints
(``start_ts_us <= end_ts_us``; a point event has start = end).  An *interval begin punctuation* (IBP, section
5.4.1) announces an interval's start the moment it begins; the interval itself follows at its end.  IO3's model
(each endpoint a separate arrival, paired by id) maps onto the same two items: ``OS_x`` is an IBP and ``OE_x``
completes the interval (see :mod:`cep.intervals.pairing`).

Timestamps are integer microseconds on the reference clock.  The engine never reads a wall clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from cep.lexer import QuerySyntaxError

__all__ = [
    "Interval",
    "IntervalBegin",
    "IntervalError",
    "IntervalOutput",
    "IntervalSyntaxError",
    "OutputKind",
]

OutputKind = Literal["match", "add", "retract", "too_late"]
"""What an output record means downstream.

* ``match``: a result.  Conservative mode: permanently valid (no arrival allowed by K can invalidate it).
  Aggressive mode: emitted at once when an in-order arrival completes it (IO3 real-time factor 1).
* ``add``: aggressive mode: a (+) compensation: a result created by an out-of-order arrival, or a retracted
  result that is valid again (the negating interval turned out not to hit the gap once its end arrived).
* ``retract``: aggressive mode: a (-) compensation of an earlier ``match``/``add`` that a negation item invalidated.
* ``too_late``: an item that broke the K contract (its time is below CLOCK - K); it was not processed.
"""


class IntervalError(Exception):
    """Base class of the interval engine's errors (bad query, bad configuration, bad input)."""


class IntervalSyntaxError(IntervalError, QuerySyntaxError):
    """A query text that does not parse (:class:`cep.lexer.QuerySyntaxError`: ``position``, ``line``, ``column``
    and the caret under the problem)."""


@dataclass(frozen=True, slots=True)
class Interval:
    """One interval event (Li's ``e_{ts|te}``).  ``event_id`` pairs it with its IBP; unique in the stream."""

    event_type: str
    start_ts_us: int
    end_ts_us: int
    attrs: Mapping[str, Any] = field(default_factory=dict)
    event_id: str | None = None

    def __post_init__(self) -> None:
        if self.end_ts_us < self.start_ts_us:
            raise IntervalError(f"interval ends before it starts: {self.start_ts_us} > {self.end_ts_us}")

    @property
    def length_us(self) -> int:
        return self.end_ts_us - self.start_ts_us

    def to_dict(self) -> dict[str, Any]:
        return {"event_type": self.event_type, "start_ts_us": self.start_ts_us, "end_ts_us": self.end_ts_us,
                "attrs": dict(self.attrs), "event_id": self.event_id}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Interval:
        return cls(str(data["event_type"]), int(data["start_ts_us"]), int(data["end_ts_us"]),
                   dict(data.get("attrs") or {}), data.get("event_id"))

    def __str__(self) -> str:
        return f"{self.event_type.lower()}{self.start_ts_us}|{self.end_ts_us}"


@dataclass(frozen=True, slots=True)
class IntervalBegin:
    """An interval begin punctuation ``ibp_e = <e.id, e.ts>``: interval ``event_id`` started at ``start_ts_us``."""

    event_type: str
    start_ts_us: int
    event_id: str
    attrs: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"event_type": self.event_type, "start_ts_us": self.start_ts_us, "event_id": self.event_id,
                "attrs": dict(self.attrs)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> IntervalBegin:
        return cls(str(data["event_type"]), int(data["start_ts_us"]), str(data["event_id"]),
                   dict(data.get("attrs") or {}))


Item = Interval | IntervalBegin


def item_time_us(item: Item) -> int:
    """The time an item is due in the merged stream: an IBP at its start, an interval at its end (Li 5.4.1)."""
    return item.start_ts_us if isinstance(item, IntervalBegin) else item.end_ts_us


@dataclass(frozen=True, slots=True)
class IntervalOutput:
    """One output record: a result (the positive members in the query's element order) or a compensation."""

    kind: OutputKind
    members: tuple[Interval, ...]
    emitted_at_us: int
    """The engine's CLOCK when the record was produced."""
    emitted_at_seq: int
    """The arrival number (0-based) of the item whose processing produced the record (for latency metrics)."""
    last_member_seq: int = -1
    """The arrival number of the result's last-arrived member (-1 for ``too_late``)."""
    cause: Item | None = None
    """``retract``/``add`` after a negation change: the negation item; ``too_late``: the rejected item."""

    @property
    def key(self) -> tuple[tuple[str, int, int, str | None], ...]:
        """A hashable identity of the result: (type, start, end, id) per member, in element order."""
        return tuple((m.event_type, m.start_ts_us, m.end_ts_us, m.event_id) for m in self.members)

    @property
    def sign(self) -> int:
        """+1 for a result or (+) compensation, -1 for a (-) compensation, 0 for ``too_late``."""
        return {"match": 1, "add": 1, "retract": -1, "too_late": 0}[self.kind]


def result_key(members: tuple[Interval, ...]) -> tuple[tuple[str, int, int, str | None], ...]:
    """The same identity as :attr:`IntervalOutput.key`, for a tuple of members (reference evaluator, tests)."""
    return tuple((m.event_type, m.start_ts_us, m.end_ts_us, m.event_id) for m in members)
