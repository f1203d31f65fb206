"""Sequence patterns under clock uncertainty (thesis 003, Pseudocode 3.1, Query 4.6 / 5.9, and its future work).

Every event's true time lies in an interval around its reference timestamp: ``[ts - u, ts + u]`` with
``u = T_a / 2`` in thesis mode (Eq. 3.14/3.16) or ``u`` = the event's own ``uncertainty_us`` in per-event mode.
For a pattern ``SEQ(E1, ..., En) WITHIN W`` and a combination of events ``e1..en`` (one per element):

* **Confirmed** when *every* choice of true times inside the intervals has ``t1 < t2 < ... < tn`` and
  ``tn - t1 <= W``;
* **Uncertain** when *some* choice has ``t1 <= t2 <= ... <= tn`` and ``tn - t1 <= W`` (a tie counts as possible);
* nothing otherwise.

For n = 2 in thesis mode this is exactly Pseudocode 3.1: with ``gap = e2.ts - e1.ts``, ``gap > T_a`` gives
Confirmed, ``-T_a <= gap <= T_a`` gives Uncertain (the thesis' ``<=`` in both branches: a gap of exactly ``T_a``
leaves touching intervals, so the order is not certain), ``gap < -T_a`` nothing.  Because the true times always lie
in their intervals, a combination whose true times match is always reported: no false negatives.

Intervals are compared in doubled units (``2 ts ± U`` with ``U = T_a`` or ``2 u``) so odd ``T_a`` stays exact.

Selection: skip-till-any-match.  Every combination of buffered candidates that can match is reported once, when
its last member arrives, whatever the arrival order (the reversed order of Query 5.9 is the same combination seen
from the other side).  Memory is bounded by the window: a candidate is dropped once no future event
(``ts >= watermark``) can combine with it, and hard caps (``max_candidates`` per element, ``max_matches_per_event``)
turn a burst into counted truncations instead of unbounded growth.  Nothing is truncated silently: every match past
``max_matches_per_event`` is still enumerated and counted (``last_truncated`` for the event just fed,
``counters.matches_truncated`` in all), only not returned, so the count is exact; every candidate the per-element cap
evicts is counted the same way (``last_candidates_dropped``, ``counters.candidates_dropped``).  The matches such an
evicted candidate would have completed later cannot be counted: the shell reports the eviction itself.

Late events (``ts < watermark``, from the gateway's late topic): a candidate past that horizon is not dropped but
*retained* for ``allowed_lateness_us`` more, in a separate set that only late events search (an on-time event
cannot reach it by the window, so the on-time path is unchanged).  A late event within the allowed lateness is
combined with live and retained candidates and every match it completes is returned at once, flagged ``late``, in
both emit modes (holding it for a watermark already passed would only delay it).  A late event past the allowed
lateness is counted ``too_late``, not matched and not buffered (:meth:`UncertainPatternMatcher.lateness`,
``last_lateness``).
"""

from __future__ import annotations

import bisect
import itertools
import operator
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from enum import StrEnum
from typing import Any, Literal

import msgpack

from cep.lateness import DEFAULT_ALLOWED_LATENESS_US
from cep.predicates import Condition, ConditionCursor, parse_condition
from contract.units import format_duration, parse_duration_us

__all__ = [
    "Confidence",
    "Element",
    "Lateness",
    "PatternMatch",
    "PatternMode",
    "PatternSpec",
    "UncertainPatternMatcher",
    "classify",
    "parse_duration_us",
]

PatternMode = Literal["thesis", "per_event"]
EmitMode = Literal["eager", "watermark"]
Lateness = Literal["on_time", "late", "too_late"]
"""An event against the watermark: ``ts >= wm``; ``wm - allowed_lateness <= ts < wm``; older."""
_SNAPSHOT_VERSION = 2


class Confidence(StrEnum):
    CONFIRMED = "Confirmed"
    UNCERTAIN = "Uncertain"


# ---------------------------------------------------------------------------------------------------------- decision


def classify(ts_us: Sequence[int], width2_us: Sequence[int], within_us: int) -> Confidence | None:
    """Confidence of one combination in pattern order.

    ``width2_us[i]`` is the full interval width ``2 u_i`` of event i (``T_a`` in thesis mode); the interval in doubled
    units is ``[2 ts - U, 2 ts + U]``.
    """
    lo = [2 * t - w for t, w in zip(ts_us, width2_us, strict=True)]
    hi = [2 * t + w for t, w in zip(ts_us, width2_us, strict=True)]
    n = len(lo)
    within2 = 2 * within_us
    # Possible: a non-decreasing choice exists iff every interval starts no later than every later one ends, i.e.
    # the running maximum of starts never passes an end (greedy: take each time as early as allowed).
    run = lo[0]
    for i in range(n):
        run = max(run, lo[i])
        if run > hi[i]:
            return None
    # Smallest span of such a choice: put t1 as late as every interval allows (min of ends), the rest at their
    # starts or t1; span = max(0, max(lo[1:]) - min(hi)).
    if n > 1 and max(lo[1:]) - min(hi) > within2:
        return None
    certain_order = all(hi[i] < lo[i + 1] for i in range(n - 1))
    if certain_order and hi[-1] - lo[0] <= within2:
        return Confidence.CONFIRMED
    return Confidence.UNCERTAIN


# ---------------------------------------------------------------------------------------------------------- spec

@dataclass(frozen=True, slots=True)
class Element:
    """One position of the sequence: a name and a condition on the payload (a parsed
    :data:`cep.predicates.Condition` or any Python callable; only the former round-trips through text)."""

    name: str
    where: Condition | Callable[[Mapping[str, Any]], bool]

    @classmethod
    def parse(cls, name: str, condition: str) -> Element:
        return cls(name, parse_condition(condition))

    def matches(self, payload: Mapping[str, Any]) -> bool:
        return bool(self.where(payload))


@dataclass(frozen=True, slots=True)
class PatternSpec:
    """A sequence pattern.  Text form (clauses after ``SEQ(...)`` in any order, ``WITHIN`` required)::

        SEQ(E1, ..., En) [PARTITION BY f] WITHIN d [MODE thesis|per_event] [MAX_UNCERTAINTY d]
                         [EMIT eager|watermark]

    Element syntax: ``[name:] condition`` (:mod:`cep.predicates`), e.g.
    ``SEQ(kick: kind == 'kick', goal: kind == 'goal') PARTITION BY team WITHIN 2 s``.
    """

    elements: tuple[Element, ...]
    within_us: int
    partition_by: str | None = None
    mode: PatternMode = "thesis"
    max_uncertainty_us: int = 1_000_000
    """Per-event mode: the largest ``uncertainty_us`` expected; state expiry assumes future events stay below it
    (an event above it is still matched exactly, only partners already expired are missed; it is counted)."""
    emit: EmitMode = "eager"
    max_candidates: int = 10_000
    max_matches_per_event: int = 1_000
    # PARTITION BY's path, split once (every event is routed by it): derived, not part of the spec's identity.
    _partition_path: tuple[str, ...] | None = dataclass_field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_partition_path",
                           None if self.partition_by is None else tuple(self.partition_by.split(".")))
        if not self.elements:
            raise ValueError("a pattern needs at least one element")
        if self.within_us < 0:
            raise ValueError("within_us must be >= 0")
        if self.mode not in ("thesis", "per_event"):
            raise ValueError(f"mode must be 'thesis' or 'per_event', got {self.mode!r}")
        if self.emit not in ("eager", "watermark"):
            raise ValueError(f"emit must be 'eager' or 'watermark', got {self.emit!r}")
        names = [e.name for e in self.elements]
        if len(set(names)) != len(names):
            raise ValueError(f"element names must be unique: {names}")

    @classmethod
    def seq(cls, *elements: Element, within_us: int, **options: Any) -> PatternSpec:
        """Python builder: ``PatternSpec.seq(Element.parse('kick', "kind == 'kick'"), ..., within_us=2_000_000)``."""
        return cls(tuple(elements), within_us, **options)

    @classmethod
    def parse(cls, text: str) -> PatternSpec:
        """The text form above; raises :class:`cep.predicates.ConditionSyntaxError` with the position."""
        parser = _PatternParser(text)
        elements, options = parser.parse()
        within = options.pop("within_us")
        try:
            return cls(tuple(elements), within, **options)
        except ValueError as exc:
            raise parser.syntax_error(str(exc), text, 0) from None

    def to_text(self) -> str:
        """The text form (raises if an element uses a Python callable)."""
        parts = []
        for el in self.elements:
            to_text = getattr(el.where, "to_text", None)
            if to_text is None:
                raise ValueError(f"element {el.name!r} uses a Python callable: no text form")
            parts.append(f"{el.name}: {to_text()}")
        text = f"SEQ({', '.join(parts)})"
        if self.partition_by:
            text += f" PARTITION BY {self.partition_by}"
        text += f" WITHIN {format_duration(self.within_us)} MODE {self.mode}"
        if self.mode == "per_event":
            text += f" MAX_UNCERTAINTY {format_duration(self.max_uncertainty_us)}"
        if self.emit != "eager":
            text += f" EMIT {self.emit}"
        return text

    def partition_key(self, payload: Mapping[str, Any]) -> Any:
        """The value to route an event to its matcher (``None`` without ``PARTITION BY`` or if missing)."""
        path = self._partition_path
        if path is None:
            return None
        cur: Any = payload
        for part in path:
            if type(cur) is not dict and not isinstance(cur, Mapping):
                return None
            cur = cur.get(part)
        return cur


class _PatternParser(ConditionCursor):
    """``SEQ(element, ...) clause*`` (:class:`PatternSpec`'s text form); elements are ``[name:] condition``."""

    end_word = "end of pattern"

    def parse(self) -> tuple[list[Element], dict[str, Any]]:
        """The elements, and the clauses as :class:`PatternSpec` options (``within_us`` always among them)."""
        if not (self.is_kw("SEQ") and self.toks[self.i + 1].text == "("):
            raise self.error("a pattern starts with SEQ(")
        self.i += 2
        elements = [self.element(1)]
        while self.accept(","):
            elements.append(self.element(len(elements) + 1))
        if not self.accept(")"):
            raise self.error(f"expected ',' or ')' after a pattern element, got {self.shown()!r}")
        options: dict[str, Any] = {}
        while self.tok.kind != "end":
            self.clause(options)
        if "within_us" not in options:
            raise self.error("a pattern needs WITHIN <duration> (it bounds the matcher's memory)")
        return elements, options

    def element(self, number: int) -> Element:
        name = f"e{number}"
        if self.tok.kind == "name" and "." not in self.tok.text and self.toks[self.i + 1].text == ":":
            name = self.advance().text
            self.advance()
        return Element(name, self.condition())

    def clause(self, options: dict[str, Any]) -> None:
        start = self.advance()
        word = start.text.upper() if start.kind == "name" else ""
        if word == "PARTITION" and self.accept("BY") and self.tok.kind == "name":
            options["partition_by"] = self.advance().text
        elif word == "WITHIN":
            options["within_us"] = self.duration()
        elif word == "MODE" and self.tok.text.lower() in ("thesis", "per_event"):
            options["mode"] = self.advance().text.lower()
        elif word == "MAX_UNCERTAINTY":
            options["max_uncertainty_us"] = self.duration()
        elif word == "EMIT" and self.tok.text.lower() in ("eager", "watermark"):
            options["emit"] = self.advance().text.lower()
        else:
            raise self.error(f"cannot parse pattern clause at {self.text[start.pos :].strip()!r}", start)

    def duration(self) -> int:
        """``NUMBER UNIT`` in microseconds (:func:`contract.units.parse_duration_us`)."""
        number = self.tok
        if number.kind != "number" or not number.text.replace(".", "", 1).isdigit() or number.text.endswith("."):
            raise self.error("expected a duration (a number and a unit, e.g. 2 s)")
        self.advance()
        unit = self.advance().text if self.tok.kind == "name" else ""
        try:
            return parse_duration_us(f"{number.text} {unit}", require_unit=True)
        except ValueError as exc:
            raise self.error(str(exc), number) from None


# ---------------------------------------------------------------------------------------------------------- matches


@dataclass(frozen=True, slots=True)
class PatternMatch:
    """One reported combination, events in pattern order."""

    confidence: Confidence
    element_names: tuple[str, ...]
    events: tuple[dict[str, Any], ...]
    ts_us: tuple[int, ...]
    gaps_us: tuple[int, ...]
    """``ts[i+1] - ts[i]`` on the reference clock (negative: observed in the reversed order)."""
    tolerances_us: tuple[int, ...]
    """``u[i] + u[i+1]``: a gap must exceed it for that step's order to be certain (``T_a`` in thesis mode)."""
    span_us: int
    within_us: int
    in_observed_order: bool
    """False when the reference timestamps put the events in another order (Query 5.9's ``e2 -> e1`` branch)."""
    late: bool = False
    """Completed by a late event (``ts`` below the watermark when it arrived): reported after the watermark that
    would normally have closed it."""
    late_element: str | None = None
    """The element the late event fills (``None`` when not late)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "confidence": str(self.confidence),
            "elements": list(self.element_names),
            "events": [dict(e) for e in self.events],
            "ts_us": list(self.ts_us),
            "gaps_us": list(self.gaps_us),
            "tolerances_us": list(self.tolerances_us),
            "span_us": self.span_us,
            "within_us": self.within_us,
            "in_observed_order": self.in_observed_order,
            "late": self.late,
            "late_element": self.late_element,
        }


@dataclass(slots=True)
class _Candidate:
    ts_us: int
    width2_us: int  # U: the interval in doubled units is [2 ts - U, 2 ts + U]
    arrival: int
    ref: dict[str, Any]

    def snapshot(self) -> list[Any]:
        return [self.ts_us, self.width2_us, self.arrival, self.ref]


# The bisections' key: a C-level getter (a Python key function is called once per comparison). Bounds in doubled
# units become bounds on ts: 2 ts >= X iff ts >= ceil(X / 2), and 2 ts > Y iff ts > floor(Y / 2).
_ts_of = operator.attrgetter("ts_us")


def _first_from2(bucket: list[_Candidate], bound2: int, lo: int = 0, hi: int | None = None) -> int:
    """The first candidate of the sorted ``bucket`` (within ``lo:hi``) with ``2 ts >= bound2``."""
    return bisect.bisect_left(bucket, -(-bound2 // 2), lo, len(bucket) if hi is None else hi, key=_ts_of)


def _first_past2(bucket: list[_Candidate], bound2: int) -> int:
    """The first candidate of the sorted ``bucket`` with ``2 ts > bound2``."""
    return bisect.bisect_right(bucket, bound2 // 2, key=_ts_of)


@dataclass(slots=True)
class _Held:
    release_us: int
    match: PatternMatch


@dataclass(slots=True)
class _Counters:
    events: int = 0
    matches: int = 0
    confirmed: int = 0
    uncertain: int = 0
    late_events: int = 0
    """Events below the watermark, too_late ones included."""
    over_bound: int = 0
    candidates_dropped: int = 0
    """Candidates evicted by ``max_candidates`` (the oldest of their element)."""
    matches_truncated: int = 0
    """Matches found but not returned because their event had already completed ``max_matches_per_event``."""
    expired: int = 0
    """Candidates past the on-time horizon (moved to the retained set, or dropped with no allowed lateness)."""
    too_late: int = 0
    """Events below ``watermark - allowed_lateness``: neither matched nor buffered."""
    late_matches: int = 0
    forgotten: int = 0
    """Retained candidates dropped once past the allowed lateness too."""

    def as_list(self) -> list[int]:
        return [self.events, self.matches, self.confirmed, self.uncertain, self.late_events, self.over_bound,
                self.candidates_dropped, self.matches_truncated, self.expired, self.too_late, self.late_matches,
                self.forgotten]


class UncertainPatternMatcher:
    """Uncertainty-aware ``SEQ`` matcher for one partition key.  Pure: events and watermarks in, matches out."""

    def __init__(
        self, spec: PatternSpec, *, ta_us: int = 0, allowed_lateness_us: int = DEFAULT_ALLOWED_LATENESS_US
    ) -> None:
        if allowed_lateness_us < 0:
            raise ValueError(f"allowed_lateness_us must be >= 0, got {allowed_lateness_us}")
        self.spec = spec
        # Each element's condition with its position, looked up once: every event tests every element.
        self._conditions = tuple(enumerate(el.where for el in spec.elements))
        self.allowed_lateness_us = allowed_lateness_us
        self.ta_us = 0
        self.max_ta_us = 0
        self.set_ta_us(ta_us)
        self.watermark_us: int | None = None
        self._arrivals = 0
        self._candidates: list[list[_Candidate]] = [[] for _ in spec.elements]
        # Past the on-time horizon, kept for late events only: on-time events never look here.
        self._retained: list[list[_Candidate]] = [[] for _ in spec.elements]
        self._max_width2 = 0  # widest interval ever buffered: bounds how far a partner can be
        self._held: list[_Held] = []
        self.counters = _Counters()
        self.last_lateness: Lateness = "on_time"
        """What the last :meth:`on_event` found its event to be (the shell reports ``too_late`` from it)."""
        self.last_truncated = 0
        """Matches the last :meth:`on_event` completed beyond ``max_matches_per_event``: counted, not returned."""
        self.last_candidates_dropped = 0
        """Candidates the last :meth:`on_event` evicted through ``max_candidates``."""

    def set_ta_us(self, ta_us: int) -> None:
        """Thesis mode: ``T_a`` (max RTT over the stream's sources).  Applies to events added from now on."""
        if ta_us < 0:
            raise ValueError(f"T_a must be >= 0, got {ta_us}")
        self.ta_us = ta_us
        self.max_ta_us = max(self.max_ta_us, ta_us)

    def _width2(self, uncertainty_us: int) -> int:
        if self.spec.mode == "thesis":
            return self.ta_us
        return 2 * max(0, uncertainty_us)

    @property
    def _bound_width2(self) -> int:
        """Widest interval a future event may have (drives expiry)."""
        if self.spec.mode == "thesis":
            return self.max_ta_us
        return 2 * self.spec.max_uncertainty_us

    def _horizon2(self, watermark_us: int) -> int:
        """In doubled units: a candidate whose interval ends below this meets no event with ``ts >= wm``.

        A future event f has 2 ts_f - U_f >= 2 wm - U_max; it can pair with c only if that start minus c's end
        fits the window: (2 wm - U_max) - (2 ts_c + U_c) <= 2 W."""
        return 2 * watermark_us - self._bound_width2 - 2 * self.spec.within_us

    def lateness(self, ts_us: int) -> Lateness:
        """Where an event at ``ts_us`` stands against the current watermark and the allowed lateness."""
        wm = self.watermark_us
        if wm is None or ts_us >= wm:
            return "on_time"
        return "late" if ts_us >= wm - self.allowed_lateness_us else "too_late"

    # -------------------------------------------------------------------------------------------------- input

    def on_event(
        self, ts_us: int, uncertainty_us: int, payload: Mapping[str, Any], event_ref: dict[str, Any]
    ) -> list[PatternMatch]:
        """Feed one event (reference time order expected, not required).  Returns the new matches in eager mode,
        and in both modes the matches a late event completes (flagged ``late``); ``last_lateness`` tells whether
        the event was on time, late, or too late (then nothing is matched or buffered)."""
        spec = self.spec
        self.counters.events += 1
        lateness: Lateness = "on_time"
        if self.watermark_us is not None and ts_us < self.watermark_us:
            self.counters.late_events += 1
            lateness = self.lateness(ts_us)
        self.last_lateness = lateness
        self.last_truncated = 0
        self.last_candidates_dropped = 0
        if spec.mode == "per_event" and uncertainty_us > spec.max_uncertainty_us:
            self.counters.over_bound += 1
        if lateness == "too_late":
            # Its partners may already be forgotten: a partial answer would pass for a complete one.
            self.counters.too_late += 1
            return []
        late = lateness == "late"
        positions = [i for i, where in self._conditions if where(payload)]
        if not positions:
            return []
        cand = _Candidate(ts_us, self._width2(uncertainty_us), self._arrivals, event_ref)
        self._arrivals += 1
        found = self._matches_with(cand, positions, late)
        self._buffer_candidate(cand, positions, late)
        for m in found:
            self.counters.matches += 1
            if m.confidence is Confidence.CONFIRMED:
                self.counters.confirmed += 1
            else:
                self.counters.uncertain += 1
        if late:
            self.counters.late_matches += len(found)
            return found
        if spec.emit == "eager":
            return found
        self._held.extend(_Held(max(m.ts_us), m) for m in found)
        return []

    def _matches_with(self, cand: _Candidate, positions: list[int], late: bool) -> list[PatternMatch]:
        """The matches the new candidate completes at any of its positions, at most ``max_matches_per_event``;
        the rest are counted in ``last_truncated``."""
        spec = self.spec
        found: list[PatternMatch] = []
        truncated = 0
        within_us = spec.within_us
        for i in positions:
            for combo in self._combinations(i, cand, late):
                if len(found) < spec.max_matches_per_event:
                    match = self._match(combo, spec.elements[i].name if late else None)
                    if match is not None:
                        found.append(match)
                # Past the cap: decide the combination all the same (no match object is built) so the count of
                # what is not returned is exact.
                elif classify([c.ts_us for c in combo], [c.width2_us for c in combo], within_us) is not None:
                    truncated += 1
        self.last_truncated = truncated
        self.counters.matches_truncated += truncated
        return found

    def _buffer_candidate(self, cand: _Candidate, positions: list[int], late: bool) -> None:
        """Keep the candidate for the events still to come, at every position it can take."""
        spec = self.spec
        buckets = self._candidates
        wm = self.watermark_us
        if late and wm is not None and 2 * cand.ts_us + cand.width2_us < self._horizon2(wm):
            buckets = self._retained  # already past the on-time horizon: only late events may use it
        for i in positions:
            bucket = buckets[i]
            # Buckets stay sorted by reference time so a new event only visits partners near it.
            bucket.insert(bisect.bisect_right(bucket, cand.ts_us, key=_ts_of), cand)
            self._max_width2 = max(self._max_width2, cand.width2_us)
            if len(bucket) > spec.max_candidates:
                # Drop the oldest by reference time: the one closest to expiring anyway.
                bucket.pop(0)  # sorted: the oldest by reference time
                self.counters.candidates_dropped += 1
                self.last_candidates_dropped += 1

    def _combinations(self, fixed: int, cand: _Candidate, late: bool) -> Iterator[list[_Candidate]]:
        """Every assignment of buffered candidates to the other positions that passes the pairwise necessary
        conditions (each earlier interval starts no later than each later one ends; each pair fits the window).
        Only a late event also searches the retained candidates."""
        n = len(self.spec.elements)
        within2 = 2 * self.spec.within_us
        chosen: list[_Candidate | None] = [None] * n
        chosen[fixed] = cand

        def fits(pos: int, c: _Candidate) -> bool:
            lo_c, hi_c = 2 * c.ts_us - c.width2_us, 2 * c.ts_us + c.width2_us
            for j, other in enumerate(chosen):
                if other is None or j == pos:
                    continue
                if other is c:
                    return False  # one event fills one position of a combination
                lo_o, hi_o = 2 * other.ts_us - other.width2_us, 2 * other.ts_us + other.width2_us
                if j < pos and (lo_o > hi_c or lo_c - hi_o > within2):
                    return False
                if j > pos and (lo_c > hi_o or lo_o - hi_c > within2):
                    return False
            return True

        # Any partner must fit the window with the fixed event: |2 ts_c - 2 ts| <= 2 W + U + U_c.
        reach2 = within2 + cand.width2_us + self._max_width2

        # The partners' ts range: 2 ts in [2 ts_cand - reach2, 2 ts_cand + reach2].
        lo_ts, hi_ts = -(-(2 * cand.ts_us - reach2) // 2), (2 * cand.ts_us + reach2) // 2

        def slice_near(bucket: list[_Candidate]) -> list[_Candidate]:
            return bucket[bisect.bisect_left(bucket, lo_ts, key=_ts_of):bisect.bisect_right(bucket, hi_ts, key=_ts_of)]

        live, retained = self._candidates, self._retained

        def near(pos: int) -> list[_Candidate]:
            bucket = live[pos]  # the on-time path: slice_near inlined, it runs once per position and level
            return bucket[bisect.bisect_left(bucket, lo_ts, key=_ts_of):bisect.bisect_right(bucket, hi_ts, key=_ts_of)]

        def near_late(pos: int) -> list[_Candidate]:
            return slice_near(retained[pos]) + slice_near(live[pos])

        return _assignments(0, n, fixed, chosen, near_late if late else near, fits)

    def _match(self, combo: list[_Candidate], late_element: str | None) -> PatternMatch | None:
        ts = [c.ts_us for c in combo]
        widths = [c.width2_us for c in combo]
        confidence = classify(ts, widths, self.spec.within_us)
        if confidence is None:
            return None
        return PatternMatch(
            confidence=confidence,
            element_names=tuple(e.name for e in self.spec.elements),
            events=tuple(c.ref for c in combo),
            ts_us=tuple(ts),
            gaps_us=tuple(b - a for a, b in itertools.pairwise(ts)),
            tolerances_us=tuple((a + b) // 2 for a, b in itertools.pairwise(widths)),
            span_us=max(ts) - min(ts),
            within_us=self.spec.within_us,
            in_observed_order=all(a <= b for a, b in itertools.pairwise(ts)),
            late=late_element is not None,
            late_element=late_element,
        )

    # -------------------------------------------------------------------------------------------------- watermark

    def on_watermark(self, watermark_us: int) -> list[PatternMatch]:
        """Promise: no later event has ``ts < watermark`` (late events aside).  Moves candidates no future on-time
        event can combine with to the retained set, forgets retained ones past the allowed lateness too, and
        (``EMIT watermark``) releases held matches whose members are all below the watermark, in time order."""
        if self.watermark_us is not None and watermark_us <= self.watermark_us:
            return []
        self.watermark_us = watermark_us
        horizon2 = self._horizon2(watermark_us)
        # A late event within the allowed lateness starts no earlier than 2 (wm - lateness) - U_max: the same
        # argument as the on-time horizon, moved back by the allowed lateness.
        forget2 = horizon2 - 2 * self.allowed_lateness_us
        for i, bucket in enumerate(self._candidates):
            keep = [c for c in bucket if 2 * c.ts_us + c.width2_us >= horizon2]
            if len(keep) == len(bucket):
                continue
            self.counters.expired += len(bucket) - len(keep)
            self._candidates[i] = keep
            retained = self._retained[i]
            for c in bucket:
                if 2 * c.ts_us + c.width2_us >= horizon2:
                    continue
                # Expiry mostly follows reference time, so this is an append; insort covers wider intervals.
                if not retained or retained[-1].ts_us <= c.ts_us:
                    retained.append(c)
                else:
                    retained.insert(bisect.bisect_right(retained, c.ts_us, key=_ts_of), c)
        for bucket in self._retained:
            self._forget(bucket, forget2)
        if not self._held:
            return []
        ready = sorted((h for h in self._held if h.release_us < watermark_us), key=lambda h: h.release_us)
        self._held = [h for h in self._held if h.release_us >= watermark_us]
        return [h.match for h in ready]

    def _forget(self, bucket: list[_Candidate], forget2: int) -> None:
        """Remove the candidates whose interval ends below ``forget2``; only the prefix within the widest interval
        of that bound needs a look, so a long retained set costs a bisection per watermark."""
        edge = _first_from2(bucket, forget2)
        if edge == 0:
            return
        surely = _first_from2(bucket, forget2 - self._max_width2, 0, edge)
        kept = [c for c in bucket[surely:edge] if 2 * c.ts_us + c.width2_us >= forget2]
        self.counters.forgotten += edge - len(kept)
        bucket[:edge] = kept

    @property
    def buffered(self) -> int:
        """Candidates stored: live and retained (what keeps the matcher from being idle)."""
        return sum(len(b) for b in self._candidates) + self.retained

    @property
    def retained(self) -> int:
        """Candidates past the on-time horizon, kept for late events only."""
        return sum(len(b) for b in self._retained)

    @property
    def held(self) -> int:
        return len(self._held)

    def is_idle(self) -> bool:
        """Nothing buffered, retained or held: the shell may drop the matcher and start fresh."""
        return self.buffered == 0 and not self._held

    def next_timer_us(self) -> int | None:
        """The lowest watermark at which :meth:`on_watermark` changes something: a held match released, a
        candidate expired or a retained one forgotten (an event-time timer for the shell)."""
        due = [h.release_us + 1 for h in self._held]
        slack2 = self._bound_width2 + 2 * self.spec.within_us
        for bucket in self._candidates:
            due.extend((2 * c.ts_us + c.width2_us + slack2) // 2 + 1 for c in bucket)
        slack2 += 2 * self.allowed_lateness_us
        for bucket in self._retained:
            if bucket:
                # The earliest end lies among the oldest starts, within the widest interval of the first one.
                stop = _first_past2(bucket, 2 * bucket[0].ts_us + self._max_width2)
                due.extend((2 * c.ts_us + c.width2_us + slack2) // 2 + 1 for c in bucket[:stop])
        return min(due, default=None)

    # -------------------------------------------------------------------------------------------------- state

    def snapshot(self) -> bytes:
        """State as msgpack bytes; the spec is stored as text when it has one (event refs must be msgpack-able)."""
        try:
            spec_text: str | None = self.spec.to_text()
        except ValueError:
            spec_text = None
        state = {
            "v": _SNAPSHOT_VERSION,
            "spec": spec_text,
            "ta_us": self.ta_us,
            "max_ta_us": self.max_ta_us,
            "allowed_lateness_us": self.allowed_lateness_us,
            "watermark_us": self.watermark_us,
            "arrivals": self._arrivals,
            "candidates": [[x.snapshot() for x in bucket] for bucket in self._candidates],
            "retained": [[x.snapshot() for x in bucket] for bucket in self._retained],
            "held": [[h.release_us, h.match.to_dict()] for h in self._held],
            "counters": self.counters.as_list(),
        }
        packed: bytes = msgpack.packb(state, use_bin_type=True)
        return packed

    @classmethod
    def restore(cls, blob: bytes, spec: PatternSpec | None = None) -> UncertainPatternMatcher:
        """Rebuild from :meth:`snapshot`; pass ``spec`` when it was built with Python callables.  Version 1
        snapshots (before allowed lateness) restore with the default allowed lateness and nothing retained."""
        state = msgpack.unpackb(blob, raw=False, strict_map_key=False)
        if state.get("v") not in (1, _SNAPSHOT_VERSION):
            raise ValueError(f"unsupported snapshot version {state.get('v')!r}")
        if spec is None:
            if state["spec"] is None:
                raise ValueError("the snapshot's spec has no text form: pass spec=")
            spec = PatternSpec.parse(state["spec"])
        m = cls(spec, allowed_lateness_us=state.get("allowed_lateness_us", DEFAULT_ALLOWED_LATENESS_US))
        m.ta_us = state["ta_us"]
        m.max_ta_us = state["max_ta_us"]
        m.watermark_us = state["watermark_us"]
        m._arrivals = state["arrivals"]
        # One event may sit in several buckets; restore them as one object again (arrival numbers are unique).
        by_arrival: dict[int, _Candidate] = {}

        def rebuild(rows: list[list[list[Any]]]) -> list[list[_Candidate]]:
            return [[by_arrival.setdefault(arrival, _Candidate(ts, width2, arrival, ref))
                     for ts, width2, arrival, ref in bucket] for bucket in rows]

        m._candidates = rebuild(state["candidates"])
        m._retained = rebuild(state.get("retained") or [[] for _ in spec.elements])
        m._max_width2 = max((c.width2_us for c in by_arrival.values()), default=0)
        m._held = [_Held(release, _match_from_dict(d)) for release, d in state["held"]]
        m.counters = _Counters(*state["counters"])
        return m


def _assignments(pos: int, n: int, fixed: int, chosen: list[_Candidate | None],
                 partners: Callable[[int], list[_Candidate]],
                 fits: Callable[[int, _Candidate], bool]) -> Iterator[list[_Candidate]]:
    """Depth first, in position order: every way to fill the free positions from ``pos`` on with a partner that
    fits what is chosen so far. A module function, not a closure that calls itself: such a closure is a reference
    cycle (the function, its cell), garbage the cyclic collector alone frees, one per event."""
    if pos == n:
        yield [c for c in chosen if c is not None]
        return
    if pos == fixed:
        yield from _assignments(pos + 1, n, fixed, chosen, partners, fits)
        return
    for c in partners(pos):
        if fits(pos, c):
            chosen[pos] = c
            yield from _assignments(pos + 1, n, fixed, chosen, partners, fits)
            chosen[pos] = None


def _match_from_dict(d: Mapping[str, Any]) -> PatternMatch:
    return PatternMatch(
        confidence=Confidence(d["confidence"]),
        element_names=tuple(d["elements"]),
        events=tuple(d["events"]),
        ts_us=tuple(d["ts_us"]),
        gaps_us=tuple(d["gaps_us"]),
        tolerances_us=tuple(d["tolerances_us"]),
        span_us=d["span_us"],
        within_us=d["within_us"],
        in_observed_order=d["in_observed_order"],
        late=d.get("late", False),
        late_element=d.get("late_element"),
    )
