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

A terminated trace still follows the constraint automaton τ_C alone (one int, one lookup per event): its events
are not processed, but an event that breaks the constraint is a counted violation and the trace is processed
plainly from then on (``constraint_resumed``).  A statically unsatisfiable query terminates every trace at its
start the same way.

A trace's record is forgotten once its newest event is W past L - A (the bound at which the engine purges its
events), so the monitor's memory is bounded like the engine's.  The key is not forgotten: it goes into a
fixed-size Bloom filter, and a key the filter knows is processed plainly (``traces_resumed_unchecked``).  The
constraint describes a trace's whole life, so checking a reappearing key from the automaton's start would be
wrong (a trace ``A X B`` seen again from ``X B`` can look unsatisfiable); the filter has no false negatives, and a
false positive only costs a new key its checking, never a match (docs/constraints.md).
"""

from __future__ import annotations

import hashlib
import heapq
import logging
import zlib
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal

from cep.constraints import ConstraintChecker, ConstraintError, TraceState, Verdict

from .events import SaseError, SaseEvent, SaseOutput, VerdictOutput
from .query import Query

__all__ = ["FORGOTTEN_FILTER_BITS", "SATISFIABLE_REASON", "UNSATISFIABLE_REASON", "MonitorCounters", "TraceMonitor",
           "trace_attribute"]

SATISFIABLE_REASON = "satisfiable"
UNSATISFIABLE_REASON = "unsatisfiable"

_log = logging.getLogger(__name__)

FORGOTTEN_FILTER_BITS = 1 << 20
"""Size of the filter of forgotten keys (128 KiB): with 4 hashes, about 1 % of new keys are mistaken for forgotten
ones (and processed unchecked) after 100 000 forgotten keys, 8 % after 200 000."""
_FILTER_HASHES = 4

# Trace status: still checked; decided satisfiable (alerted or not); terminated (unsatisfiable); no longer checked
# (a constraint violation or an out-of-order event).
CHECKING, SATISFIED, TERMINATED, UNCHECKED = 0, 1, 2, 3

# What the engine does with an arriving event (TraceMonitor.on_event).
ADMIT = 0
"""Process it (a trace not terminated, or an event of a terminated trace the checker has not reached yet: a
violation before it would make it part of the plain trace)."""
IGNORE = 1
"""Not processed: an event of a terminated trace the checker followed without a violation (or an unfollowed one)."""
NEGATION_ONLY = 2
"""As IGNORE, but a negation event of an element whose range reaches before the match (leading negation) is still
buffered: a match after a later violation must see it, as the plain engine does."""

# What the engine does with a trace's state after the checker moved (TraceMonitor actions, in order):
RELEASE = "release"
"""(RELEASE, key, 0): drop everything of the trace (terminated and no longer followed)."""
CUT = "cut"
"""(CUT, key, ts): the trace is terminated and followed through ``ts`` without a violation: its state at or
before ``ts`` can be in no match the plain engine has from a later violation on; drop it.  Matches built from
its later events wait (suspended) until the checker reaches them."""
RESUME = "resume"
"""(RESUME, key, ts): a terminated trace broke the workflow at ``ts``: from there on it is plain; its suspended
matches that start at or after ``ts`` go on as the plain engine's, the rest and the state before ``ts`` go."""
Action = tuple[str, Hashable, int]


@dataclass(slots=True)
class MonitorCounters:
    early_alerts: int = 0
    monitors_terminated: int = 0
    constraint_violations: int = 0
    """Events that were not a legal move of the constraint automaton: their trace is no longer checked (also when
    it was terminated: see ``constraint_resumed``)."""
    constraint_resumed: int = 0
    """Terminated traces (also by a static unsatisfiable verdict) that broke the constraint afterwards: processed
    plainly again from the violation on.  A match that needed an event ignored or released before is lost."""
    constraint_unordered: int = 0
    """Traces no longer checked because an event arrived behind what their checker had consumed."""
    constraint_ignored: int = 0
    """Events of terminated traces (every trace after a static unsatisfiable verdict): not processed."""
    constraint_untraced: int = 0
    """Events without the trace attribute (of a type outside the query): the checker cannot place them."""
    constraint_checked: int = 0
    """Events the checker consumed."""
    constraint_released: int = 0
    """Instances, negation events and held matches freed when their trace was terminated."""
    traces: int = 0
    """Gauge: trace records kept (checking, decided or terminated, until forgotten)."""
    traces_forgotten: int = 0
    """Trace records forgotten (their key goes into the filter of forgotten keys)."""
    traces_resumed_unchecked: int = 0
    """New trace records the filter knew (a forgotten key again, or a false positive): processed plainly."""
    pending: int = 0
    """Gauge: events waiting for the low watermark before the checker sees them."""


class _Trace:
    __slots__ = ("checked_ts", "cstate", "first", "last_ts", "n", "state", "status")

    def __init__(self, state: TraceState | None, status: int, ts: int, cstate: int = -1) -> None:
        self.state = state
        self.status = status
        self.cstate = cstate
        """A terminated trace's τ_C state (-1: not followed, after an out-of-order event)."""
        self.n = 0
        """Events the checker consumed (the position of a verdict)."""
        self.last_ts = ts
        """Largest timestamp of the trace seen: it is forgotten W after this passes L - A."""
        self.checked_ts: int | None = None
        """Timestamp of the last event the checker consumed."""
        self.first: SaseEvent | None = None
        """A statically satisfiable trace's earliest event so far, while its early alert waits for L to pass it."""


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
        self.static_first: SaseEvent | None = None
        """The stream's earliest event so far, while the static unsatisfiable record waits for L to pass it."""
        self.alerts_due: list[tuple[int, int, Hashable]] = []
        """(ts of the trace's first event, seq, key): static early alerts, output once L passes the first event."""
        self.retention_us = retention_us
        """W + A: a trace is forgotten once its newest event is this far below L."""
        self.counters = MonitorCounters()
        self.forgotten = _KeyFilter(FORGOTTEN_FILTER_BITS)
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
                 now: int) -> tuple[list[SaseOutput], list[Action], int]:
        """An event of trace ``key`` arrives; ``low`` / ``now`` are L and CLOCK after it.  Returns the verdict
        outputs, the actions on traces' state (in order), and what the engine does with the event (ADMIT, IGNORE,
        NEGATION_ONLY)."""
        c = self.counters
        outs: list[SaseOutput] = []
        ts = event.ts
        if self.static_unsat and not self.static_reported and (
                self.static_first is None or ts < self.static_first.ts):
            # The record names the stream's first event by timestamp: it waits until L passes it.
            self.static_first = event
        tr = self.traces.get(key)
        if tr is None:
            tr = self._new_trace(key, ts)
            if self.static_sat and tr.status == SATISFIED:
                tr.first = event
                self.seq += 1
                heapq.heappush(self.alerts_due, (ts, self.seq, key))
        else:
            tr.last_ts = max(tr.last_ts, ts)
            if tr.first is not None and ts < tr.first.ts:
                tr.first = event
                self.seq += 1
                heapq.heappush(self.alerts_due, (ts, self.seq, key))
        actions: list[Action] = []
        pending = self.pending
        if tr.status == CHECKING or tr.cstate >= 0:
            if tr.checked_ts is not None and ts < tr.checked_ts:
                # A terminated trace stays terminated, unfollowed (all its state goes); an undecided one is
                # processed plainly.
                if tr.status == CHECKING:
                    tr.status = UNCHECKED
                else:
                    actions.append((RELEASE, key, 0))
                tr.state, tr.cstate = None, -1
                c.constraint_unordered += 1
            elif low is not None and ts <= low and (not pending or pending[0][0] > low):
                # Final at once and before everything that waits (in order with K = 0): no detour via the heap.
                self._step(tr, key, event, now, outs, actions)
            else:
                self.seq += 1
                heapq.heappush(pending, (ts, self.seq, key, event))
                c.pending += 1
        if low is not None:
            self.drain(low, now, outs, actions)
        if tr.status == TERMINATED:
            if tr.cstate >= 0 and (low is None or ts > low):
                return outs, actions, ADMIT  # not reached by the checker yet: a violation may come first
            c.constraint_ignored += 1
            return outs, actions, NEGATION_ONLY if tr.cstate >= 0 else IGNORE
        return outs, actions, ADMIT

    def terminated(self, key: Hashable) -> bool:
        """Whether trace ``key`` is terminated (its matches wait for the checker: suspended)."""
        tr = self.traces.get(key)
        return tr is not None and tr.status == TERMINATED

    def _new_trace(self, key: Hashable, ts: int) -> _Trace:
        if key in self.forgotten:
            tr = _Trace(None, UNCHECKED, ts)
            self.counters.traces_resumed_unchecked += 1
        elif self.static_unsat:
            tr = _Trace(None, TERMINATED, ts, 0)
        elif self.static_sat:
            tr = _Trace(None, SATISFIED, ts)
        else:
            tr = _Trace(self.checker.new_trace(), CHECKING, ts)
        self.traces[key] = tr
        self.counters.traces += 1
        self.seq += 1
        heapq.heappush(self.forget, (ts, self.seq, key))
        return tr

    def drain(self, low: int, now: int, outs: list[SaseOutput], actions: list[Action]) -> None:
        """Feed the checker every pending event at or below L in timestamp order (arrival order among ties);
        output the static verdicts whose first event L passed; forget the traces no event can reach any more."""
        pending, traces, c = self.pending, self.traces, self.counters
        first = self.static_first
        if first is not None and first.ts <= low:
            self.static_first = None
            self.static_reported = True
            c.monitors_terminated += 1
            outs.append(VerdictOutput("monitor_terminated", (first,), now, reason=UNSATISFIABLE_REASON))
        due = self.alerts_due
        while due and due[0][0] <= low:
            ts, _, key = heapq.heappop(due)
            tr = traces.get(key)
            if tr is None or tr.first is None or tr.first.ts != ts:
                continue  # a stale entry: an earlier event of the trace came after it was pushed
            c.early_alerts += 1
            outs.append(VerdictOutput("early_alert", (tr.first,), now, reason=SATISFIABLE_REASON, trace=key))
            tr.first = None
        if (not pending or pending[0][0] > low) and (not self.forget or self.forget[0][0] >= low - self.retention_us):
            return
        while pending and pending[0][0] <= low:
            _, _, key, event = heapq.heappop(pending)
            c.pending -= 1
            tr = traces.get(key)
            if tr is not None and (tr.status == CHECKING or tr.cstate >= 0):
                self._step(tr, key, event, now, outs, actions)
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
            self.forgotten.add(key)
            c.traces -= 1
            c.traces_forgotten += 1

    def _step(self, tr: _Trace, key: Hashable, event: SaseEvent, now: int, outs: list[SaseOutput],
              actions: list[Action]) -> None:
        """The checker consumes one event of a trace it still checks (or τ_C alone follows a terminated one); a
        verdict becomes an output."""
        tr.n += 1
        tr.checked_ts = event.ts
        if tr.status == TERMINATED:
            self._follow(tr, key, event, actions)
            return
        state = tr.state
        assert state is not None
        c = self.counters
        c.constraint_checked += 1
        p, q = state.p, state.q
        verdict = self.checker.step(state, event.event_type, event.attrs)
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
            checker = self.checker
            qc = checker.map_c[p] if checker.algorithm == "lightweight" else q
            tr.cstate = checker.tau_c.delta[qc].get(self._symbol(event), -1)
            c.monitors_terminated += 1
            outs.append(VerdictOutput("monitor_terminated", (event,), now, reason=UNSATISFIABLE_REASON, trace=key,
                                      position=tr.n))
            # Early buffer release of everything up to the verdict; what the engine holds of later events waits
            # for the checker (a violation may make it part of the plain trace).
            actions.append((CUT, key, event.ts) if tr.cstate >= 0 else (RELEASE, key, 0))
        else:
            tr.status, tr.state = UNCHECKED, None
            c.constraint_violations += 1
            _log.debug("constraint violation: trace %r, event %s at %d (position %d); checking stops for the trace, "
                       "it is processed plainly", key, event.event_type, event.ts, tr.n)

    def _symbol(self, event: SaseEvent) -> int:
        sym = self.checker.alphabet.plain_symbols.get(event.event_type)
        return self.checker.classify(event.event_type, event.attrs) if sym is None else sym

    def _follow(self, tr: _Trace, key: Hashable, event: SaseEvent, actions: list[Action]) -> None:
        """τ_C alone follows a terminated trace; a violation makes it plain again from the violating event on."""
        nxt = self.checker.tau_c.delta[tr.cstate].get(self._symbol(event))
        if nxt is not None:
            tr.cstate = nxt
            actions.append((CUT, key, event.ts))
            return
        tr.status, tr.cstate = UNCHECKED, -1
        actions.append((RESUME, key, event.ts))
        c = self.counters
        c.constraint_violations += 1
        c.constraint_resumed += 1
        _log.debug("constraint violation after termination: trace %r, event %s at %d (position %d); the trace is "
                   "processed plainly from here", key, event.event_type, event.ts, tr.n)

    def end(self) -> None:
        """End of stream: every monitor terminates (no output); nothing is kept."""
        self.forgotten = _KeyFilter(self.forgotten.n_bits)
        self.traces.clear()
        self.pending.clear()
        self.forget.clear()
        self.alerts_due.clear()
        self.counters.traces = 0
        self.counters.pending = 0

    def is_idle(self) -> bool:
        """Nothing kept; a statically unsatisfiable monitor that has reported is not idle (a fresh one would report
        again), nor one that has forgotten a key (a fresh one would check it from the start)."""
        return (not self.traces and not self.pending and not self.static_reported and self.static_first is None
                and not self.forgotten.added)

    def next_due(self) -> int | None:
        """The lowest L at which a pending event is checked or a trace forgotten."""
        due = []
        if self.pending:
            due.append(self.pending[0][0])
        if self.alerts_due:
            due.append(self.alerts_due[0][0])
        if self.static_first is not None:
            due.append(self.static_first.ts)
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
                        None if tr.state is None else snap(tr.state), tr.cstate, _event_row(tr.first)]
                       for key, tr in self.traces.items()],
            "static_first": _event_row(self.static_first),
            "forgotten": self.forgotten.snapshot(),
            "pending": [[ts, s, key, e.event_type, e.ts, dict(e.attrs), e.event_id]
                        for ts, s, key, e in sorted(self.pending, key=lambda p: (p[0], p[1]))],
            "counters": {f.name: getattr(self.counters, f.name) for f in fields(MonitorCounters)},
        }

    def restore(self, doc: Mapping[str, Any], key_of: Any) -> None:
        self.static_reported = bool(doc["static_reported"])
        self.seq = int(doc["seq"])
        for raw_key, status, n, last_ts, checked_ts, state, cstate, *first in doc["traces"]:
            key = key_of(raw_key)
            tr = _Trace(None if state is None else self.checker.restore_trace(state), status, last_ts, cstate)
            tr.n, tr.checked_ts = n, checked_ts
            tr.first = _event_of(first[0]) if first else None  # snapshots before issue 25 had no first event
            self.traces[key] = tr
            self.seq += 1
            self.forget.append((last_ts, self.seq, key))
            if tr.first is not None:
                self.alerts_due.append((tr.first.ts, self.seq, key))
        heapq.heapify(self.forget)
        heapq.heapify(self.alerts_due)
        self.static_first = _event_of(doc.get("static_first"))
        self.forgotten = _KeyFilter.restore(doc["forgotten"])
        self.pending = [(ts, s, key_of(k), SaseEvent(t, ets, attrs, eid))
                        for ts, s, k, t, ets, attrs, eid in doc["pending"]]
        heapq.heapify(self.pending)
        for name, value in doc["counters"].items():
            setattr(self.counters, name, value)


_MISSING: Any = object()


def _event_row(event: SaseEvent | None) -> list[Any] | None:
    return None if event is None else [event.event_type, event.ts, dict(event.attrs), event.event_id]


def _event_of(row: list[Any] | None) -> SaseEvent | None:
    return None if row is None else SaseEvent(row[0], row[1], row[2], row[3])


class _KeyFilter:
    """Bloom filter of forgotten trace keys (fixed size): a key added is always found again; a key never added is
    found with a small probability, which only makes its trace unchecked (plain processing)."""

    __slots__ = ("added", "bits", "n_bits")

    def __init__(self, n_bits: int) -> None:
        if n_bits < 8 or n_bits & (n_bits - 1):
            raise ValueError(f"the filter's size must be a power of two >= 8, got {n_bits}")
        self.n_bits = n_bits
        self.bits = bytearray(n_bits // 8)
        self.added = 0

    def _positions(self, key: Hashable) -> list[int]:
        digest = hashlib.blake2b(_canonical(key), digest_size=4 * _FILTER_HASHES).digest()
        mask = self.n_bits - 1
        return [int.from_bytes(digest[4 * i:4 * i + 4], "little") & mask for i in range(_FILTER_HASHES)]

    def add(self, key: Hashable) -> None:
        bits = self.bits
        for i in self._positions(key):
            bits[i >> 3] |= 1 << (i & 7)
        self.added += 1

    def __contains__(self, key: Hashable) -> bool:
        if not self.added:
            return False
        bits = self.bits
        return all(bits[i >> 3] & (1 << (i & 7)) for i in self._positions(key))

    def snapshot(self) -> list[Any]:
        return [self.n_bits, self.added, zlib.compress(bytes(self.bits)) if self.added else b""]

    @classmethod
    def restore(cls, doc: list[Any]) -> _KeyFilter:
        n_bits, added, data = doc
        f = cls(int(n_bits))
        if added:
            bits = zlib.decompress(data)
            if len(bits) != len(f.bits):
                raise SaseError(f"a filter snapshot of {len(bits)} bytes does not fit {len(f.bits)}")
            f.bits[:] = bits
        f.added = int(added)
        return f


def _canonical(key: Hashable) -> bytes:
    """Equal keys give equal bytes in every process: 1, 1.0 and True are one dict key, and hash() of a str is
    salted per process while the filter travels in snapshots."""
    if key is None:
        return b"n"
    if isinstance(key, (bool, int)):
        return b"i%d" % key
    if isinstance(key, float):
        return b"i%d" % int(key) if key.is_integer() else b"f" + key.hex().encode()
    if isinstance(key, str):
        return b"s" + key.encode("utf-8", "surrogatepass")
    if isinstance(key, bytes):
        return b"b" + key
    if isinstance(key, tuple):
        return b"t" + b"".join(b"%d:%s" % (len(p), p) for p in map(_canonical, key))
    return b"r" + repr(key).encode("utf-8", "surrogatepass")
