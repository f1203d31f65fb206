"""The SASE sequence engine over out-of-order data: sans-IO, synchronous, no wall clock.

Per partition of the stream (equality partitioning, when the query has one) the engine keeps an
:class:`ActiveInstanceStacks`, one negation buffer per negated element and a holding set.  Time is two numbers:

* CLOCK, the largest event timestamp seen (Li's CLOCK; also moved by :meth:`SequenceEngine.advance_clock`);
* the low watermark L: no future event has a timestamp below L.  With K-slack (delays of at most K time units)
  L = CLOCK - K; a punctuation at ts (the project's contract: nothing older than ts follows) raises L to ts.

Everything the engine decides follows from L:

* an instance or buffered negation event with ts + W < L - A is purged (Algorithm 3's e.ts + W + K < CLOCK,
  moved back by the allowed lateness A so that late events still find their partners);
* a held match whose negation ranges all end at or before L (hi <= L) is final for on-time events: released in
  conservative mode, no longer held in aggressive mode.  This is the earliest safe moment: Example 4.10
  releases <a3 b6 d10> at CLOCK = 16 with K = 6 (10 <= 16 - 6).  An emitted match with negation stays in the
  partition's *released* set until hi <= L - A, because until then a late event can still fall into a range;
* a late event (L - A <= ts < L: it broke the promise, e.g. from the gateway's late topic) is processed against
  that retained history: matches it completes are ``late_match`` (conservative) or ``add`` (aggressive), released
  matches it negates are reported ``invalidated`` (conservative) or ``retract`` (aggressive), with the event as
  ``cause``;
* an event with ts < L - A is not processed: a ``too_late`` output says so (the state it would need may be gone,
  and a partial answer would pass for a complete one).  A = 0 is Li's engine exactly: everything behind L is
  too late.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

import msgpack

from cep.lateness import DEFAULT_ALLOWED_LATENESS_US

from .ais import ActiveInstanceStacks, Instance
from .events import SaseError, SaseEvent, SaseInputError, SaseOutput, match_output
from .monitor import ADMIT, CUT, NEGATION_ONLY, RELEASE, Action, TraceMonitor
from .negation import HeldMatch, NegationBuffer, invalidates, negation_ranges
from .query import Query

__all__ = ["INCREMENTAL_SNAPSHOT_VERSION", "SNAPSHOT_VERSION", "TOO_LATE_REASON", "EngineConfig", "EngineCounters",
           "SequenceEngine"]

Mode = Literal["conservative", "aggressive"]
CheckerAlgorithm = Literal["basic", "lightweight"]
SNAPSHOT_VERSION = 2
INCREMENTAL_SNAPSHOT_VERSION = 3
TOO_LATE_REASON = "beyond_allowed_lateness"
_NEVER = 2**63

_FastRoute = tuple[tuple[int, ...], int, str | None, bool]
"""In-order fast path of one event type: (positions, the position if it is the only one else -1, partition
attribute, ends at the last position?)."""


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Engine settings.

    ``k_slack_us``: K, the largest arrival delay (CLOCK - ts) the input may have, in the stream's time unit
    (microseconds in Skewless); None means no K-slack: only punctuations unblock purge and release.
    ``mode``: "conservative" (hold a match until no negation event can still invalidate it: delayed unsorted
    correctness) or "aggressive" (emit at once, compensate with retract/add: real-time factor 1).
    ``ais_clock`` / ``ais_partition``: Li's two optimisations, switchable for the benchmark.
    ``strict``: raise :class:`SaseInputError` on a bad event instead of counting it.
    ``record_purges``: keep (CLOCK, type, ts) of every purged instance in ``SequenceEngine.purge_log``.
    ``purge_lag``: lazy purge (the slides' periodic purge): a partition is purged once its oldest state is
    ``purge_lag`` time units past Algorithm 3's bound, so that one purge removes a batch instead of one instance
    per CLOCK update.  0 purges exactly at Algorithm 3's moment; None (default) uses W // 4, which keeps memory
    within (1.25 W + K) of stream time.  Purging later never changes results.
    ``allowed_lateness_us``: A, how far behind the low watermark an event may still be processed (a late event):
    state is kept A longer, so memory covers about 1.25 W + K + A of stream time.  0 drops everything behind L as
    ``too_late`` (Li's engine).
    ``constraint``: the workflow the stream follows, a regular expression over event types (cep.constraints,
    docs/constraints.md): per trace (partition), a trace that can no longer match is released and ignored
    (``monitor_terminated``).  ``constraint_checker``: "basic" (Algorithm 1) or "lightweight" (Algorithm 2).
    ``early_alerts``: also report ``early_alert`` once a match is certain; sound only if every trace of the
    constraint spans less than the query's window W (the user's promise: the checker is untimed).
    """

    k_slack_us: int | None = None
    mode: Mode = "conservative"
    ais_clock: bool = True
    ais_partition: bool = True
    strict: bool = False
    record_purges: bool = False
    purge_lag: int | None = None
    allowed_lateness_us: int = DEFAULT_ALLOWED_LATENESS_US
    constraint: str | None = None
    constraint_checker: CheckerAlgorithm = "lightweight"
    early_alerts: bool = False

    def __post_init__(self) -> None:
        k = self.k_slack_us
        lag = self.purge_lag
        a = self.allowed_lateness_us
        if isinstance(a, bool) or not isinstance(a, int) or a < 0:
            raise SaseError(f"allowed_lateness_us must be a non-negative integer, got {a!r}")
        if lag is not None and (isinstance(lag, bool) or not isinstance(lag, int) or lag < 0):
            raise SaseError(f"purge_lag must be a non-negative integer or None, got {lag!r}")
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 0):
            raise SaseError(f"k_slack_us must be a non-negative integer or None, got {k!r}")
        if self.mode not in ("conservative", "aggressive"):
            raise SaseError(f"mode must be 'conservative' or 'aggressive', got {self.mode!r}")
        if self.constraint_checker not in ("basic", "lightweight"):
            raise SaseError(f"constraint_checker must be 'basic' or 'lightweight', got {self.constraint_checker!r}")
        if self.early_alerts and self.constraint is None:
            raise SaseError("early_alerts needs a constraint")


@dataclass(slots=True)
class EngineCounters:
    """Monotone counters (``instances``/``held`` are gauges) exposed for metrics."""

    events: int = 0
    ignored: int = 0
    """Valid events of no query type or failing every element's constant predicates (they still advance
    CLOCK)."""
    rejected: int = 0
    late_events: int = 0
    """Accepted out-of-order events (ts < CLOCK at arrival)."""
    too_late: int = 0
    """Not processed: ts below the low watermark minus the allowed lateness (a ``too_late`` output each)."""
    behind_watermark: int = 0
    """Late events processed: ts below the low watermark, within the allowed lateness."""
    late_matches: int = 0
    """``late_match`` outputs (conservative mode)."""
    invalidated_after_release: int = 0
    """Released matches a late negation event fell into (``invalidated`` or ``retract`` outputs)."""
    released_retained: int = 0
    """Gauge: emitted matches with negation kept until no late event within the allowed lateness can negate them."""
    instances: int = 0
    negation_events: int = 0
    held: int = 0
    purged_instances: int = 0
    purged_negation_events: int = 0
    matches_constructed: int = 0
    negated_at_construction: int = 0
    invalidated_while_held: int = 0
    emitted: int = 0
    retracted: int = 0
    rip_resets: int = 0
    candidates: int = 0
    partitions: int = 0
    rejections: dict[str, int] = field(default_factory=dict)


_Route = tuple[tuple[int, ...], bool, tuple[int, ...], bool]
"""Per event type: (positive positions, any constant predicate?, negated elements, any constant predicate?)."""


def _routes(query: Query) -> dict[str, _Route]:
    routes: dict[str, _Route] = {}
    for etype in {*query.positions_by_type, *query.negations_by_type}:
        pos = query.positions_by_type.get(etype, ())
        neg = query.negations_by_type.get(etype, ())
        routes[etype] = (
            pos,
            any(query.constant_predicates[p] for p in pos),
            neg,
            any(query.negations[k].constant_predicates for k in neg),
        )
    return routes


def _fast_routes(query: Query, routes: Mapping[str, _Route]) -> dict[str, _FastRoute]:
    """The event types AIS-CLOCK's append semantics can take without checks: no constant predicate, no negation
    role."""
    last = query.length - 1
    fast: dict[str, _FastRoute] = {}
    for etype, (pos, pos_filtered, neg, _) in routes.items():
        if pos and not pos_filtered and not neg:
            fast[etype] = (pos, pos[0] if len(pos) == 1 else -1, query.partition_attributes.get(etype),
                           pos[-1] == last)
    return fast


class _Partition:
    __slots__ = ("ais", "held", "neg", "registered_ts", "released", "suspended")

    def __init__(self, query: Query) -> None:
        self.ais = ActiveInstanceStacks(query.length, query.window, query.checks)
        self.neg = [NegationBuffer() for _ in query.negations]
        self.held: dict[int, HeldMatch] = {}
        self.released: dict[int, HeldMatch] = {}
        """Emitted matches with negation that a late event within the allowed lateness can still negate."""
        self.registered_ts: int | None = None
        """Timestamp of this partition's live entry in the purge heap (its oldest state when registered)."""
        self.suspended: dict[int, tuple[HeldMatch, bool]] = {}
        """Matches of a terminated trace (constraint monitor) not reached by the checker yet, with whether they
        are out (aggressive mode): they go on only if the trace breaks the workflow at or before their first
        event (docs/constraints.md)."""

    def oldest_ts(self) -> int | None:
        oldest = self.ais.oldest_ts()
        for buf in self.neg:
            if buf.ts and (oldest is None or buf.ts[0] < oldest):
                oldest = buf.ts[0]
        return oldest

    def newest_ts(self) -> int:
        """Largest timestamp stored in the partition (its AIS-CLOCK or newest negation event)."""
        newest = self.ais.ais_clock if self.ais.ais_clock is not None else -(2**63)
        for buf in self.neg:
            if buf.ts and buf.ts[-1] > newest:
                newest = buf.ts[-1]
        return newest

    def empty(self) -> bool:
        return not self.held and not self.released and not self.suspended and self.oldest_ts() is None

    def snapshot(self, events: dict[int, SaseEvent]) -> list[Any]:
        ais_clock, rip_resets, candidates, stacks = self.ais.snapshot(events)
        # Snapshot version 1's layout, kept so that state checkpointed by earlier builds still restores (the
        # purge-heap timestamp sits between the AIS counters and the stacks); version 2 appends the released set.
        return [ais_clock, rip_resets, candidates, self.registered_ts, stacks,
                [buf.snapshot(events) for buf in self.neg], [held.snapshot(events) for held in self.held.values()],
                [done.snapshot(events) for done in self.released.values()],
                [[match.snapshot(events), emitted] for match, emitted in self.suspended.values()]]

    @classmethod
    def restore(cls, query: Query, state: Sequence[Any], events: Mapping[int, SaseEvent]) -> _Partition:
        """The partition :meth:`snapshot` captured; ``registered_ts`` is the snapshot's, not yet in any heap."""
        ais_clock, rip_resets, candidates, registered_ts, stacks, negs, held, *rest = state
        part = cls(query)
        part.ais = ActiveInstanceStacks.restore(query.length, query.window, query.checks,
                                                [ais_clock, rip_resets, candidates, stacks], events)
        part.neg = [NegationBuffer.restore(seqs, events) for seqs in negs]
        for row in held:
            match = HeldMatch.restore(query, row, events)
            part.held[match.match_id] = match
        for row in rest[0] if rest else ():  # version 1 had no released set
            match = HeldMatch.restore(query, row, events)
            part.released[match.match_id] = match
        for row, emitted in rest[1] if len(rest) > 1 else ():  # nor a suspended set (issue 25)
            match = HeldMatch.restore(query, row, events)
            part.suspended[match.match_id] = (match, bool(emitted))
        part.registered_ts = registered_ts
        return part


def _require_int_ts(ts: object, what: str) -> None:
    if isinstance(ts, bool) or not isinstance(ts, int):
        raise SaseInputError("bad_timestamp", f"{what} needs an int, got {ts!r}")


class SequenceEngine:
    """Evaluates one sequence query over an out-of-order event stream.

    >>> from cep.sase import parse_query
    >>> eng = SequenceEngine(parse_query("EVENT SEQ(A a, B b) WITHIN 10"), EngineConfig(k_slack_us=5))
    >>> [o.kind for o in eng.on_event(SaseEvent("B", 4)) + eng.on_event(SaseEvent("A", 2))]
    ['match']
    """

    def __init__(self, query: Query, config: EngineConfig | None = None) -> None:
        self.query = query
        self.config = config or EngineConfig()
        self.counters = EngineCounters()
        self.purge_log: list[tuple[int, str, int]] = []
        self._clock: int | None = None
        self._punctuation: int | None = None
        self._seq = 0
        self._match_id = 0
        self._heap_tiebreak = 0
        self._partitions: dict[Hashable, _Partition] = {}
        self._purge_heap: list[tuple[int, int, Hashable]] = []
        self._release_heap: list[tuple[int, int, Hashable]] = []
        self._forget_heap: list[tuple[int, int, Hashable]] = []
        """(final_at, match_id, key) of released matches: forgotten once final_at <= L - A."""
        self._dirty: set[Hashable] | None = None
        """Keys whose partition was created, changed or dropped since the last :meth:`incremental_snapshot`
        (None: not tracked before the first one, so an engine that is never snapshotted that way keeps no set)."""
        self._encoded: dict[Hashable, bytes] = {}
        """Per partition key, its encoding as of the last :meth:`incremental_snapshot` (clean keys reuse it)."""
        self._packed_keys: dict[Hashable, bytes] = {}
        """Per partition key, its packed form in :meth:`snapshot_changes` (a store's entry key)."""
        self._whole: _Partition | None = None
        """The partition of key None (unpartitioned query) while it exists: the fast path skips the lookup."""
        self._due_low: int = _NEVER
        """A low watermark below which nothing in the three heaps is due (lowered on every push, exact after
        :meth:`_on_time`): one comparison per CLOCK update instead of three heap checks."""
        self._lateness = self.config.allowed_lateness_us
        self._aggressive = self.config.mode == "aggressive"
        self._low: int | None = None
        self._k = self.config.k_slack_us
        # Types whose events need attribute checks (required attributes, hashable partition key).
        self._checked_types = frozenset(t for t, attrs in query.required_attributes.items() if attrs)
        # Per checked type: (its required attributes, its partition attribute or None), for on_event's fast path.
        self._attribute_rules = {t: (query.required_attributes[t], query.partition_attributes.get(t))
                                 for t in self._checked_types}
        lag = self.config.purge_lag
        self._purge_lag = query.window // 4 if lag is None else lag
        self._routes = _routes(query)
        self._fast = _fast_routes(query, self._routes) if self.config.ais_clock else {}
        # Construction straight to output events: no cross predicate to check, no negation filter to apply.
        self._plain_matches = not query.negations and not any(query.checks[query.length - 1])
        self._prune = self.config.ais_partition
        self._record_purges = self.config.record_purges
        # A purge is due once the oldest registered state is below L - A - W - purge_lag.
        self._purge_due_us = self._purge_lag + self._lateness + query.window
        self._monitor: TraceMonitor | None = None
        """Constraint-aware execution (monitor.py); None keeps every path exactly as without constraints."""
        self._watch: TraceMonitor | None = None
        """The same monitor, also while ``_monitor`` is off during an admitted event's plain processing: a match
        of a terminated trace is suspended, not output."""
        self._leading = frozenset(k for k, n in enumerate(query.negations) if n.after is None)
        """Negated elements whose range reaches before a match's first event: their events are kept for a
        terminated trace (a match after a later violation must see them, as the plain engine does)."""
        if self.config.constraint is not None:
            monitor = TraceMonitor(query, self.config.constraint, self.config.constraint_checker,
                                   self.config.early_alerts, query.window + self._lateness)
            if monitor.needed:
                self._monitor = self._watch = monitor

    # ---------------------------------------------------------------- time

    @property
    def clock(self) -> int | None:
        """CLOCK: the largest timestamp seen (events and advance_clock)."""
        return self._clock

    @property
    def low_watermark(self) -> int | None:
        """L: no future event may have a smaller timestamp (None: no promise yet)."""
        return self._low

    def _update_low(self) -> None:
        cands: list[int] = []
        if self.config.k_slack_us is not None and self._clock is not None:
            cands.append(self._clock - self.config.k_slack_us)
        if self._punctuation is not None:
            cands.append(self._punctuation)
        self._low = max(cands) if cands else None

    def _now(self) -> int:
        if self._clock is not None:
            return self._clock
        return self._punctuation if self._punctuation is not None else 0

    def advance_clock(self, ts: int) -> list[SaseOutput]:
        """Move CLOCK to ``ts`` without an event (K-slack purge and release); never goes backwards."""
        _require_int_ts(ts, "advance_clock")
        if self._clock is not None and ts <= self._clock:
            return []
        self._clock = ts
        return self._low_moved()

    def on_punctuation(self, ts: int) -> list[SaseOutput]:
        """The stream is complete below ``ts``: no later event has a smaller timestamp (exact, no K guess)."""
        _require_int_ts(ts, "punctuation")
        if self._punctuation is not None and ts <= self._punctuation:
            return []
        self._punctuation = ts
        return self._low_moved()

    def _low_moved(self) -> list[SaseOutput]:
        """CLOCK or the punctuation advanced: recompute the low watermark and release what it passed."""
        self._update_low()
        if self._monitor is not None:
            return self._monitor_drain() + self._on_time()
        return self._on_time()

    def end_of_stream(self) -> list[SaseOutput]:
        """No more events at all: release every held match and purge everything (late events too are over);
        every constraint monitor terminates (pending events are checked first, so their verdicts come out)."""
        if self._clock is None:
            return []
        outs = self.on_punctuation(self._clock + self.query.window + self._purge_lag + self._lateness + 1)
        if self._monitor is not None:
            self._monitor.end()
        return outs

    # ---------------------------------------------------------------- events

    def on_event(self, event: SaseEvent) -> list[SaseOutput]:
        """Process one event in arrival order; returns the output records it caused."""
        if self._monitor is not None:
            return self._monitored(event)
        # Fast path of the validation for the common well-formed event: exact types (bool is not a timestamp)
        # pass every type check of _check, so only its attribute checks remain; _check words any problem.
        if type(event) is SaseEvent and type(event.ts) is int and type(event.attrs) is dict and (
                type(event.event_type) is str):
            rules = self._attribute_rules.get(event.event_type)
            if rules is not None:
                required, key_attr = rules
                attrs = event.attrs
                if not required <= attrs.keys():
                    return self._reject(*self._attribute_problem(event))
                if key_attr is not None:
                    try:
                        hash(attrs[key_attr])
                    except TypeError:
                        return self._reject(*self._attribute_problem(event))
        else:
            problem = self._check(event)
            if problem is not None:
                return self._reject(*problem)
        c = self.counters
        c.events += 1
        ts = event.ts
        low = self._low
        clock = self._clock
        fast = self._fast.get(event.event_type)
        if fast is None or clock is None or ts < clock or (low is not None and ts < low):
            return self._general(event, ts, low, clock)
        # In-order fast path: an on-time event (ts >= CLOCK >= every AIS-CLOCK, not behind L) of a type that
        # only binds positive positions without constant predicates.  The same steps as the general path (CLOCK
        # update, due release and purge, partition, registration, append semantics, construction at the last
        # position) without the checks that cannot apply to it, in one call because it runs for nearly every event.
        outs: list[SaseOutput]
        if ts > clock:
            self._clock = ts
            if self._punctuation is None:
                low = self._low = None if self._k is None else ts - self._k
            else:
                self._update_low()
                low = self._low
            outs = self._on_time() if low is not None and low >= self._due_low else []
        else:
            outs = []
        return self._append_in_order(event, ts, fast, outs)

    def _append_in_order(
        self, event: SaseEvent, ts: int, fast: _FastRoute, outs: list[SaseOutput]
    ) -> list[SaseOutput]:
        """AIS-CLOCK's append semantics for an on-time event of a fast-path type: partition, registration, push
        with its RIP, then construction if it binds the last position."""
        positions, single, attr, at_last = fast
        c = self.counters
        key: Hashable = None
        if attr is None:
            part = self._whole
            if part is None:
                part = self._partitions.get(None)
                if part is None:
                    part = self._new_partition(None)
                self._whole = part
        else:
            key = event.attrs[attr]
            part = self._partitions.get(key)
            if part is None:
                part = self._new_partition(key)
        dirty = self._dirty
        if dirty is not None:
            dirty.add(key)
        seq = self._seq
        self._seq = seq + 1
        registered = part.registered_ts
        if registered is None or ts < registered:
            self._register(part, key, ts)
        ais = part.ais
        ais.ais_clock = ts
        if single >= 0:
            # One position (every type of a query without repeated types): no loop.
            inst = ais.append_at(single, event, seq)
            c.instances += 1
        else:
            inst = ais.append_all(positions, event, seq)
            c.instances += len(positions)
        if not at_last:
            return outs
        return self._construct_in_order(part, key, inst, positions[-1], outs)

    def _construct_in_order(
        self, part: _Partition, key: Hashable, inst: Instance, position: int, outs: list[SaseOutput]
    ) -> list[SaseOutput]:
        """Construction from an in-order instance of the last stack: nothing newer exists, so only it can
        complete sequences."""
        c = self.counters
        ais = part.ais
        before = ais.candidates
        if self._plain_matches and self._prune:
            # AIS partition: top down from each RIP to the divider, straight into event tuples.  Without the
            # partition the general search builds every RIP-compatible sequence and then applies the window.
            found = ais.construct_last(inst)
            if found:
                n = len(found)
                c.matches_constructed += n
                c.emitted += n
                ts = inst.ts
                outs += [match_output(events, ts) for events in found]
            c.candidates += ais.candidates - before
            return outs
        matches = ais.construct(position, inst, prune=self._prune)
        c.candidates += ais.candidates - before
        for match in matches:
            out = self._accept(part, key, match, False, False)
            if out is not None:
                outs.append(out)
        return outs

    def _new_partition(self, key: Hashable) -> _Partition:
        part = self._partitions[key] = _Partition(self.query)
        self.counters.partitions += 1
        return part

    def _touch(self, key: Hashable) -> None:
        """Partition ``key`` was created, changed or dropped: the next incremental snapshot encodes it again."""
        if self._dirty is not None:
            self._dirty.add(key)

    # ---------------------------------------------------------------- constraint-aware execution (Algorithm 5)

    def _monitored(self, event: SaseEvent) -> list[SaseOutput]:
        """The constraint monitor sees the event first: it checks every event that is final under the low
        watermark this event brings (this one too, when it is), cuts, releases or resumes the traces it decided
        on, and says whether the engine processes the event (an event of a terminated trace only while the
        checker has not reached it: a violation before it would make it part of the plain trace)."""
        mon = self._monitor
        assert mon is not None
        outs: list[SaseOutput] = []
        admit = ADMIT
        key: Hashable = None
        # A malformed event goes to the plain path, which rejects it; a well-formed one the plain path rejects
        # for a missing query attribute still happened, and belongs to its trace if it names one.
        if (type(event) is SaseEvent and type(event.ts) is int and type(event.attrs) is dict
                and type(event.event_type) is str) or self._check(event) is None:
            ts = event.ts
            clock = self._clock
            now = ts if clock is None or ts > clock else clock
            cands = [now - self._k] if self._k is not None else []
            if self._punctuation is not None:
                cands.append(self._punctuation)
            low = max(cands) if cands else None
            actions: list[Action] = []
            has_trace, key = mon.trace_key(event)
            if event.event_type in mon.types and has_trace:
                verdicts, actions, admit = mon.on_event(event, key, low, now)
                outs.extend(verdicts)
            else:
                if event.event_type in mon.types:
                    mon.counters.constraint_untraced += 1
                if low is not None:
                    mon.drain(low, now, outs, actions)
            outs.extend(self._apply(actions))
        if admit != ADMIT:
            negs = self.query.negations_by_type.get(event.event_type, ())
            if admit == NEGATION_ONLY and self._leading.intersection(negs) and (
                    event.event_type not in self._checked_types or self._check(event) is None):
                self.counters.events += 1
                outs.extend(self._general(event, event.ts, self._low, self._clock, only_negations=True))
            else:
                outs.extend(self.advance_clock(event.ts))
            return outs
        if mon.terminated(key):
            # Not through the fast path: its matches are suspended (_accept), not output.
            if event.event_type in self._checked_types:
                problem = self._check(event)
                if problem is not None:
                    return outs + self._reject(*problem)
            self.counters.events += 1
            outs.extend(self._general(event, event.ts, self._low, self._clock))
            return outs
        self._monitor = None
        try:
            outs.extend(self.on_event(event))
        finally:
            self._monitor = mon
        return outs

    def _monitor_drain(self) -> list[SaseOutput]:
        """The low watermark moved: the monitor checks the events that became final."""
        assert self._monitor is not None
        outs: list[SaseOutput] = []
        if self._low is None:
            return outs
        actions: list[Action] = []
        self._monitor.drain(self._low, self._now(), outs, actions)
        outs.extend(self._apply(actions))
        return outs

    def _apply(self, actions: list[Action]) -> list[SaseOutput]:
        """The monitor's decisions on traces' state, in order (monitor.RELEASE / CUT / RESUME)."""
        outs: list[SaseOutput] = []
        for what, key, ts in actions:
            if what == RELEASE:
                self._release_trace(key, outs)
            elif what == CUT:
                self._cut(key, ts, outs)
            else:
                self._resume(key, ts, outs)
        return outs

    def _drop_suspended(self, held: HeldMatch, emitted: bool, outs: list[SaseOutput]) -> None:
        """A match of a terminated trace that is no match of the trace from a violation on goes (withdrawn if it
        is out: aggressive mode output it before the verdict)."""
        if emitted:
            self.counters.retracted += 1
            outs.append(SaseOutput("retract", held.events, self._now()))

    def _cut(self, key: Hashable, ts: int, outs: list[SaseOutput]) -> None:
        """Trace ``key`` is terminated and the checker followed it through ``ts`` without a violation: a later
        violation makes only events after ``ts`` part of the plain trace, so everything at or before ``ts`` goes
        (early buffer release), except events of leading negations; held matches wait as suspended."""
        part = self._partitions.get(key)
        if part is None:
            return
        self._touch(key)
        c = self.counters
        purged = part.ais.purge_before(ts + 1)
        c.instances -= len(purged)
        n = len(purged)
        for k, buf in enumerate(part.neg):
            if k not in self._leading:
                m = buf.purge_before(ts + 1)
                c.negation_events -= m
                n += m
        for mid, held in list(part.held.items()):
            del part.held[mid]
            c.held -= 1
            part.suspended[mid] = (held, self._aggressive)  # aggressive mode: it is out
        for mid, (held, emitted) in list(part.suspended.items()):
            if held.events[0].ts <= ts:
                del part.suspended[mid]
                n += 1
                self._drop_suspended(held, emitted, outs)
        assert self._watch is not None
        self._watch.counters.constraint_released += n
        if part.empty():
            del self._partitions[key]  # its purge-heap entry is skipped when it comes up
            if key is None:
                self._whole = None

    def _resume(self, key: Hashable, ts: int, outs: list[SaseOutput]) -> None:
        """Trace ``key`` broke the workflow at ``ts``: plain from there on.  Its state before ``ts`` goes (except
        leading negations' events); its suspended matches that start at or after ``ts`` go on as the plain
        engine's would have (held for negation, or output)."""
        part = self._partitions.get(key)
        if part is None:
            return
        self._touch(key)
        c = self.counters
        purged = part.ais.purge_before(ts)
        c.instances -= len(purged)
        for k, buf in enumerate(part.neg):
            if k not in self._leading:
                c.negation_events -= buf.purge_before(ts)
        low = self._low
        for mid, (held, emitted) in list(part.suspended.items()):
            del part.suspended[mid]
            if held.events[0].ts < ts:
                self._drop_suspended(held, emitted, outs)
                continue
            if not emitted and (self._aggressive or not held.ranges or (low is not None and held.final_at <= low)):
                outs.append(self._emit(held.kind, held.events))  # type: ignore[arg-type]
            if not held.ranges:
                continue
            if low is None or held.final_at > low:
                part.held[mid] = held
                heapq.heappush(self._release_heap, (held.final_at, mid, key))
                self._due_low = min(self._due_low, held.final_at)
                c.held += 1
            else:
                self._retain(part, key, held, low)

    def _release_trace(self, key: Hashable, outs: list[SaseOutput]) -> None:
        """Early buffer release: everything the terminated trace holds (stacks, negation buffers, held, retained
        and suspended matches) goes at once; stale heap entries for the key are skipped when they come up."""
        part = self._partitions.pop(key, None)
        if part is None:
            return
        self._touch(key)
        if key is None:
            self._whole = None
        c = self.counters
        n_inst, n_neg = len(part.ais), sum(len(b) for b in part.neg)
        c.instances -= n_inst
        c.negation_events -= n_neg
        c.held -= len(part.held)
        c.released_retained -= len(part.released)
        for held, emitted in part.suspended.values():
            self._drop_suspended(held, emitted, outs)
        assert self._watch is not None
        self._watch.counters.constraint_released += n_inst + n_neg + len(part.held) + len(part.suspended)

    def _general(self, event: SaseEvent, ts: int, low: int | None, clock: int | None,
                 only_negations: bool = False) -> list[SaseOutput]:
        """Every event the in-order fast path does not take: out of order, behind the watermark, the first
        event, or of a type with constant predicates or a negation role.  ``only_negations``: an event of a
        terminated trace the checker passed, kept only in leading negations' buffers."""
        q = self.query
        c = self.counters
        behind = False
        if low is not None and ts < low:
            if ts < low - self._lateness:
                c.too_late += 1
                return [SaseOutput("too_late", (event,), self._now(), reason=TOO_LATE_REASON)]
            behind = True
            c.behind_watermark += 1
        outs: list[SaseOutput] = []
        late = clock is not None and ts < clock
        if late:
            c.late_events += 1
        elif clock is None or ts > clock:
            self._clock = ts
            if self._punctuation is None:
                self._low = None if self._k is None else ts - self._k
            else:
                self._update_low()
            if self._low is not None and self._low >= self._due_low:
                outs.extend(self._on_time())
        attrs = event.attrs
        route = self._routes.get(event.event_type)
        if route is None:
            c.ignored += 1
            return outs
        positions, pos_filtered, negs, neg_filtered = route
        if only_negations:
            positions, negs = (), tuple(k for k in negs if k in self._leading)
        if pos_filtered:
            positions = tuple(p for p in positions if all(cp.holds(attrs) for cp in q.constant_predicates[p]))
        if neg_filtered:
            negs = tuple(k for k in negs if all(cp.holds(attrs) for cp in q.negations[k].constant_predicates))
        if not positions and not negs:
            c.ignored += 1
            return outs
        return self._negate_then_scan(event, positions, negs, late, behind, outs)

    def _negate_then_scan(
        self,
        event: SaseEvent,
        positions: tuple[int, ...],
        negs: tuple[int, ...],
        late: bool,
        behind: bool,
        outs: list[SaseOutput],
    ) -> list[SaseOutput]:
        """An event that binds ``positions`` and negated elements ``negs`` (after constant predicates) in its
        partition."""
        attr = self.query.partition_attributes.get(event.event_type)
        key: Hashable = event.attrs[attr] if attr is not None else None
        part = self._partitions.get(key)
        if part is None:
            part = self._new_partition(key)
        self._touch(key)
        seq = self._seq
        self._seq += 1
        self._register(part, key, event.ts)
        # Negation first: the event invalidates held matches; a match it completes itself cannot contain it in
        # a negation range (ranges are open and exclude the match's own timestamps).
        for k in negs:
            part.neg[k].add(event, seq)
            self.counters.negation_events += 1
            outs.extend(self._negate(part, k, event))
            if behind and part.released:
                outs.extend(self._negate_released(part, k, event))
        if positions:
            outs.extend(self._scan(part, key, event, seq, positions, late, behind))
        return outs

    def _scan(
        self,
        part: _Partition,
        key: Hashable,
        event: SaseEvent,
        seq: int,
        positions: tuple[int, ...],
        late: bool,
        behind: bool,
    ) -> list[SaseOutput]:
        """Sequence scan and construction (Algorithm 2) for one event in one partition."""
        ais = part.ais
        last = self.query.length - 1
        resets, candidates = ais.rip_resets, ais.candidates
        ts = event.ts
        in_order = self.config.ais_clock and (ais.ais_clock is None or ts >= ais.ais_clock)
        matches: list[tuple[Instance, ...]] = []
        if in_order:
            inst = Instance(event, seq)
            for p in positions[:-1]:
                ais.insert(p, Instance(event, seq), append=True)
            ais.insert(positions[-1], inst, append=True)
            # In order: only an instance of the last stack can complete sequences (nothing newer exists).
            if positions[-1] == last:
                matches = ais.construct(last, inst, prune=self.config.ais_partition)
        else:
            insts = [(p, Instance(event, seq)) for p in positions]
            for p, inst in insts:
                ais.insert(p, inst, append=False)
            for p, inst in insts:
                matches.extend(ais.construct(p, inst))
        c = self.counters
        c.instances += len(positions)
        c.rip_resets += ais.rip_resets - resets
        c.candidates += ais.candidates - candidates
        if not matches:
            return []
        outs: list[SaseOutput] = []
        for match in matches:
            out = self._accept(part, key, match, late, behind)
            if out is not None:
                outs.append(out)
        return outs

    def _accept(
        self, part: _Partition, key: Hashable, match: tuple[Instance, ...], late: bool, behind: bool
    ) -> SaseOutput | None:
        """Negation filter and holding set (Algorithm 10, lines 17-21) for one constructed sequence."""
        q = self.query
        c = self.counters
        c.matches_constructed += 1
        events = tuple(i.event for i in match)
        kind: Literal["match", "add", "late_match"] = "match"
        if self._aggressive:
            if late or behind:
                kind = "add"
        elif behind:
            kind = "late_match"
        suspend = self._watch is not None and self._watch.terminated(key)
        if not q.negations and not suspend:
            return self._emit(kind, events)
        ranges = negation_ranges(q, events)
        for k, (lo, hi) in enumerate(ranges):
            neg = q.negations[k]
            for ne in part.neg[k].between(lo, hi):
                if invalidates(neg, ne, events, lo, hi):
                    c.negated_at_construction += 1
                    return None
        final_at = max((hi for _, hi in ranges), default=events[-1].ts)
        low = self._low
        mid = self._match_id
        self._match_id += 1
        held = HeldMatch(mid, events, tuple(i.seq for i in match), ranges, final_at, kind)
        if suspend:
            # A match of a terminated trace: it counts only if the trace breaks the workflow at or before its
            # first event, which the checker has not reached yet (_cut / _resume decide).
            part.suspended[mid] = (held, False)
            return None
        if low is None or final_at > low:
            part.held[mid] = held
            heapq.heappush(self._release_heap, (final_at, mid, key))
            self._due_low = min(self._due_low, final_at)
            c.held += 1
            if not self._aggressive:
                return None
        else:
            self._retain(part, key, held, low)
        return self._emit(kind, events)

    def _emit(self, kind: Literal["match", "add", "late_match"], events: tuple[SaseEvent, ...]) -> SaseOutput:
        self.counters.emitted += 1
        if kind == "match":
            return match_output(events, self._now())
        if kind == "late_match":
            self.counters.late_matches += 1
        return SaseOutput(kind, events, self._now())

    def _retain(self, part: _Partition, key: Hashable, held: HeldMatch, low: int) -> None:
        """An emitted match that is final for on-time events: kept while a late event can still negate it."""
        if held.final_at > low - self._lateness:
            part.released[held.match_id] = held
            heapq.heappush(self._forget_heap, (held.final_at, held.match_id, key))
            self._due_low = min(self._due_low, held.final_at + self._lateness)
            self.counters.released_retained += 1

    def _negate(self, part: _Partition, k: int, event: SaseEvent) -> list[SaseOutput]:
        """A negation event removes the held matches it falls into (Algorithm 10, lines 9-11)."""
        neg = self.query.negations[k]
        outs: list[SaseOutput] = []
        for mid, (held, emitted) in list(part.suspended.items()):
            lo, hi = held.ranges[k]
            if invalidates(neg, event, held.events, lo, hi):
                del part.suspended[mid]
                self._drop_suspended(held, emitted, outs)
        for mid, held in list(part.held.items()):
            lo, hi = held.ranges[k]
            if invalidates(neg, event, held.events, lo, hi):
                del part.held[mid]
                self.counters.held -= 1
                self.counters.invalidated_while_held += 1
                if self._aggressive:
                    self.counters.retracted += 1
                    outs.append(SaseOutput("retract", held.events, self._now(), cause=event))
        return outs

    def _negate_released(self, part: _Partition, k: int, event: SaseEvent) -> list[SaseOutput]:
        """A late negation event falls into matches already released (conservative) or no longer held
        (aggressive): those are withdrawn downstream, each once."""
        neg = self.query.negations[k]
        kind: Literal["retract", "invalidated"] = "retract" if self._aggressive else "invalidated"
        outs: list[SaseOutput] = []
        for mid, done in list(part.released.items()):
            lo, hi = done.ranges[k]
            if invalidates(neg, event, done.events, lo, hi):
                del part.released[mid]
                c = self.counters
                c.released_retained -= 1
                c.invalidated_after_release += 1
                if self._aggressive:
                    c.retracted += 1
                outs.append(SaseOutput(kind, done.events, self._now(), cause=event))
        return outs

    def _register(self, part: _Partition, key: Hashable, ts: int) -> None:
        if part.registered_ts is None or ts < part.registered_ts:
            part.registered_ts = ts
            self._heap_tiebreak += 1
            heapq.heappush(self._purge_heap, (ts, self._heap_tiebreak, key))
            self._due_low = min(self._due_low, ts + self._purge_due_us + 1)

    def _on_time(self) -> list[SaseOutput]:
        """CLOCK or punctuation moved: release final held matches, then purge (PSSC / PNG)."""
        low = self._low
        if low is None:
            return []
        outs: list[SaseOutput] = []
        late_low = low - self._lateness
        self._release_final(low, outs)
        self._forget_final(late_low)
        self._purge_expired(late_low - self.query.window)
        # Exact again: the lowest watermark at which one of the heaps has something due.
        due = _NEVER
        if self._release_heap:
            due = self._release_heap[0][0]
        if self._purge_heap:
            due = min(due, self._purge_heap[0][0] + self._purge_due_us + 1)
        if self._forget_heap:
            due = min(due, self._forget_heap[0][0] + self._lateness)
        self._due_low = due
        return outs

    def _release_final(self, low: int, outs: list[SaseOutput]) -> None:
        """Held matches whose negation ranges all end at or before L: no on-time event can negate them now."""
        release_heap = self._release_heap
        c = self.counters
        while release_heap and release_heap[0][0] <= low:
            _, mid, key = heapq.heappop(release_heap)
            part = self._partitions.get(key)
            held = part.held.pop(mid, None) if part is not None else None
            if held is None or part is None:
                continue
            self._touch(key)
            c.held -= 1
            if not self._aggressive:
                outs.append(self._emit(held.kind, held.events))  # type: ignore[arg-type]
            self._retain(part, key, held, low)
            if part.registered_ts is None and part.empty():
                del self._partitions[key]
                self._whole = None

    def _forget_final(self, late_low: int) -> None:
        """Released matches no late event within the allowed lateness can negate any more (hi <= L - A)."""
        forget_heap = self._forget_heap
        c = self.counters
        while forget_heap and forget_heap[0][0] <= late_low:
            _, mid, key = heapq.heappop(forget_heap)
            part = self._partitions.get(key)
            if part is None or part.released.pop(mid, None) is None:
                continue  # already withdrawn by a late negation event
            self._touch(key)
            c.released_retained -= 1
            if part.registered_ts is None and part.empty():
                del self._partitions[key]
                self._whole = None

    def _purge_expired(self, bound: int) -> None:
        """K-slack purge (Algorithm 3) of the partitions registered below ``bound`` = L - A - W, late by at most
        the purge lag; a partition keeps one heap entry, at its oldest remaining state."""
        purge_heap = self._purge_heap
        c = self.counters
        lag = self._purge_lag
        while purge_heap and purge_heap[0][0] + lag < bound:
            ts, _, key = heapq.heappop(purge_heap)
            part = self._partitions.get(key)
            if part is None or part.registered_ts != ts:
                continue
            self._touch(key)
            ais_clock = part.ais.ais_clock
            if (not part.held and not part.released and not part.suspended and not self._record_purges
                    and (ais_clock is None or ais_clock < bound) and part.newest_ts() < bound):
                # The whole partition expired (the usual end of a key's life): drop it in one step.
                n_inst, n_neg = len(part.ais), sum(len(b) for b in part.neg)
                c.purged_instances += n_inst
                c.instances -= n_inst
                c.purged_negation_events += n_neg
                c.negation_events -= n_neg
                del self._partitions[key]
                self._whole = None
                continue
            self._purge(part, bound)
            oldest = part.oldest_ts() if part.neg else part.ais.oldest_ts()
            part.registered_ts = None
            if oldest is not None:
                self._register(part, key, oldest)
            elif not part.held and not part.released and not part.suspended:
                del self._partitions[key]
                self._whole = None

    def _purge(self, part: _Partition, bound: int) -> None:
        """Drop state no event within the allowed lateness can use: ``bound`` is L - A - W."""
        purged = part.ais.purge_before(bound)
        c = self.counters
        c.purged_instances += len(purged)
        c.instances -= len(purged)
        if self.config.record_purges:
            now = self._now()
            self.purge_log.extend((now, i.event.event_type, i.ts) for i in purged)
        if part.neg:
            n = sum(b.purge_before(bound) for b in part.neg)
            c.purged_negation_events += n
            c.negation_events -= n

    # ---------------------------------------------------------------- bad input

    def _check(self, event: object) -> tuple[str, str] | None:
        if not isinstance(event, SaseEvent):
            return "not_an_event", f"expected SaseEvent, got {type(event).__name__}"
        if not isinstance(event.event_type, str):
            return "bad_event_type", f"event_type must be a str, got {event.event_type!r}"
        if isinstance(event.ts, bool) or not isinstance(event.ts, int):
            return "bad_timestamp", f"ts must be an int, got {event.ts!r}"
        if not isinstance(event.attrs, Mapping):
            return "bad_attrs", f"attrs must be a mapping, got {type(event.attrs).__name__}"
        return self._attribute_checks(event)

    def _attribute_problem(self, event: SaseEvent) -> tuple[str, str]:
        """The attribute problem of an event the fast path found one in."""
        problem = self._attribute_checks(event)
        assert problem is not None
        return problem

    def _attribute_checks(self, event: SaseEvent) -> tuple[str, str] | None:
        """_check's checks of an event whose types passed: required attributes, a hashable partition key."""
        required = self.query.required_attributes.get(event.event_type)
        if required and not required <= event.attrs.keys():
            missing = [a for a in sorted(required) if a not in event.attrs]
            return "missing_attribute", f"{event.event_type} event lacks {', '.join(missing)}"
        attr = self.query.partition_attributes.get(event.event_type)
        if attr is not None:
            try:
                hash(event.attrs[attr])
            except TypeError:
                return "unhashable_key", f"partition attribute {attr}={event.attrs[attr]!r} is not hashable"
        return None

    def _reject(self, reason: str, detail: str) -> list[SaseOutput]:
        if self.config.strict:
            raise SaseInputError(reason, detail)
        self.counters.rejected += 1
        self.counters.rejections[reason] = self.counters.rejections.get(reason, 0) + 1
        return []

    # ---------------------------------------------------------------- inspection

    def stats(self) -> dict[str, Any]:
        """Counters as a flat dict (for metrics / JSON)."""
        d = asdict(self.counters)
        if self._monitor is not None:
            d.update(asdict(self._monitor.counters))
        d["clock"] = self._clock
        d["low_watermark"] = self.low_watermark
        return d

    def partition(self, key: Hashable = None) -> ActiveInstanceStacks | None:
        """The AIS of one partition (``None`` key when the query is not partitioned)."""
        part = self._partitions.get(key)
        return part.ais if part is not None else None

    def held_matches(self) -> list[HeldMatch]:
        return [h for p in self._partitions.values() for h in p.held.values()]

    def next_timer_us(self) -> int | None:
        """The lowest low watermark at which a held match is released or state is purged (an event-time timer
        for a streaming shell; stale heap entries can make it early, never late)."""
        due = []
        if self._release_heap:
            due.append(self._release_heap[0][0])
        if self._purge_heap:
            due.append(self._purge_heap[0][0] + self._purge_lag + self.query.window + self._lateness + 1)
        if self._forget_heap:
            due.append(self._forget_heap[0][0] + self._lateness)
        if self._monitor is not None:
            monitor_due = self._monitor.next_due()
            if monitor_due is not None:
                due.append(monitor_due)
        return min(due, default=None)

    def is_idle(self) -> bool:
        """No instance, negation event, held match or trace record left: the engine can be dropped and rebuilt
        fresh."""
        return not self._partitions and (self._monitor is None or self._monitor.is_idle())

    @property
    def monitor(self) -> TraceMonitor | None:
        """The constraint monitor (None without a constraint, or when it can never report anything)."""
        return self._monitor

    def trace_key(self, event: SaseEvent) -> Hashable:
        """The trace an event belongs to: its partition value (None when the query is not partitioned)."""
        attr = self.query.partition_attributes.get(event.event_type)
        if attr is None:
            names = set(self.query.partition_attributes.values())
            attr = next(iter(names)) if len(names) == 1 else None
        return None if attr is None else event.attrs.get(attr)

    # ---------------------------------------------------------------- snapshot

    def _constraint_fingerprint(self) -> list[Any]:
        c = self.config
        return [c.constraint, c.constraint_checker, c.early_alerts]

    def _fingerprint(self) -> str:
        q = self.query
        return repr((q.elements, q.predicates, q.window))

    def snapshot(self) -> bytes:
        """The complete state as msgpack bytes (attribute values must be msgpack-serialisable), every partition
        encoded anew (version 2; :meth:`incremental_snapshot` re-encodes only the partitions that changed).

        Every stored event is written once (keyed by its arrival number ``seq``); stacks list (seq, RIP seq)
        pairs in stack order, negation buffers and holding sets list seqs in their order.  The heaps are not
        written: they are rebuilt from the partitions, since their order only decides which partition is purged
        first, and held matches are released by (final_at, match_id), which the snapshot keeps; so a restored
        engine produces exactly the same output."""
        events: dict[int, SaseEvent] = {}
        partitions = [[key, *part.snapshot(events)] for key, part in self._partitions.items()]
        doc = self._engine_doc(SNAPSHOT_VERSION)
        doc["events"] = _event_rows(events)
        doc["partitions"] = partitions
        return _packed(doc)

    def incremental_snapshot(self) -> bytes:
        """The complete state, like :meth:`snapshot`, at a cost proportional to the partitions that changed since
        the previous call (version 3): each partition is encoded on its own, with its own events (an event lives
        in exactly one partition), and a partition no event, release, purge, expiry or verdict touched since
        then reuses its previous encoding.  The engine-wide part (CLOCK, punctuation, counters, the constraint
        monitor) is written whole.  The first call (or the first after restoring a version 1 or 2 blob)
        encodes every partition, and from then on the engine tracks which ones change."""
        self._encode_changed()
        encoded = self._encoded
        doc = self._engine_doc(INCREMENTAL_SNAPSHOT_VERSION)
        doc["keys"] = list(encoded)
        doc["parts"] = list(encoded.values())
        return _packed(doc)

    def snapshot_changes(self) -> tuple[bytes, dict[bytes, bytes | None]]:
        """The complete state for a store that keeps each partition apart (one entry per partition key): the
        engine-wide part (:meth:`incremental_snapshot` without partitions) and, keyed by the packed partition key,
        the encoding of each partition that changed since the previous call (None: the partition is gone). The
        first call (or the first after restoring a version 1 or 2 blob) gives every partition. Applied to the
        store's entries, the changes leave exactly what :meth:`restore_parts` restores this engine from."""
        packed_keys = self._packed_keys
        out: dict[bytes, bytes | None] = {}
        for key, encoded in self._encode_changed().items():
            # Equal keys of different types (1, 1.0, True) are one partition: one packed key, the first one's.
            packed = packed_keys.get(key)
            if packed is None:
                packed = packed_keys[key] = _packed(key)
            if encoded is None:
                del packed_keys[key]
            out[packed] = encoded
        return _packed(self._engine_doc(INCREMENTAL_SNAPSHOT_VERSION)), out

    def _encode_changed(self) -> dict[Hashable, bytes | None]:
        """Re-encode the partitions changed since the last snapshot (all of them the first time) into
        ``self._encoded``; returns those changes (None: a partition dropped)."""
        encoded = self._encoded
        if self._dirty is None:
            encoded.clear()
            changed: Iterable[Hashable] = list(self._partitions)
        else:
            changed = self._dirty
        partitions = self._partitions
        changes: dict[Hashable, bytes | None] = {}
        for key in changed:
            part = partitions.get(key)
            if part is None:
                encoded.pop(key, None)
                changes[key] = None
            else:
                encoded[key] = changes[key] = _encoded_partition(part)
        # Only once every changed partition is encoded: a partition that fails to encode stays marked.
        self._dirty = set()
        return changes

    def _engine_doc(self, version: int) -> dict[str, Any]:
        """Everything but the partitions (and their events)."""
        doc: dict[str, Any] = {
            "v": version,
            "query": self._fingerprint(),
            "clock": self._clock,
            "punctuation": self._punctuation,
            "seq": self._seq,
            "match_id": self._match_id,
            "counters": {f.name: getattr(self.counters, f.name) for f in fields(EngineCounters)},
            "purge_log": [list(x) for x in self.purge_log],
        }
        if self.config.constraint is not None:
            doc["constraint"] = [*self._constraint_fingerprint(),
                                 None if self._monitor is None else self._monitor.snapshot()]
        return doc

    @classmethod
    def restore(cls, query: Query, config: EngineConfig | None, blob: bytes) -> SequenceEngine:
        """An engine in exactly the state ``snapshot`` or ``incremental_snapshot`` captured (same query
        required); every version so far (1 and 2: :meth:`snapshot`, 3: :meth:`incremental_snapshot`) restores."""
        return cls._restored(query, config, _unpacked_doc(blob))

    @classmethod
    def restore_parts(cls, query: Query, config: EngineConfig | None, engine_doc: bytes,
                      parts: Iterable[tuple[bytes, bytes]]) -> SequenceEngine:
        """An engine in exactly the state :meth:`snapshot_changes` described: its engine-wide part and every
        (packed key, encoding) entry of a store those changes were applied to, in any order."""
        doc = _unpacked_doc(engine_doc)
        entries = list(parts)
        doc["keys"] = [msgpack.unpackb(key, raw=False, strict_map_key=False) for key, _ in entries]
        doc["parts"] = [encoded for _, encoded in entries]
        engine = cls._restored(query, config, doc)
        engine._packed_keys = {_partition_key(raw): bytes(packed) for raw, (packed, _) in zip(doc["keys"], entries,
                                                                                              strict=True)}
        return engine

    @classmethod
    def _restored(cls, query: Query, config: EngineConfig | None, doc: Any) -> SequenceEngine:
        if not isinstance(doc, dict) or doc.get("v") not in (1, SNAPSHOT_VERSION, INCREMENTAL_SNAPSHOT_VERSION):
            version = doc.get("v") if isinstance(doc, dict) else None
            raise SaseError(f"not an engine snapshot of a supported version (got version {version!r}; this build "
                            f"reads 1, {SNAPSHOT_VERSION} and {INCREMENTAL_SNAPSHOT_VERSION})")
        engine = cls(query, config)
        if doc["query"] != engine._fingerprint():
            raise SaseError("snapshot was taken for a different query")
        engine._clock = doc["clock"]
        engine._punctuation = doc["punctuation"]
        engine._update_low()
        engine._seq = doc["seq"]
        engine._match_id = doc["match_id"]
        for name, value in doc["counters"].items():
            setattr(engine.counters, name, value)
        engine.purge_log = [(a, b, c) for a, b, c in doc["purge_log"]]
        constraint = doc.get("constraint")
        if (constraint is None) != (engine.config.constraint is None) or (
                constraint is not None and constraint[:3] != engine._constraint_fingerprint()):
            raise SaseError("snapshot was taken with a different constraint configuration")
        if constraint is not None and engine._monitor is not None and constraint[3] is not None:
            engine._monitor.restore(constraint[3], _partition_key)
        if doc["v"] == INCREMENTAL_SNAPSHOT_VERSION:
            for raw_key, encoded in zip(doc["keys"], doc["parts"], strict=True):
                key = _partition_key(raw_key)
                rows, state = msgpack.unpackb(encoded, raw=False, strict_map_key=False)
                engine._add_restored(key, _Partition.restore(query, state, _events_of(rows)))
                # The partition is exactly what these bytes say: until it changes, they are its encoding.
                engine._encoded[key] = bytes(encoded)
            engine._dirty = set()
        else:
            events = _events_of(doc["events"])
            for raw_key, *state in doc["partitions"]:
                engine._add_restored(_partition_key(raw_key), _Partition.restore(query, state, events))
        due = engine.next_timer_us()
        engine._due_low = _NEVER if due is None else due
        return engine

    def _add_restored(self, key: Hashable, part: _Partition) -> None:
        """A restored partition joins the engine with its heap entries (held, released, purge registration)."""
        for mid, held in part.held.items():
            heapq.heappush(self._release_heap, (held.final_at, mid, key))
        for mid, done in part.released.items():
            heapq.heappush(self._forget_heap, (done.final_at, mid, key))
        self._partitions[key] = part
        registered_ts, part.registered_ts = part.registered_ts, None
        if registered_ts is not None:
            self._register(part, key, registered_ts)


def _unpacked_doc(blob: bytes) -> Any:
    try:
        return msgpack.unpackb(blob, raw=False, strict_map_key=False)
    except (ValueError, TypeError, msgpack.ExtraData) as exc:
        raise SaseError(f"not an engine snapshot: {exc}") from exc


def _event_rows(events: Mapping[int, SaseEvent]) -> list[list[Any]]:
    return [[s, e.event_type, e.ts, dict(e.attrs), e.event_id] for s, e in sorted(events.items())]


def _events_of(rows: Sequence[Sequence[Any]]) -> dict[int, SaseEvent]:
    return {s: SaseEvent(t, ts, attrs, eid) for s, t, ts, attrs, eid in rows}


def _encoded_partition(part: _Partition) -> bytes:
    """One partition of an incremental snapshot: ``[its events, its state]`` (the layout of :meth:`_Partition.
    snapshot`), self-contained because no event is shared between partitions."""
    events: dict[int, SaseEvent] = {}
    state = part.snapshot(events)
    # The events in the order the partition's structures hold them (a function of its state, so equal states still
    # encode alike) rather than sorted, and attributes that are a dict already as they are: sorting and copying
    # were most of the encoding's time.
    rows = [[s, e.event_type, e.ts, e.attrs if type(e.attrs) is dict else dict(e.attrs), e.event_id]
            for s, e in events.items()]
    return _packed([rows, state])


def _packed(doc: Any) -> bytes:
    try:
        return bytes(msgpack.packb(doc, use_bin_type=True))
    except (TypeError, ValueError, OverflowError) as exc:
        raise SaseError(
            f"engine state is not serialisable (attribute values must be msgpack types): {exc}") from exc


def _partition_key(raw: Any) -> Hashable:
    """msgpack turns a tuple key (several partition attributes) into a list: make it hashable again."""
    return tuple(_partition_key(x) for x in raw) if isinstance(raw, list) else raw
