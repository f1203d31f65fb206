"""Constraint-aware execution (Li 2010, Algorithm 5): one constraint checker state per trace of the stream.

A *trace* is the events of one partition of the query (its partition attribute's value; the whole stream when
the query is not partitioned), in timestamp order.  :class:`TraceMonitor` decides, the engine acts: the monitor
says which traces to release and whether to process an event; it never touches the engine's stacks.

The checker must see each trace in timestamp order, and the engine accepts events out of order.  So an event is
checked once it is *final*: its timestamp is at or below the engine's low watermark L (no later event can have a
smaller one).  Events above L wait in a heap (``pending``) and are checked, in timestamp order over all traces,
when L passes them.  Fed in order with K = 0, L is the event's own timestamp: each event is checked on arrival,
before the engine processes it, exactly as Algorithm 5 says.  An event that arrives behind what its trace's
checker has already consumed (late, below L) ends checking for that trace (``constraint_unordered``): the trace is
processed plainly from then on, never terminated on a verdict the late event could have changed.

A trace's record (checker state, or the fact that it was terminated, alerted or stopped) is forgotten once its
newest event is W past L - A (the bound at which the engine purges its events): no event that can still arrive
shares a window with it, so a later event of the same key starts a new trace.  The monitor's memory is therefore
bounded like the engine's (docs/constraints.md).
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal

from cep.constraints import ConstraintChecker, ConstraintError, TraceState, Verdict

from .events import SaseError, SaseEvent, SaseOutput, VerdictOutput
from .query import Query

__all__ = ["SATISFIABLE_REASON", "UNSATISFIABLE_REASON", "MonitorCounters", "TraceMonitor", "trace_attribute"]

SATISFIABLE_REASON = "satisfiable"
UNSATISFIABLE_REASON = "unsatisfiable"

_log = logging.getLogger(__name__)

# Trace status: still checked; decided satisfiable (alerted or not); terminated (unsatisfiable); no longer checked
# (a constraint violation or an out-of-order event).
CHECKING, SATISFIED, TERMINATED, UNCHECKED = 0, 1, 2, 3


@dataclass(slots=True)
class MonitorCounters:
    early_alerts: int = 0
    monitors_terminated: int = 0
    constraint_violations: int = 0
    """Events that were not a legal move of the constraint automaton: their trace is no longer checked."""
    constraint_unordered: int = 0
    """Traces no longer checked because an event arrived behind what their checker had consumed."""
    constraint_ignored: int = 0
    """Events of terminated traces (or of every trace after a static unsatisfiable verdict): not processed."""
    constraint_untraced: int = 0
    """Events without the trace attribute (of a type outside the query): the checker cannot place them."""
    constraint_checked: int = 0
    """Events the checker consumed."""
    constraint_released: int = 0
    """Instances, negation events and held matches freed when their trace was terminated."""
    traces: int = 0
    """Gauge: trace records kept (checking, decided or terminated, until forgotten)."""
    pending: int = 0
    """Gauge: events waiting for the low watermark before the checker sees them."""


class _Trace:
    __slots__ = ("checked_ts", "last_ts", "n", "state", "status")

    def __init__(self, state: TraceState | None, status: int, ts: int) -> None:
        self.state = state
        self.status = status
        self.n = 0
        """Events the checker consumed (the position of a verdict)."""
        self.last_ts = ts
        """Largest timestamp of the trace seen: it is forgotten W after this passes L - A."""
        self.checked_ts: int | None = None
        """Timestamp of the last event the checker consumed."""


def trace_attribute(query: Query) -> str | None:
    """The attribute that names an event's trace: the query's partition attribute, which must be the same name
    for every type, since events of types outside the query (named only by the constraint) belong to traces too."""
    names = set(query.partition_attributes.values())
    if len(names) > 1:
        raise SaseError(
            "constraint checking needs one partition attribute name for every event type (it is the trace key, "
            f"also for types only the constraint names); the query partitions by {sorted(names)}")
    return next(iter(names), None)


class TraceMonitor:
    """Checker states per trace, pending events, verdict outputs (Algorithm 5's conditions)."""

    def __init__(self, query: Query, constraint: str, algorithm: Literal["basic", "lightweight"], early_alerts: bool,
                 retention_us: int) -> None:
        # Without early alerts the query's window counts: the checker leaves edge negations out of L(Q) (a
        # superset of the windowed matches, so UNSATISFIABLE stays sound) and never reports SATISFIABLE.
        try:
            self.checker = ConstraintChecker(constraint, query, algorithm=algorithm, windowed=not early_alerts)
        except ConstraintError as exc:
            raise SaseError(f"constraint: {exc}") from exc
        self.attr = trace_attribute(query)
        if early_alerts and not self.checker.pattern.exact:
            raise SaseError("early alerts need a query without cross predicates other than the partition "
                            "equalities: the checker does not see them, so a satisfiable verdict would not promise "
                            f"a match ({'; '.join(self.checker.pattern.notes)})")
        self.early_alerts = early_alerts
        self.types = self.checker.event_types
        """Types of the workflow: the constraint's and the query's.  Other types are no part of any trace (the
        constraint describes the stream projected on its types; the query ignores them too)."""
        static = self.checker.static_verdict
        self.static_unsat = static == Verdict.UNSATISFIABLE
        self.static_sat = static == Verdict.SATISFIABLE
        self.never_unsat = not self.static_unsat and bool(self.checker.der_equivalent[0])
        """Every word of the constraint matches (L(C) ⊆ L(Q) from the start): no allowed trace can become
        unsatisfiable, also when the checker reports no SATISFIABLE because of the window."""
        self.static_reported = False
        self.retention_us = retention_us
        """W + A: a trace is forgotten once its newest event is this far below L."""
        self.counters = MonitorCounters()
        self.traces: dict[Hashable, _Trace] = {}
        self.pending: list[tuple[int, int, Hashable, SaseEvent]] = []
        self.forget: list[tuple[int, int, Hashable]] = []
        self.seq = 0

    @property
    def needed(self) -> bool:
        """False when no verdict can ever be output: without early alerts, a query that every allowed trace
        matches (none can become unsatisfiable)."""
        return not (self.never_unsat and not self.early_alerts)

    # ---------------------------------------------------------------- events

    def trace_key(self, event: SaseEvent) -> tuple[bool, Hashable]:
        """(has a trace, its key)."""
        if self.attr is None:
            return True, None
        value = event.attrs.get(self.attr, _MISSING)
        if value is _MISSING:
            return False, None
        try:
            hash(value)
        except TypeError:
            return False, None
        return True, value

    def on_event(self, event: SaseEvent, key: Hashable, low: int | None,
                 now: int) -> tuple[list[SaseOutput], list[Hashable], bool]:
        """An event of trace ``key`` arrives; ``low`` / ``now`` are L and CLOCK after it.  Returns the verdict
        outputs, the traces to release, and whether the engine processes the event."""
        c = self.counters
        if self.static_unsat:
            c.constraint_ignored += 1
            if self.static_reported:
                return [], [], False
            self.static_reported = True
            c.monitors_terminated += 1
            return [VerdictOutput("monitor_terminated", (event,), now, reason=UNSATISFIABLE_REASON)], [], False
        outs: list[SaseOutput] = []
        ts = event.ts
        tr = self.traces.get(key)
        if tr is None:
            tr = self._new_trace(key, ts)
            if self.static_sat:
                c.early_alerts += 1
                outs.append(VerdictOutput("early_alert", (event,), now, reason=SATISFIABLE_REASON, trace=key))
        elif ts > tr.last_ts:
            tr.last_ts = ts
        if tr.status == TERMINATED:
            c.constraint_ignored += 1
            return outs, [], False
        release: list[Hashable] = []
        pending = self.pending
        if tr.status == CHECKING:
            if tr.checked_ts is not None and ts < tr.checked_ts:
                tr.status, tr.state = UNCHECKED, None
                c.constraint_unordered += 1
            elif low is not None and ts <= low and (not pending or pending[0][0] > low):
                # Final at once and before everything that waits (in order with K = 0): no detour via the heap.
                self._step(tr, key, event, now, outs, release)
            else:
                self.seq += 1
                heapq.heappush(pending, (ts, self.seq, key, event))
                c.pending += 1
        if low is not None and ((pending and pending[0][0] <= low)
                                or (self.forget and self.forget[0][0] < low - self.retention_us)):
            self.drain(low, now, outs, release)
        if tr.status == TERMINATED:
            c.constraint_ignored += 1
            return outs, release, False
        return outs, release, True

    def _new_trace(self, key: Hashable, ts: int) -> _Trace:
        status = SATISFIED if self.static_sat else CHECKING
        tr = _Trace(self.checker.new_trace() if status == CHECKING else None, status, ts)
        self.traces[key] = tr
        self.counters.traces += 1
        self.seq += 1
        heapq.heappush(self.forget, (ts, self.seq, key))
        return tr

    def drain(self, low: int, now: int, outs: list[SaseOutput], release: list[Hashable]) -> None:
        """Feed the checker every pending event at or below L in timestamp order (arrival order among ties);
        forget the traces no event can reach any more."""
        pending, traces, c = self.pending, self.traces, self.counters
        while pending and pending[0][0] <= low:
            _, _, key, event = heapq.heappop(pending)
            c.pending -= 1
            tr = traces.get(key)
            if tr is not None and tr.status == CHECKING:
                self._step(tr, key, event, now, outs, release)
        forget, bound = self.forget, low - self.retention_us
        while forget and forget[0][0] < bound:
            ts, _, key = heapq.heappop(forget)
            tr = traces.get(key)
            if tr is None:
                continue
            if tr.last_ts > ts:
                self.seq += 1
                heapq.heappush(forget, (tr.last_ts, self.seq, key))
                continue
            del traces[key]
            c.traces -= 1

    def _step(self, tr: _Trace, key: Hashable, event: SaseEvent, now: int, outs: list[SaseOutput],
              release: list[Hashable]) -> None:
        """The checker consumes one event of a trace it still checks; a verdict becomes an output."""
        assert tr.state is not None
        c = self.counters
        tr.n += 1
        tr.checked_ts = event.ts
        c.constraint_checked += 1
        verdict = self.checker.step(tr.state, event.event_type, event.attrs)
        if verdict == Verdict.UNDECIDED:
            return
        if verdict == Verdict.SATISFIABLE:
            tr.status, tr.state = SATISFIED, None
            if self.early_alerts:
                c.early_alerts += 1
                outs.append(VerdictOutput("early_alert", (event,), now, reason=SATISFIABLE_REASON, trace=key,
                                          position=tr.n))
        elif verdict == Verdict.UNSATISFIABLE:
            tr.status, tr.state = TERMINATED, None
            c.monitors_terminated += 1
            outs.append(VerdictOutput("monitor_terminated", (event,), now, reason=UNSATISFIABLE_REASON, trace=key,
                                      position=tr.n))
            release.append(key)
        else:
            tr.status, tr.state = UNCHECKED, None
            c.constraint_violations += 1
            _log.debug("constraint violation: trace %r, event %s at %d (position %d); checking stops for the trace, "
                       "it is processed plainly", key, event.event_type, event.ts, tr.n)

    def end(self) -> None:
        """End of stream: every monitor terminates (no output); nothing is kept."""
        self.traces.clear()
        self.pending.clear()
        self.forget.clear()
        self.counters.traces = 0
        self.counters.pending = 0

    def is_idle(self) -> bool:
        """Nothing kept; a statically unsatisfiable monitor that has reported is not idle (a fresh one would report
        again)."""
        return not self.traces and not self.pending and not self.static_reported

    def next_due(self) -> int | None:
        """The lowest L at which a pending event is checked or a trace forgotten."""
        due = []
        if self.pending:
            due.append(self.pending[0][0])
        if self.forget:
            due.append(self.forget[0][0] + self.retention_us + 1)
        return min(due, default=None)

    # ---------------------------------------------------------------- snapshot

    def snapshot(self) -> dict[str, Any]:
        snap = self.checker.snapshot
        return {
            "static_reported": self.static_reported,
            "seq": self.seq,
            "traces": [[key, tr.status, tr.n, tr.last_ts, tr.checked_ts,
                        None if tr.state is None else snap(tr.state)] for key, tr in self.traces.items()],
            "pending": [[ts, s, key, e.event_type, e.ts, dict(e.attrs), e.event_id]
                        for ts, s, key, e in sorted(self.pending, key=lambda p: (p[0], p[1]))],
            "counters": {f.name: getattr(self.counters, f.name) for f in fields(MonitorCounters)},
        }

    def restore(self, doc: Mapping[str, Any], key_of: Any) -> None:
        self.static_reported = bool(doc["static_reported"])
        self.seq = int(doc["seq"])
        for raw_key, status, n, last_ts, checked_ts, state in doc["traces"]:
            key = key_of(raw_key)
            tr = _Trace(None if state is None else self.checker.restore_trace(state), status, last_ts)
            tr.n, tr.checked_ts = n, checked_ts
            self.traces[key] = tr
            self.seq += 1
            self.forget.append((last_ts, self.seq, key))
        heapq.heapify(self.forget)
        self.pending = [(ts, s, key_of(k), SaseEvent(t, ets, attrs, eid))
                        for ts, s, k, t, ets, attrs, eid in doc["pending"]]
        heapq.heapify(self.pending)
        for name, value in doc["counters"].items():
            setattr(self.counters, name, value)


_MISSING: Any = object()
