"""The ISEQ engine (Li 2010 Algorithms 11-13) over K-bounded out-of-order arrival: sans-IO, no wall clock.

Input is a stream of items (:class:`Interval` at its end, :class:`IntervalBegin` at its start).  Time is CLOCK,
the largest item time seen (an interval's end, an IBP's start).  The K contract (IO3's K-ISlack): every item's
time is at least ``CLOCK - K`` on arrival; an item that breaks it is reported ``too_late`` and not processed,
never silently joined.  ``K = 0`` is Li's in-order setting.

One buffer per positive element (alias), kept sorted on the element's *index endpoint*:

* ``indexing="naive"``: no index, no early drops.  Buffers are scanned, the given TList atoms are checked once
  both sides are bound, only the window purge frees memory.  The baseline of Li's section 5.5.
* ``indexing="ais"`` (Algorithm 11, basic indexing): the longest chain of *end* endpoints of distinct elements
  linked by strict given-or-inferred restrictions is the indexed path.  Its buffers are sorted on ``te`` and a
  join binary-searches the range its bound neighbours allow; that range is what Li's RIP pointers delimit (under
  out-of-order insertion a binary search replaces the RIP maintenance of Algorithm 6, with the same entries
  visited).  Joins check the inferred restrictions as soon as both sides are bound.  On-the-fly dropping,
  cascading purge, immediate purge and the trigger rule apply.
* ``indexing="ibp"`` (Algorithm 13): the path may also chain *start* endpoints of the ``punctuated_types`` (whose
  begins arrive as IBPs).  An IBP opens an unfilled entry in its element's start-sorted buffer; the interval fills
  it at its end.  Joins skip unfilled entries.  IBPs allow the early drops of section 5.4.1.

With ``ais`` and ``ibp`` (and ``key_index``, the default) each buffer is also indexed by the value of every
attribute an ``=`` predicate ties to another positive element (``a.id = b.id``): a join probes only the entries with
its bound partner's value, the same ones in the same order that pass that predicate in the scan (the SASE engine's
partitioned AIS, per element here: results, their order and every counter but ``join_probes`` are unchanged).

Every early drop is one rule (the note's 1.4 step 3, 1.5 and the out-of-order revision table): an entry x of
element E is dropped when some restriction ``E'.p < E.q`` (or ``<=``) has no possible partner: no buffered E'
entry with a small enough ``p`` *and* no future one (future items have times >= CLOCK - K, so once
``x.q <= CLOCK - K`` no late E' can still end, or begin when E' is punctuated, before x.q).  Li's on-the-fly drop
(``E.te > E'.te``, E' empty), the IBP drops (no predecessor IBP, ``E.te > E'.ts`` with no E' IBP) and the cascading
purge are its instances.  Cascading along RIP after a *window* purge is not done (window purge is keyed on ``ts``,
RIP on ``te``: a RIP child can be alive).

Window purge: a positive entry goes once ``ts + W + K < CLOCK`` (any future result with it contains a future item
ending at >= CLOCK - K, so its span would exceed W).  Immediate purge (an element whose end is after every other
endpoint leaves after its join) only when ``K = 0``.

Results and modes:

* no negation: a result is permanently valid once built; it is emitted at once (``match``; in aggressive mode a
  result built by an out-of-order arrival is an ``add``, IO3's (+)).
* with negation: a result is *final* once no allowed future item can negate it (its negated elements' upper bound
  is at or below ``CLOCK - K``, and no open, unfinished negating interval remains).  Conservative mode holds it
  until then and emits it only if valid: permanently valid output.  Aggressive mode (IO3 real-time) emits at once
  when no buffered negation item hits it, then ``retract`` when a negation item (an IBP counts as an interval
  with an unknown end, i.e. +inf) arrives that hits it, and ``add`` when it becomes valid again (the negating
  interval's end showed it misses the gap), until it is final.
* a *finished* negating interval (both ends known) that hits a result hits it for good: the result is dropped when
  it is built while such an interval is buffered, or when the interval arrives or ends (aggressive mode retracts it
  first if it is out).  The window purge of negating intervals relies on this: a pending result can outlive the
  interval that negates it by more than W + K (an open negating interval holds it, or CLOCK jumps).
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any, Literal

from .events import Interval, IntervalBegin, IntervalError, IntervalOutput, Item, OutputKind, item_time_us
from .query import AttrRef, Constraint, IntervalQuery, NegationSpec, Predicate
from .relations import EndpointRef

__all__ = ["IndexingProfile", "IntervalEngine", "IntervalEngineConfig", "IntervalEngineCounters", "Mode"]

Mode = Literal["conservative", "aggressive"]
IndexingProfile = Literal["naive", "ais", "ibp"]
SNAPSHOT_VERSION = 1
_INF = math.inf


@dataclass(frozen=True, slots=True)
class IntervalEngineConfig:
    """Engine settings.

    ``k_slack_us``: K, the largest lateness of an item behind CLOCK (0: in-order input, Li's chapter 5).
    ``mode``: "conservative" (emit permanently valid results only) or "aggressive" (IO3 real-time factor 1).
    ``indexing``: "naive", "ais" (basic indexing, Algorithm 11) or "ibp" (Algorithm 13).
    ``punctuated_types``: the event types whose begins arrive as IBPs (every interval of such a type is preceded,
    within K, by its IBP).  Needed for IBP indexing and for negations bounded only by their start.
    ``begin_attrs``: the attributes an IBP is trusted to carry with its interval's final value (default none: an
    IBP is trusted only for its type, id and start).  A negated element's condition on any other attribute of an
    open interval is unknown until the interval ends, and is taken as holding until then.
    ``strict``: raise :class:`IntervalError` on a ``too_late`` item instead of reporting it.
    ``key_index``: with ``ais`` and ``ibp``, index each element's buffer by the attributes ``=`` predicates tie to
    another positive element, so that a join probes only the entries with the bound partner's value (off: it
    probes the whole range, as before the index; the same outputs in the same order, more ``join_probes``).
    """

    k_slack_us: int = 0
    mode: Mode = "conservative"
    indexing: IndexingProfile = "ais"
    punctuated_types: frozenset[str] = frozenset()
    begin_attrs: frozenset[str] = frozenset()
    strict: bool = False
    key_index: bool = True

    def __post_init__(self) -> None:
        k = self.k_slack_us
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise IntervalError(f"k_slack_us must be a non-negative integer, got {k!r}")
        if self.mode not in ("conservative", "aggressive"):
            raise IntervalError(f"mode must be 'conservative' or 'aggressive', got {self.mode!r}")
        if self.indexing not in ("naive", "ais", "ibp"):
            raise IntervalError(f"indexing must be 'naive', 'ais' or 'ibp', got {self.indexing!r}")
        if not isinstance(self.begin_attrs, (set, frozenset)) or not all(
                isinstance(a, str) for a in self.begin_attrs):
            raise IntervalError(f"begin_attrs must be a set of attribute names, got {self.begin_attrs!r}")
        if not isinstance(self.key_index, bool):
            raise IntervalError(f"key_index must be a bool, got {self.key_index!r}")


@dataclass(slots=True)
class IntervalEngineCounters:
    """Monotone counters (``buffered`` is a gauge) for metrics and the benchmark."""

    items: int = 0
    intervals: int = 0
    begins: int = 0
    too_late: int = 0
    ignored: int = 0
    """Items of no query type, failing constant predicates, or too long for the window."""
    dropped_on_arrival: int = 0
    """Intervals dropped at once: no possible partner (on-the-fly dropping) or their IBP was dropped."""
    begins_dropped: int = 0
    """IBPs dropped at once (no possible partner for their start)."""
    cascade_purged: int = 0
    window_purged: int = 0
    immediate_purged: int = 0
    joins: int = 0
    join_probes: int = 0
    """Candidate entries examined by joins (a CPU-work proxy independent of the machine)."""
    results_built: int = 0
    matches: int = 0
    adds: int = 0
    retracts: int = 0
    negated_results: int = 0
    """Results with negation dropped for good because a finished negating interval hits them."""
    buffered: int = 0
    peak_buffered: int = 0
    accumulated_buffered: int = 0
    """Sum over interval arrivals of the entries buffered after the arrival (Li's "accumulated memory"; IBP
    arrivals are not sampled, so that streams with and without IBPs are measured at the same points)."""


@dataclass(slots=True)
class _Entry:
    uid: str
    ts: int
    te: int | None
    """None: an IBP entry not filled yet (positive) / an open negating interval (negation, end taken as +inf)."""
    seq: int
    """Arrival number of the item that created or completed the entry (the last one)."""
    order: int
    """Unique creation number: ties on the sort key break on it."""
    attrs: Mapping[str, Any]
    interval: Interval | None

    def value(self, endpoint: str) -> float:
        if endpoint == "ts":
            return self.ts
        return _INF if self.te is None else self.te

    def to_dict(self) -> dict[str, Any]:
        return {"uid": self.uid, "ts": self.ts, "te": self.te, "seq": self.seq, "order": self.order,
                "attrs": dict(self.attrs), "interval": None if self.interval is None else self.interval.to_dict()}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> _Entry:
        iv = d.get("interval")
        return cls(str(d["uid"]), int(d["ts"]), None if d["te"] is None else int(d["te"]), int(d["seq"]),
                   int(d["order"]), dict(d.get("attrs") or {}), None if iv is None else Interval.from_dict(iv))


def _slice(vals: list[int], entries: list[_Entry], lo: float, lo_strict: bool, hi: float,
           hi_strict: bool) -> list[_Entry]:
    """The entries of a sorted run whose key lies within the bounds (the RIP-delimited part of an AIS stack)."""
    i = 0 if lo == -_INF else (bisect.bisect_right(vals, lo) if lo_strict else bisect.bisect_left(vals, lo))
    j = len(vals) if hi == _INF else (bisect.bisect_left(vals, hi) if hi_strict else bisect.bisect_right(vals, hi))
    return entries[i:j] if i < j else []


class _KeyRun:
    """The filled entries of one buffer whose equality attribute has one value, in the buffer's order: sorted on
    the buffer's key, ties in creation order (``_Entry.order``), as the buffer itself is."""

    __slots__ = ("entries", "vals")

    def __init__(self) -> None:
        self.vals: list[int] = []
        self.entries: list[_Entry] = []

    def insert(self, v: int, e: _Entry) -> None:
        vals, entries = self.vals, self.entries
        i = bisect.bisect_right(vals, v)
        # An IBP entry is indexed when its interval fills it, possibly after younger entries with the same key.
        while i and vals[i - 1] == v and entries[i - 1].order > e.order:
            i -= 1
        vals.insert(i, v)
        entries.insert(i, e)

    def remove(self, v: int, e: _Entry) -> None:
        vals, entries = self.vals, self.entries
        i = bisect.bisect_left(vals, v)
        while entries[i] is not e:
            i += 1
        del vals[i]
        del entries[i]


class _Buffer:
    """One element's entries, sorted on its index endpoint (``ts`` or ``te``); equal keys keep creation order.

    ``keys`` indexes the filled entries by the value of each attribute an ``=`` predicate ties to another positive
    element (the key index): ``attr -> value -> _KeyRun``.  An entry is in it iff it is in the buffer, filled, and
    has the attribute; ``unhashable[attr]`` counts those whose value cannot be a dict key (no probe on ``attr``
    can then use the index).

    A ``te``-sorted buffer also keeps its entries sorted on ``ts`` (``by_ts``): the window purge and the cascading
    purge remove entries whose start is small, a prefix in that order (a ``ts``-sorted buffer is its own)."""

    __slots__ = ("by_ts", "by_ts_vals", "endpoint", "entries", "indexed", "keys", "unhashable", "vals")

    def __init__(self, endpoint: str, indexed: bool, key_attrs: Iterable[str] = ()) -> None:
        self.endpoint = endpoint
        self.indexed = indexed
        self.vals: list[int] = []
        self.entries: list[_Entry] = []
        self.by_ts_vals: list[int] = []
        self.by_ts: list[_Entry] = []
        self.keys: dict[str, dict[Any, _KeyRun]] = {a: {} for a in key_attrs}
        self.unhashable: dict[str, int] = dict.fromkeys(self.keys, 0)

    def _val(self, e: _Entry) -> int:
        v = e.ts if self.endpoint == "ts" else e.te
        assert v is not None  # a te-sorted buffer only ever holds filled entries
        return v

    @property
    def min_ts(self) -> float:
        """The smallest start buffered (the window purge skips a buffer whose oldest start is still in)."""
        vals = self.vals if self.endpoint == "ts" else self.by_ts_vals
        return vals[0] if vals else _INF

    def starts_up_to(self, bound: float, strict: bool = False) -> list[_Entry]:
        """The entries with ``ts <= bound`` (``ts < bound`` if strict), in ``ts`` order."""
        vals, entries = (self.vals, self.entries) if self.endpoint == "ts" else (self.by_ts_vals, self.by_ts)
        return entries[:(bisect.bisect_left if strict else bisect.bisect_right)(vals, bound)]

    def clear(self) -> None:
        self.vals, self.entries, self.by_ts_vals, self.by_ts = [], [], [], []
        self.keys = {a: {} for a in self.keys}
        self.unhashable = dict.fromkeys(self.keys, 0)

    def insert(self, e: _Entry) -> None:
        v = self._val(e)
        i = bisect.bisect_right(self.vals, v)
        self.vals.insert(i, v)
        self.entries.insert(i, e)
        if self.endpoint == "te":
            i = bisect.bisect_right(self.by_ts_vals, e.ts)
            self.by_ts_vals.insert(i, e.ts)
            self.by_ts.insert(i, e)
        if e.te is not None:
            self.filled(e)

    def filled(self, e: _Entry) -> None:
        """Index a buffered entry once it is filled (at insertion, or when its interval completes its IBP entry:
        the interval's attributes replace the IBP's)."""
        if not self.keys:
            return
        v = self._val(e)
        for attr, runs in self.keys.items():
            if attr not in e.attrs:
                continue  # "=" on a missing attribute never holds
            try:
                run = runs.get(e.attrs[attr])
            except TypeError:
                self.unhashable[attr] += 1
                continue
            if run is None:
                run = runs[e.attrs[attr]] = _KeyRun()
            run.insert(v, e)

    def _unindex(self, e: _Entry, v: int) -> None:
        for attr, runs in self.keys.items():
            if attr not in e.attrs:
                continue
            try:
                run = runs.get(e.attrs[attr])
            except TypeError:
                self.unhashable[attr] -= 1
                continue
            assert run is not None  # an indexed entry's run exists until its last entry leaves
            run.remove(v, e)
            if not run.entries:
                del runs[e.attrs[attr]]

    def remove(self, e: _Entry) -> bool:
        v = self._val(e)
        i = bisect.bisect_left(self.vals, v)
        while i < len(self.vals) and self.vals[i] == v:
            if self.entries[i] is e:
                del self.vals[i]
                del self.entries[i]
                if self.endpoint == "te":
                    j = bisect.bisect_left(self.by_ts_vals, e.ts)
                    while self.by_ts[j] is not e:
                        j += 1
                    del self.by_ts_vals[j]
                    del self.by_ts[j]
                if e.te is not None and self.keys:
                    self._unindex(e, v)
                return True
            i += 1
        return False

    def key_run(self, attr: str, value: Any) -> tuple[list[int], list[_Entry]] | None:
        """The entries whose ``attr`` equals ``value`` as ``(keys, entries)``, or None when the index cannot
        tell them (an unhashable value on either side: scan the buffer)."""
        if self.unhashable[attr]:
            return None
        try:
            run = self.keys[attr].get(value)
        except TypeError:
            return None
        return ([], []) if run is None else (run.vals, run.entries)

    def range(self, lo: float, lo_strict: bool, hi: float, hi_strict: bool,
              run: tuple[list[int], list[_Entry]] | None = None) -> list[_Entry]:
        """Entries (of ``run``, a key run, when given) whose key lies within the bounds."""
        vals, entries = run if run is not None else (self.vals, self.entries)
        if not self.indexed:
            return entries
        return _slice(vals, entries, lo, lo_strict, hi, hi_strict)

    def __len__(self) -> int:
        return len(self.entries)


@dataclass(slots=True)
class _Pending:
    """A built result with negation: held (conservative) or tracked for compensation (aggressive)."""

    binding: dict[str, _Entry]
    emitted: bool = False


@dataclass(frozen=True, slots=True)
class _Check:
    """``left_alias.left_ep op right_alias.right_ep``, evaluated on two bound entries."""

    left_alias: str
    left_ep: str
    strict: bool
    right_alias: str
    right_ep: str
    equal: bool = False


def _implies(c: _Check, d: _Check) -> bool:
    """``c`` holding implies ``d``, both between the same two elements, through each one's own ``ts <= te``."""
    if c.equal or d.equal or c is d or (c.left_alias, c.right_alias) != (d.left_alias, d.right_alias):
        return False
    left_ok = c.left_ep == d.left_ep or (d.left_ep == "ts" and c.left_ep == "te")  # d.left <= c.left
    right_ok = c.right_ep == d.right_ep or (c.right_ep == "ts" and d.right_ep == "te")  # c.right <= d.right
    return left_ok and right_ok and (c.strict or not d.strict) and (c.strict, c.left_ep, c.right_ep) != (
        d.strict, d.left_ep, d.right_ep)


def _essential(checks: list[_Check]) -> list[_Check]:
    """The checks a join must evaluate once both elements are bound: those no other one implies (bound entries
    are complete intervals, ``ts <= te``).  ``a.te < b.ts`` alone stands for the four inferred restrictions
    between a and b; the others only narrow the binary search (:meth:`IntervalEngine._candidates`)."""
    return [d for d in checks if not any(_implies(c, d) for c in checks)]


def _begin_predicates(
    query: IntervalQuery, begin_attrs: frozenset[str]
) -> tuple[dict[str, tuple[Predicate, ...]], dict[str, tuple[Predicate, ...]]]:
    """The predicates of each negated element an IBP can decide, (constant, cross): those reading only trusted
    attributes of it."""
    constant: dict[str, tuple[Predicate, ...]] = {}
    cross: dict[str, tuple[Predicate, ...]] = {}
    for spec in query.negations:
        def trusted(p: Predicate, alias: str = spec.alias) -> bool:
            refs = [p.left, *([p.right] if isinstance(p.right, AttrRef) else [])]
            return all(r.attr in begin_attrs for r in refs if r.alias == alias)
        constant[spec.alias] = tuple(p for p in spec.constant_predicates if trusted(p))
        cross[spec.alias] = tuple(p for p in spec.cross_predicates if trusted(p))
    return constant, cross


def _check_item(item: object, kind: type[Item], entry_point: str, instead: str) -> None:
    """Each entry point takes one kind of item: the error says where the other kind goes."""
    if not isinstance(item, kind):
        raise IntervalError(f"{entry_point} takes an {kind.__name__}, got {type(item).__name__} "
                            f"({instead}; on_item takes either)")


def _require_negation_bounds(query: IntervalQuery, punctuated_types: frozenset[str]) -> None:
    """A negated element whose end is unbounded above could negate any result at any later time."""
    for spec in query.negations:
        if not spec.end_upper_bounds and not (
                spec.start_upper_bounds and spec.event_type in punctuated_types):
            raise IntervalError(
                f"!{spec.alias} has no upper bound on its end (e.g. {spec.alias}.te < C.ts), and its start bound "
                f"needs {spec.event_type} in punctuated_types: no result could ever be declared valid")


class IntervalEngine:
    """ISEQ over a K-bounded out-of-order stream of intervals and IBPs."""

    def __init__(self, query: IntervalQuery, config: IntervalEngineConfig | None = None) -> None:
        self.query = query
        self.config = config or IntervalEngineConfig()
        cfg = self.config
        self.counters = IntervalEngineCounters()
        self._k = cfg.k_slack_us
        self._w = query.window_us
        self._clock: int | None = None
        self._seq = -1
        self._order = 0
        self._naive = cfg.indexing == "naive"
        tracked = cfg.indexing == "ibp"
        # -- indexed path: longest chain of endpoints of distinct elements linked by strict restrictions ---------
        allowed: list[EndpointRef] = [EndpointRef(a, "te") for a in query.positives]
        if tracked:
            allowed += [EndpointRef(a, "ts") for a in query.positives
                        if query.by_alias[a].event_type in cfg.punctuated_types]
        self.indexed_path: tuple[EndpointRef, ...] = () if self._naive else self._longest_chain(allowed)
        on_path = {ep.alias: ep.endpoint for ep in self.indexed_path}
        self._begins_tracked: frozenset[str] = frozenset(a for a, ep in on_path.items() if ep == "ts")
        self._equal_keys: dict[str, tuple[tuple[str, str, str], ...]] = {
            a: () if self._naive or not cfg.key_index else self._equality_keys(a) for a in query.positives}
        """alias -> (its attribute, other positive alias, that one's attribute) per ``=`` predicate between them."""
        self._buffers: dict[str, _Buffer] = {
            a: _Buffer(on_path.get(a, "te"), a in on_path, dict.fromkeys(k[0] for k in self._equal_keys[a]))
            for a in query.positives}
        self._neg: dict[str, list[_Entry]] = {a: [] for a in query.negatives}
        self._begin_constant, self._begin_cross = _begin_predicates(query, cfg.begin_attrs)
        _require_negation_bounds(query, cfg.punctuated_types)
        # -- restrictions ----------------------------------------------------------------------------------------
        self._checks: dict[tuple[str, str], list[_Check]] = {
            (a, b): self._pair_checks(a, b) for a in query.positives for b in query.positives if a != b}
        self._verify: dict[tuple[str, str], list[_Check]] = {
            pair: _essential(checks) for pair, checks in self._checks.items()}
        self._equal_links: dict[tuple[str, str], bool] = {
            (a, b): any(p.op == "=" and p.aliases() == {a, b} for p in query.cross_predicates)
            for a in query.positives for b in query.positives if a != b}
        self._self_constraints: dict[str, list[Constraint]] = {
            a: [c for c in query.positive_constraints if c.left.alias == c.right.alias == a] for a in query.positives}
        self._partners, self._skip_trigger, self._last_end = self._endpoint_roles()
        self._join_orders: dict[str, list[str]] = {a: self._join_order(a) for a in query.positives}
        # -- dynamic state ---------------------------------------------------------------------------------------
        self._open: dict[str, dict[str, _Entry]] = {}
        """uid -> alias -> unfilled entry (positive IBP entries and open negating intervals)."""
        self._dropped_begins: dict[tuple[str, str], int] = {}
        """(alias, uid) -> ts of IBPs dropped early: their interval is dropped on arrival."""
        self._seen_complete: dict[str, int] = {}
        """uid -> ts of intervals already arrived: their late IBP is ignored."""
        self._expiry: list[tuple[int, str, str]] = []
        """Heap of (ts, alias or "", uid) over both maps above: purged in ts order, not by rescanning them."""
        self._pending: dict[tuple[str, ...], _Pending] = {}
        self._purged = False

    # ------------------------------------------------------------------------------------------------ compile --
    def _longest_chain(self, allowed: list[EndpointRef]) -> tuple[EndpointRef, ...]:
        closure = self.query.closure
        nodes = sorted(allowed, key=lambda x: sum(1 for y in allowed if closure.relation(y, x) == "<"))
        best: dict[EndpointRef, tuple[EndpointRef, ...]] = {}
        for x in nodes:
            chain: tuple[EndpointRef, ...] = (x,)
            for y in nodes:
                if (y in best and closure.relation(y, x) == "<" and x.alias not in {z.alias for z in best[y]}
                        and len(best[y]) + 1 > len(chain)):
                    chain = (*best[y], x)
            best[x] = chain
        return max(best.values(), key=len, default=())

    def _equality_keys(self, alias: str) -> tuple[tuple[str, str, str], ...]:
        keys: list[tuple[str, str, str]] = []
        for p in self.query.cross_predicates:
            if p.op != "=" or not isinstance(p.right, AttrRef):
                continue
            if p.left.alias == alias:
                keys.append((p.left.attr, p.right.alias, p.right.attr))
            elif p.right.alias == alias:
                keys.append((p.right.attr, p.left.alias, p.left.attr))
        return tuple(keys)

    def _endpoint_roles(
        self,
    ) -> tuple[dict[str, list[tuple[str, str, bool, str]]], dict[str, bool], dict[str, bool]]:
        """Per positive element a, from the closure of the TList:

        * partners[a]: (b, p, strict, q): b.p < a.q (or <=) is required; p observable (te, or ts of a tracked b);
        * skip_trigger[a]: a.te < b.x strictly for another element: a later arrival completes every result with a;
        * last_end[a]: a.te > every endpoint of every other element (immediate purge after the join, K = 0)."""
        positives = self.query.positives
        closure = self.query.closure
        partners: dict[str, list[tuple[str, str, bool, str]]] = {a: [] for a in positives}
        skip_trigger: dict[str, bool] = {}
        last_end: dict[str, bool] = {}
        for a in positives:
            a_te = EndpointRef(a, "te")
            skip = False
            last = len(positives) > 1
            for b in positives:
                if b == a:
                    continue
                for p in ("ts", "te"):
                    bp = EndpointRef(b, p)
                    if closure.relation(a_te, bp) == "<":
                        skip = True
                    if closure.relation(bp, a_te) != "<":
                        last = False
                    if p == "te" or b in self._begins_tracked:
                        for q in ("ts", "te"):
                            r = closure.relation(bp, EndpointRef(a, q))
                            if r is not None:
                                partners[a].append((b, p, r == "<", q))
            skip_trigger[a] = skip
            last_end[a] = last
        return partners, skip_trigger, last_end

    def _pair_checks(self, a: str, b: str) -> list[_Check]:
        """Restrictions between a (being bound) and b (bound): inferred ones, or only given ones when naive."""
        out: list[_Check] = []
        if self._naive:
            for c in self.query.positive_constraints:
                if {c.left.alias, c.right.alias} == {a, b}:
                    out.append(_Check(c.left.alias, c.left.endpoint, c.op == "<", c.right.alias, c.right.endpoint,
                                      c.op == "="))
            return out
        for x in ("ts", "te"):
            for y in ("ts", "te"):
                ax, by = EndpointRef(a, x), EndpointRef(b, y)
                r1 = self.query.closure.relation(ax, by)
                if r1 is not None:
                    out.append(_Check(a, x, r1 == "<", b, y))
                r2 = self.query.closure.relation(by, ax)
                if r2 is not None:
                    out.append(_Check(b, y, r2 == "<", a, x))
        return out

    def _join_order(self, first: str) -> list[str]:
        """The naive evaluator's fixed nested-loop order: the most constrained element next."""
        order = [first]
        rest = [a for a in self.query.positives if a != first]
        while rest:
            def score(a: str) -> tuple[int, int, int]:
                links = sum(len(self._checks[(a, b)]) for b in order)
                return (1 if self._buffers[a].indexed else 0, links, -self.query.positives.index(a))
            nxt = max(rest, key=score)
            order.append(nxt)
            rest.remove(nxt)
        return order

    # ------------------------------------------------------------------------------------------------- public --
    @property
    def clock_us(self) -> int | None:
        """CLOCK: the largest item time seen (None before the first item)."""
        return self._clock

    def buffer_contents(self) -> dict[str, list[tuple[str, int, int | None]]]:
        """``alias -> [(id, ts, te or None while only the begin is known)]`` for every element (tests, debugging)."""
        out = {a: [(e.uid, e.ts, e.te) for e in b.entries] for a, b in self._buffers.items()}
        out.update({a: [(e.uid, e.ts, e.te) for e in lst] for a, lst in self._neg.items()})
        return out

    @property
    def pending_count(self) -> int:
        """Results with negation not final yet (held in conservative mode, tracked in aggressive mode)."""
        return len(self._pending)

    def on_item(self, item: Item) -> list[IntervalOutput]:
        """Process one arriving interval or IBP; return the output records it caused."""
        if isinstance(item, IntervalBegin):
            return self.on_begin(item)
        return self.on_interval(item)

    def feed(self, items: Iterable[Item]) -> list[IntervalOutput]:
        out: list[IntervalOutput] = []
        for item in items:
            out += self.on_item(item)
        return out

    def on_interval(self, interval: Interval) -> list[IntervalOutput]:
        """Process one arriving (ended) interval; an IBP goes to :meth:`on_begin` (or :meth:`on_item`)."""
        _check_item(interval, Interval, "on_interval", "an IntervalBegin goes to on_begin")
        out: list[IntervalOutput] = []
        in_order = self._arrive(interval, out)
        if in_order is None:
            return out
        self.counters.intervals += 1
        q = self.query
        uid = interval.event_id if interval.event_id is not None else f"#{self._seq}"
        self._seen_complete[uid] = interval.start_ts_us
        heapq.heappush(self._expiry, (interval.start_ts_us, "", uid))
        aliases = q.aliases_of_type(interval.event_type)
        if not aliases:
            self.counters.ignored += 1
        opened = self._open.pop(uid, {})
        removed = False
        for alias in aliases:
            entry = opened.get(alias)
            if alias in self._neg:
                self._negation_interval(alias, interval, uid, entry, out)
            elif self._insert_and_join(alias, interval, uid, opened, in_order, out):
                removed = True
        self._after(removed, out)
        self.counters.accumulated_buffered += self.counters.buffered
        return out

    def _insert_and_join(self, alias: str, interval: Interval, uid: str, opened: dict[str, _Entry], in_order: bool,
                         out: list[IntervalOutput]) -> bool:
        """An ended interval as positive element ``alias``: fill its IBP entry or insert it, unless an early-drop
        rule applies, and trigger the join.  Returns whether a buffer lost an entry (only a buffer that changed
        can leave other entries without a partner)."""
        entry = opened.get(alias)
        if interval.length_us >= self._w or not self._admit(alias, interval.attrs, interval):
            self.counters.ignored += 1
            if entry is not None:
                self._buffers[alias].remove(entry)
                self._gauge(-1)
                return True
            return False
        if (alias, uid) in self._dropped_begins:
            self.counters.dropped_on_arrival += 1
            return False
        if entry is not None:
            entry.te = interval.end_ts_us
            entry.seq = self._seq
            entry.interval = interval
            entry.attrs = interval.attrs
            self._buffers[alias].filled(entry)
        else:
            entry = self._new_entry(uid, interval.start_ts_us, interval.end_ts_us, interval.attrs, interval)
        if not self._naive and self._no_partner(alias, entry):
            self.counters.dropped_on_arrival += 1
            if alias in opened:
                self._buffers[alias].remove(entry)
                self._gauge(-1)
                return True
            return False
        if alias not in opened:
            self._buffers[alias].insert(entry)
            self._gauge(1)
        if self._naive or not in_order or not self._skip_trigger[alias]:
            self._join(alias, entry, in_order, out)
        if not self._naive and self._k == 0 and self._last_end[alias]:
            self._buffers[alias].remove(entry)
            self._gauge(-1)
            self.counters.immediate_purged += 1
            return True
        return False

    def on_begin(self, begin: IntervalBegin) -> list[IntervalOutput]:
        """Process one arriving IBP (an interval's begin punctuation)."""
        _check_item(begin, IntervalBegin, "on_begin", "an Interval goes to on_interval")
        out: list[IntervalOutput] = []
        if self._arrive(begin, out) is None:
            return out
        self.counters.begins += 1
        uid = begin.event_id
        removed = False
        if uid not in self._seen_complete:
            for alias in self.query.aliases_of_type(begin.event_type):
                if alias in self._neg:
                    # Only the attributes an IBP is trusted for may rule the open interval out: any other
                    # condition is decided by the interval's own attributes at its end (issue 25.1).
                    if all(p.holds({alias: begin.attrs}) for p in self._begin_constant[alias]):
                        entry = self._new_entry(uid, begin.start_ts_us, None, begin.attrs, None)
                        self._neg[alias].append(entry)
                        self._gauge(1)
                        self._open.setdefault(uid, {})[alias] = entry
                        self._negation_arrived(alias, entry, out)
                    continue
                if alias not in self._begins_tracked:
                    continue
                entry = self._new_entry(uid, begin.start_ts_us, None, begin.attrs, None)
                if self._no_partner(alias, entry):
                    self._dropped_begins[(alias, uid)] = begin.start_ts_us
                    heapq.heappush(self._expiry, (begin.start_ts_us, alias, uid))
                    self.counters.begins_dropped += 1
                    continue
                self._buffers[alias].insert(entry)
                self._gauge(1)
                self._open.setdefault(uid, {})[alias] = entry
        else:
            self.counters.ignored += 1
        self._after(removed, out)
        return out

    def advance_clock(self, ts_us: int) -> list[IntervalOutput]:
        """A punctuation / heartbeat: no later item has a time below ``ts_us - K``.  Purges and releases."""
        out: list[IntervalOutput] = []
        if self._clock is None or ts_us > self._clock:
            self._clock = ts_us
            self._purge()
            self._after(True, out)
        return out

    def finish(self) -> list[IntervalOutput]:
        """End of stream: every pending result is final (released if valid, forgotten in aggressive mode)."""
        out: list[IntervalOutput] = []
        for key in list(self._pending):
            self._finalize(key, out)
        return out

    # ---------------------------------------------------------------------------------------------- internals --
    def _arrive(self, item: Item, out: list[IntervalOutput]) -> bool | None:
        """Count, check the K contract, advance CLOCK and purge.  None: rejected; else whether it is in order."""
        self._seq += 1
        self.counters.items += 1
        t = item_time_us(item)
        clock = self._clock
        if clock is not None and t < clock - self._k:
            self.counters.too_late += 1
            if self.config.strict:
                raise IntervalError(f"item at {t} is more than K={self._k} behind CLOCK={clock}")
            out.append(IntervalOutput("too_late", (), clock, self._seq, -1, item))
            return None
        in_order = clock is None or t >= clock
        if clock is None or t > clock:
            self._clock = t
            self._purge()
        return in_order

    def _after(self, removed: bool, out: list[IntervalOutput]) -> None:
        if not self._naive and (removed or self._purged or self._k > 0):
            self._cascade()
        self._purged = False
        if self._pending:
            for key in [k for k, p in self._pending.items() if self._final(p.binding)]:
                self._finalize(key, out)

    def _gauge(self, delta: int) -> None:
        c = self.counters
        c.buffered += delta
        c.peak_buffered = max(c.peak_buffered, c.buffered)

    def _new_entry(self, uid: str, ts: int, te: int | None, attrs: Mapping[str, Any],
                   interval: Interval | None) -> _Entry:
        self._order += 1
        return _Entry(uid, ts, te, self._seq, self._order, attrs, interval)

    def _admit(self, alias: str, attrs: Mapping[str, Any], interval: Interval) -> bool:
        if not all(p.holds({alias: attrs}) for p in self.query.constant_predicates[alias]):
            return False
        if not all(p.holds({alias: attrs}) for p in self.query.self_predicates if p.left.alias == alias):
            return False
        values = {EndpointRef(alias, "ts"): float(interval.start_ts_us), EndpointRef(alias, "te"):
                  float(interval.end_ts_us)}
        return all(c.holds(values) for c in self._self_constraints[alias])

    def _spec(self, alias: str) -> NegationSpec:
        return next(s for s in self.query.negations if s.alias == alias)

    # -- early drops ------------------------------------------------------------------------------------------
    def _horizon(self) -> int:
        """CLOCK - K: no future item has a time below it."""
        assert self._clock is not None
        return self._clock - self._k

    def _min_value(self, alias: str, endpoint: str) -> float:
        buf = self._buffers[alias]
        if buf.endpoint == endpoint:
            return buf.vals[0] if buf.vals else _INF
        if endpoint == "ts":
            return buf.min_ts
        return min((e.value(endpoint) for e in buf.entries), default=_INF)

    def _no_partner(self, alias: str, entry: _Entry, mins: dict[tuple[str, str], float] | None = None) -> bool:
        horizon = self._horizon()
        for b, p, strict, q in self._partners[alias]:
            if q == "te" and entry.te is None:
                continue
            v = entry.value(q)
            # A future b item has p >= horizon: it misses "b.p < v" once v <= horizon ("<=": once v < horizon).
            if v > horizon or (not strict and v == horizon):
                continue
            m = mins[(b, p)] if mins is not None else self._min_value(b, p)
            if m > v or (strict and m == v):
                return True
        return False

    def _cascade(self) -> None:
        """Cascading purge to a fixpoint: entries left without a possible partner go.  Restriction ``b.p < x.q``
        dooms x only if ``x.q <= min(horizon, min b.p)``, and ``x.ts <= x.q``: only the entries whose start is at
        most the largest of those bounds are checked, a prefix of the buffer in start order."""
        changed = True
        while changed:
            changed = False
            mins: dict[tuple[str, str], float] = {}
            for partners in self._partners.values():
                for b, p, _s, _q in partners:
                    if (b, p) not in mins:
                        mins[(b, p)] = self._min_value(b, p)
            for a, partners in self._partners.items():
                if not partners or not self._may_doom(a, mins):
                    continue
                buf = self._buffers[a]
                horizon = self._horizon()
                limit = max(min(horizon, mins[(b, p)]) for b, p, _s, _q in partners)
                doomed = [e for e in buf.starts_up_to(limit) if self._no_partner(a, e, mins)]
                for e in doomed:
                    buf.remove(e)
                    self._forget_open(a, e)
                    self._gauge(-1)
                    self.counters.cascade_purged += 1
                    changed = True

    def _may_doom(self, alias: str, mins: dict[tuple[str, str], float]) -> bool:
        """Whether :meth:`_no_partner` can hold for some entry of ``alias``: an entry x goes by restriction
        ``b.p < x.q`` iff ``x.q <= min(horizon, min b.p)`` (``<`` for ``<=``), so iff the smallest ``q`` of the
        buffer does.  Skipping the scan otherwise keeps the cascade's cost per item at the number of
        restrictions when nothing goes (it ran after every window purge, i.e. after nearly every item)."""
        horizon = self._horizon()
        for b, p, strict, q in self._partners[alias]:
            bound = min(horizon, mins[(b, p)])
            v = self._min_value(alias, q)
            if v < bound or (strict and v == bound):
                return True
        return False

    def _forget_open(self, alias: str, e: _Entry) -> None:
        if e.te is None:
            per = self._open.get(e.uid)
            if per is not None:
                per.pop(alias, None)
                if not per:
                    del self._open[e.uid]
            self._dropped_begins[(alias, e.uid)] = e.ts
            heapq.heappush(self._expiry, (e.ts, alias, e.uid))

    def _purge(self) -> None:
        """Window purge: ``x.ts + W + K < CLOCK`` (IO3's K-ISlack purge, Li's Algorithm 9 with t -> ts).

        Sets ``_purged`` so that the cascading purge runs after the arrival (an emptied buffer may leave
        entries of other elements without a possible partner)."""
        assert self._clock is not None
        bound = self._clock - self._k - self._w  # purge x iff x.ts < bound
        for alias, buf in self._buffers.items():
            if buf.min_ts >= bound:
                continue
            for e in buf.starts_up_to(bound, strict=True):
                buf.remove(e)
                self._forget_open(alias, e)
                self._gauge(-1)
                self.counters.window_purged += 1
                self._purged = True
        # A negating interval ending before bound ends before every endpoint of any result built from now on (its
        # newest member ends at >= CLOCK - K, so every member starts after bound), and the end of a negated element
        # is bounded below by a positive endpoint: it cannot hit such a result.  Results already built and still
        # pending may be older: a finished negating interval that hits one killed it when it arrived or ended
        # (_kill), so nothing depends on it any more.
        for alias, lst in self._neg.items():
            keep = [e for e in lst if e.te is None or e.te >= bound]
            self._gauge(len(keep) - len(lst))
            self.counters.window_purged += len(lst) - len(keep)
            self._neg[alias] = keep
        expiry = self._expiry
        while expiry and expiry[0][0] < bound:
            _ts, alias, uid = heapq.heappop(expiry)
            if alias:
                self._dropped_begins.pop((alias, uid), None)
            else:
                self._seen_complete.pop(uid, None)

    # -- join -------------------------------------------------------------------------------------------------
    def _join(self, alias: str, entry: _Entry, in_order: bool, out: list[IntervalOutput]) -> None:
        self.counters.joins += 1
        if self._naive:
            order = self._join_orders[alias]
        else:
            rest = [a for a in self.query.positives if a != alias]
            if any(not self._buffers[a].entries for a in rest):
                return  # an empty buffer ends the join at once
            order = [alias]
            while rest:
                nxt = min(rest, key=lambda a: self._join_rank(a, order))
                order.append(nxt)
                rest.remove(nxt)
        binding: dict[str, _Entry] = {alias: entry}
        assert entry.te is not None
        self._extend(order, 1, binding, entry.ts, entry.te, in_order, out)

    def _join_rank(self, alias: str, bound: list[str]) -> tuple[bool, bool, int]:
        """The DFS order is chosen per join, fail fast: first an element restricted by those already bound, among
        them one an equality predicate ties to a bound one, then the fewest entries.  Without the equality rank
        the join of ``ISEQ[a.te < b.ts AND b.te < c.ts](A a, B b, C c) WHERE a.id = b.id AND b.id = c.id`` from c
        bound a next (a.te < c.ts is inferred, and A's buffer was the smaller), which no predicate ties to c: every
        A in the window times every B in it, all but a few then failing ``a.id = b.id``."""
        equal = any(self._equal_links[(alias, b)] for b in bound)
        linked = equal or any(self._checks[(alias, b)] for b in bound)
        return (not linked, not equal, len(self._buffers[alias].entries))

    def _extend(self, order: list[str], depth: int, binding: dict[str, _Entry], min_ts: int, max_te: int,
                in_order: bool, out: list[IntervalOutput]) -> None:
        if depth == len(order):
            self._emit_result(dict(binding), in_order, out)
            return
        alias = order[depth]
        w = self._w
        checks = [(b, self._checks[(alias, b)]) for b in order[:depth]]
        verify = [(b, self._verify[(alias, b)]) for b in order[:depth]]
        used = {e.uid for e in binding.values()}
        cross = [p for p in self.query.cross_predicates
                 if alias in p.aliases() and all(a in binding or a == alias for a in p.aliases())]
        for cand in self._candidates(alias, checks, binding, min_ts, max_te):
            self.counters.join_probes += 1
            te = cand.te
            if te is None or cand.uid in used:
                continue  # unfilled IBP entry (the interval will trigger at its end) / one interval, one role
            new_min = min(min_ts, cand.ts)
            new_max = max(max_te, te)
            if new_max - new_min >= w:
                continue
            ok = True
            for b, cs in verify:
                be = binding[b]
                for c in cs:
                    left = cand if c.left_alias == alias else be
                    right = be if c.left_alias == alias else cand
                    lv, rv = left.value(c.left_ep), right.value(c.right_ep)
                    if not (lv == rv if c.equal else lv < rv if c.strict else lv <= rv):
                        ok = False
                        break
                if not ok:
                    break
            if not ok:
                continue
            if cross:
                binding[alias] = cand
                attrs = {a: e.attrs for a, e in binding.items()}
                ok = all(p.holds(attrs) for p in cross)
                del binding[alias]
                if not ok:
                    continue
            binding[alias] = cand
            self._extend(order, depth + 1, binding, new_min, new_max, in_order, out)
            del binding[alias]

    def _candidates(self, alias: str, checks: list[tuple[str, list[_Check]]], binding: Mapping[str, _Entry],
                    min_ts: int, max_te: int) -> list[_Entry]:
        """The entries of ``alias`` its bound neighbours and the window allow: on an indexed buffer, the range
        Li's RIP pointers delimit, found by binary search; otherwise the whole buffer.  With the key index, the
        same of only the entries with a bound neighbour's value, in the same order."""
        buf = self._buffers[alias]
        lo, lo_strict, hi, hi_strict = -_INF, False, _INF, False
        if buf.indexed:
            key_ep = buf.endpoint
            for b, cs in checks:
                be = binding[b]
                for c in cs:
                    if c.left_alias == alias and c.left_ep == key_ep:  # alias.key op b.x: upper bound
                        v = be.value(c.right_ep)
                        if v < hi or (v == hi and c.strict):
                            hi, hi_strict = v, c.strict
                    elif c.right_alias == alias and c.right_ep == key_ep:  # b.x op alias.key: lower bound
                        v = be.value(c.left_ep)
                        if v > lo or (v == lo and c.strict):
                            lo, lo_strict = v, c.strict
            # The window: every member ends before min_ts + W and starts after max_te - W.
            w = self._w
            if key_ep == "te":
                if min_ts + w < hi or (min_ts + w == hi and not hi_strict):
                    hi, hi_strict = min_ts + w, True
            elif max_te - w > lo or (max_te - w == lo and not lo_strict):
                lo, lo_strict = max_te - w, True
        # The key index: only the entries with a bound partner's value of an "=" attribute can pass it; of
        # several such predicates, the one with the fewest entries.
        run: tuple[list[int], list[_Entry]] | None = None
        for attr, b, b_attr in self._equal_keys[alias]:
            partner = binding.get(b)
            if partner is None:
                continue
            if b_attr not in partner.attrs:
                return []  # "=" on a missing attribute never holds
            r = buf.key_run(attr, partner.attrs[b_attr])
            if r is not None and (run is None or len(r[1]) < len(run[1])):
                run = r
        return buf.range(lo, lo_strict, hi, hi_strict, run)

    # -- results, negation, compensation ----------------------------------------------------------------------
    def _key(self, binding: Mapping[str, _Entry]) -> tuple[str, ...]:
        return tuple(binding[a].uid for a in self.query.positives)

    def _output(self, kind: OutputKind, binding: Mapping[str, _Entry], out: list[IntervalOutput],
                cause: Item | None = None) -> None:
        members: list[Interval] = []
        for a in self.query.positives:
            iv = binding[a].interval
            assert iv is not None  # joins bind filled entries only
            members.append(iv)
        clock = self._clock if self._clock is not None else 0
        out.append(IntervalOutput(kind, tuple(members), clock, self._seq, max(e.seq for e in binding.values()), cause))
        c = self.counters
        if kind == "match":
            c.matches += 1
        elif kind == "add":
            c.adds += 1
        elif kind == "retract":
            c.retracts += 1

    def _emit_result(self, binding: dict[str, _Entry], in_order: bool, out: list[IntervalOutput]) -> None:
        self.counters.results_built += 1
        aggressive = self.config.mode == "aggressive"
        if not self.query.negations:
            self._output("add" if aggressive and not in_order else "match", binding, out)
            return
        if self._killed(binding):
            self.counters.negated_results += 1
            return  # a finished negating interval hits it: never valid, nothing to track
        pending = _Pending(binding)
        key = self._key(binding)
        self._pending[key] = pending
        if aggressive and not self._negated(binding):
            pending.emitted = True
            self._output("match" if in_order else "add", binding, out)
        if self._final(binding):
            self._finalize(key, out)

    def _hits(self, spec: NegationSpec, binding: Mapping[str, _Entry], d: _Entry) -> bool:
        values: dict[EndpointRef, float] = {}
        for a, e in binding.items():
            values[EndpointRef(a, "ts")] = e.ts
            values[EndpointRef(a, "te")] = e.value("te")
        values[EndpointRef(spec.alias, "ts")] = d.ts
        values[EndpointRef(spec.alias, "te")] = d.value("te")  # an open interval's end is unknown: +inf
        if not all(c.holds(values) for c in spec.constraints):
            return False
        # An open interval (known by its IBP) is judged only on the attributes its IBP is trusted for; the others
        # are unknown until its end and taken as hitting, like its end (issue 25.1).
        cross = spec.cross_predicates if d.te is not None else self._begin_cross[spec.alias]
        if cross:
            attrs = {a: e.attrs for a, e in binding.items()}
            attrs[spec.alias] = d.attrs
            return all(p.holds(attrs) for p in cross)
        return True

    def _negated(self, binding: Mapping[str, _Entry]) -> bool:
        return any(self._hits(spec, binding, d) for spec in self.query.negations for d in self._neg[spec.alias])

    def _killed(self, binding: Mapping[str, _Entry]) -> bool:
        """A buffered *finished* negating interval hits the result: every endpoint involved is known, so the hit
        is permanent (an open one's end is only taken as +inf and may still miss)."""
        return any(d.te is not None and self._hits(spec, binding, d)
                   for spec in self.query.negations for d in self._neg[spec.alias])

    def _kill(self, spec: NegationSpec, d: _Entry, cause: Item, out: list[IntervalOutput]) -> None:
        """The finished negating interval ``d`` arrived or ended: every pending result it hits is invalid for
        good.  It is forgotten at once (aggressive mode retracts it first if it is out), so that no later window
        purge of ``d`` can make it look valid again."""
        assert d.te is not None
        for key in [k for k, p in self._pending.items() if self._hits(spec, p.binding, d)]:
            p = self._pending.pop(key)
            if p.emitted:
                self._output("retract", p.binding, out, cause)
            self.counters.negated_results += 1

    def _final(self, binding: Mapping[str, _Entry]) -> bool:
        """No allowed future item can change whether a negated element hits this result."""
        if self._clock is None:
            return False
        horizon = self._horizon()
        for spec in self.query.negations:
            ok = any(binding[p.alias].value(p.endpoint) < horizon or (r == "<" and
                     binding[p.alias].value(p.endpoint) == horizon) for p, r in spec.end_upper_bounds)
            if not ok and spec.event_type in self.config.punctuated_types:
                bounds = [(binding[p.alias].value(p.endpoint), r) for p, r in spec.start_upper_bounds]
                ok = any(v < horizon or (r == "<" and v == horizon) for v, r in bounds) and not any(
                    d.te is None and any(d.ts < v or (r == "<=" and d.ts == v) for v, r in bounds)
                    for d in self._neg[spec.alias])
            if not ok:
                return False
        return True

    def _finalize(self, key: tuple[str, ...], out: list[IntervalOutput]) -> None:
        pending = self._pending.pop(key)
        if self.config.mode == "conservative" and not self._negated(pending.binding):
            self._output("match", pending.binding, out)

    def _negation_arrived(self, alias: str, d: _Entry, out: list[IntervalOutput]) -> None:
        """A new negating item: a finished interval kills the pending results it hits; an open one (an IBP) only
        retracts them in aggressive mode (its end may still show that it misses)."""
        spec = self._spec(alias)
        if d.te is not None:
            assert d.interval is not None
            self._kill(spec, d, d.interval, out)
            return
        if self.config.mode != "aggressive":
            return
        for p in self._pending.values():
            if p.emitted and self._hits(spec, p.binding, d):
                p.emitted = False
                self._output("retract", p.binding, out, d.interval or self._begin_of(alias, d))

    def _begin_of(self, alias: str, d: _Entry) -> IntervalBegin:
        return IntervalBegin(self.query.by_alias[alias].event_type, d.ts, d.uid, d.attrs)

    def _negation_interval(self, alias: str, interval: Interval, uid: str, entry: _Entry | None,
                           out: list[IntervalOutput]) -> None:
        spec = self._spec(alias)
        if entry is None:
            if not all(p.holds({alias: interval.attrs}) for p in spec.constant_predicates):
                return
            entry = self._new_entry(uid, interval.start_ts_us, interval.end_ts_us, interval.attrs, interval)
            self._neg[alias].append(entry)
            self._gauge(1)
            self._negation_arrived(alias, entry, out)
            return
        # An open negating interval ends.  Its end was taken as +inf: results it hit through a lower bound on the
        # end may be valid again, results it missed through an upper bound on the end may be hit now.
        entry.te = interval.end_ts_us
        entry.interval = interval
        entry.attrs = interval.attrs  # the reference judges the interval's attributes, not its IBP's
        entry.seq = self._seq
        if not all(p.holds({alias: interval.attrs}) for p in spec.constant_predicates):
            self._neg[alias].remove(entry)
            self._gauge(-1)
        else:
            self._kill(spec, entry, interval, out)
        if self.config.mode == "aggressive":
            for p in self._pending.values():
                valid = not self._negated(p.binding)
                if valid != p.emitted:
                    p.emitted = valid
                    self._output("add" if valid else "retract", p.binding, out, interval)

    # ------------------------------------------------------------------------------------------- snapshots --
    def export_state(self) -> dict[str, Any]:
        """The engine's complete dynamic state as plain data (JSON/msgpack-safe)."""
        return {
            "version": SNAPSHOT_VERSION,
            "window_us": self._w,
            "clock": self._clock,
            "seq": self._seq,
            "order": self._order,
            "buffers": {a: [e.to_dict() for e in b.entries] for a, b in self._buffers.items()},
            "negation": {a: [e.to_dict() for e in lst] for a, lst in self._neg.items()},
            "dropped_begins": [[a, u, ts] for (a, u), ts in self._dropped_begins.items()],
            "seen_complete": dict(self._seen_complete),
            "pending": [{"binding": {a: e.to_dict() for a, e in p.binding.items()}, "emitted": p.emitted}
                        for p in self._pending.values()],
            "counters": asdict(self.counters),
        }

    def import_state(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`export_state` output into this (freshly built, same query and config) engine."""
        if state.get("version") != SNAPSHOT_VERSION or state.get("window_us") != self._w:
            raise IntervalError("snapshot from another engine version or query")
        self._clock = state["clock"]
        self._seq = int(state["seq"])
        self._order = int(state["order"])
        self._open = {}
        for a, entries in state["buffers"].items():
            buf = self._buffers[a]
            buf.clear()
            for d in entries:
                e = _Entry.from_dict(d)
                buf.insert(e)
                if e.te is None:
                    self._open.setdefault(e.uid, {})[a] = e
        for a, entries in state["negation"].items():
            self._neg[a] = [_Entry.from_dict(d) for d in entries]
            for e in self._neg[a]:
                if e.te is None:
                    self._open.setdefault(e.uid, {})[a] = e
        self._dropped_begins = {(str(a), str(u)): int(ts) for a, u, ts in state["dropped_begins"]}
        self._seen_complete = {str(k): int(v) for k, v in state["seen_complete"].items()}
        self._expiry = [(ts, a, u) for (a, u), ts in self._dropped_begins.items()]
        self._expiry += [(ts, "", u) for u, ts in self._seen_complete.items()]
        heapq.heapify(self._expiry)
        names = {f.name for f in fields(IntervalEngineCounters)}
        self.counters = IntervalEngineCounters(**{k: v for k, v in state["counters"].items() if k in names})
        self._pending = {}
        for p in state["pending"]:
            binding = {a: _Entry.from_dict(d) for a, d in p["binding"].items()}
            if self._killed(binding):
                # Only a snapshot of an engine from before finished negating intervals killed pending results has
                # such a result (its own engine had retracted it if it was out); drop it before its negating
                # interval is purged.  A no-op on this engine's own snapshots.
                self.counters.negated_results += 1
                continue
            self._pending[self._key(binding)] = _Pending(binding, bool(p["emitted"]))
