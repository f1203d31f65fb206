"""Input and output records of the SASE sequence engine, and its errors.

Timestamps are integers in the stream's time unit (microseconds in Skewless: ``ref_ts_us``).  The engine never
reads a wall clock: time only moves through event timestamps, :meth:`SequenceEngine.advance_clock` and
punctuations.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from cep.lexer import QuerySyntaxError

__all__ = [
    "OutputKind", "SaseError", "SaseEvent", "SaseInputError", "SaseOutput", "SaseSyntaxError", "VerdictOutput",
    "match_output",
]

OutputKind = Literal["match", "retract", "add", "late_match", "invalidated", "too_late", "early_alert",
                     "monitor_terminated"]
"""What an output record means downstream.

* ``match``: a result sequence.  In conservative mode a ``match`` is valid against every event within the
  allowed lateness of the low watermark; only an event behind the watermark (a late event) can still invalidate it,
  which is then reported as ``invalidated``.
* ``add``: aggressive mode only: a (+) compensation, a match that an out-of-order or late event created after the
  matches of its time span were already emitted.
* ``retract``: aggressive mode only: a (-) compensation, an earlier ``match``/``add`` that an out-of-order or late
  negation event has invalidated (``cause`` is that event).
* ``late_match``: conservative mode only: a match completed by a late event (ts below the low watermark, within
  the allowed lateness), released like a ``match`` once no on-time event can invalidate it.
* ``invalidated``: conservative mode only: an already released ``match``/``late_match`` that a late negation event
  (``cause``) falls into; downstream withdraws it.
* ``too_late``: both modes: ``events`` is the one input event, older than the low watermark minus the allowed
  lateness; it was not processed (``reason`` says why).
* ``early_alert``: with a constraint (docs/constraints.md): a :class:`VerdictOutput`; every continuation of the
  trace that the constraint allows contains a match.  ``events`` is the event at which that became certain.
* ``monitor_terminated``: with a constraint: a :class:`VerdictOutput`; no continuation the constraint allows can
  match, the trace's state was released and the rest of the trace is ignored.
"""


class SaseError(Exception):
    """Base class of the engine's errors."""


class SaseSyntaxError(SaseError, QuerySyntaxError):
    """A query text that does not parse (:class:`cep.lexer.QuerySyntaxError`: ``position``, ``line``, ``column``
    and the caret under the problem)."""


class SaseInputError(SaseError):
    """An input event the engine cannot use (raised only with ``EngineConfig(strict=True)``, else counted)."""

    def __init__(self, reason: str, detail: str) -> None:
        self.reason = reason
        super().__init__(f"{reason}: {detail}")


@dataclass(frozen=True, slots=True)
class SaseEvent:
    """One primitive event: its type, its timestamp, its attributes and an optional identifier."""

    event_type: str
    ts: int
    attrs: Mapping[str, Any] = field(default_factory=dict)
    event_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"event_type": self.event_type, "ts": self.ts, "attrs": dict(self.attrs), "event_id": self.event_id}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SaseEvent:
        return cls(str(data["event_type"]), int(data["ts"]), dict(data.get("attrs") or {}), data.get("event_id"))


@dataclass(frozen=True, slots=True)
class SaseOutput:
    """One output record: a result sequence (positive elements only, in sequence order) or a compensation."""

    kind: OutputKind
    events: tuple[SaseEvent, ...]
    emitted_at: int
    """The engine's CLOCK (largest timestamp seen) when the record was produced."""
    cause: SaseEvent | None = None
    """``invalidated`` / ``retract``: the negation event that invalidated the match."""
    reason: str | None = None
    """``too_late``: why the event was not processed (``beyond_allowed_lateness``)."""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "events": [e.to_dict() for e in self.events],
                               "emitted_at": self.emitted_at}
        if self.cause is not None:
            out["cause"] = self.cause.to_dict()
        if self.reason is not None:
            out["reason"] = self.reason
        return out

    @property
    def key(self) -> tuple[tuple[str, int, str | None], ...]:
        """A hashable identity of the matched sequence (type, ts, event_id per element)."""
        return tuple((e.event_type, e.ts, e.event_id) for e in self.events)


@dataclass(frozen=True, slots=True)
class VerdictOutput(SaseOutput):
    """``early_alert`` / ``monitor_terminated``: the constraint checker's verdict on one trace.

    ``events`` is the one event at which the verdict was reached (the trace's first event for a static verdict),
    ``reason`` is ``satisfiable`` or ``unsatisfiable``."""

    trace: Any = None
    """The trace's key: the query's partition value (None: the query is not partitioned, or a static verdict
    that holds for every trace)."""
    position: int = 0
    """How many events of the trace the checker had consumed with the deciding one, 1-based; 0: static (decided
    before any event of the trace)."""

    def to_dict(self) -> dict[str, Any]:
        out = SaseOutput.to_dict(self)
        out["trace"] = self.trace
        out["position"] = self.position
        return out


_new_object = object.__new__
_set_kind, _set_events, _set_emitted_at, _set_cause, _set_reason = (
    SaseOutput.__dict__[name].__set__ for name in ("kind", "events", "emitted_at", "cause", "reason")
)


def match_output(events: tuple[SaseEvent, ...], emitted_at: int) -> SaseOutput:
    """``SaseOutput("match", events, emitted_at)``, the same object, for the engine's hot path: it fills the slots
    directly instead of through the frozen dataclass's ``__init__`` (one ``object.__setattr__`` per field),
    which costs about half of it."""
    out: SaseOutput = _new_object(SaseOutput)
    _set_kind(out, "match")
    _set_events(out, events)
    _set_emitted_at(out, emitted_at)
    _set_cause(out, None)
    _set_reason(out, None)
    return out
