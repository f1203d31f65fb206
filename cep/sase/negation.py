"""Negation over out-of-order streams: negation buffer and holding set (Li 2010, Sec. 4.5.4, Algorithm 10).

A negated element ``!Ek`` between positives ``Ep`` and ``Eq`` forbids an event ``ek`` (that satisfies the
element's predicates) with ``ep.ts < ek.ts < eq.ts``.  At the edges of the sequence the window supplies the
missing bound (our decision, documented in docs/sase.md):

* leading ``SEQ(!C, A, ..., Z)``: no ``c`` with ``z.ts - W < c.ts < a.ts`` (a ``c`` that would fit into the
  window together with the whole match);
* trailing ``SEQ(A, ..., Z, !C)``: no ``c`` with ``z.ts < c.ts < a.ts + W`` (Li's range [em.ts, e1.ts + W],
  with open ends because sequence order and the window are strict).

Every negation range is an open interval (lo, hi).  A match is final (no future event can invalidate it) once
the engine's low watermark L (future events have ts >= L) reaches the largest ``hi`` of its ranges.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .events import SaseEvent
from .query import NegatedElement, Query

__all__ = ["HeldMatch", "NegationBuffer", "invalidates", "negation_ranges"]


def negation_ranges(query: Query, positives: Sequence[SaseEvent]) -> tuple[tuple[int, int], ...]:
    """(lo, hi) per negated element for a match whose positive events are ``positives``."""
    w = query.window
    out: list[tuple[int, int]] = []
    for n in query.negations:
        lo = positives[n.after].ts if n.after is not None else positives[-1].ts - w
        hi = positives[n.before].ts if n.before is not None else positives[0].ts + w
        out.append((lo, hi))
    return tuple(out)


def invalidates(neg: NegatedElement, event: SaseEvent, positives: Sequence[SaseEvent], lo: int, hi: int) -> bool:
    """Whether ``event`` (already known to pass the element's constant predicates) negates the match."""
    if not lo < event.ts < hi:
        return False
    for cp, pos, neg_is_left in neg.cross_predicates:
        other = positives[pos].attrs
        if not (cp.holds(event.attrs, other) if neg_is_left else cp.holds(other, event.attrs)):
            return False
    return True


class NegationBuffer:
    """Events of one negated element, sorted by timestamp (equal timestamps in arrival order)."""

    __slots__ = ("events", "ts")

    def __init__(self) -> None:
        self.ts: list[int] = []
        self.events: list[tuple[int, int, SaseEvent]] = []

    def __len__(self) -> int:
        return len(self.ts)

    def add(self, event: SaseEvent, seq: int) -> None:
        k = bisect_right(self.ts, event.ts)
        self.ts.insert(k, event.ts)
        self.events.insert(k, (event.ts, seq, event))

    def between(self, lo: int, hi: int) -> list[SaseEvent]:
        """Buffered events with lo < ts < hi."""
        start = bisect_right(self.ts, lo)
        out: list[SaseEvent] = []
        for k in range(start, len(self.ts)):
            if self.ts[k] >= hi:
                break
            out.append(self.events[k][2])
        return out

    def purge_before(self, bound_ts: int) -> int:
        """Drop events with ts < bound_ts (no future match range can reach them); returns how many."""
        n = 0
        while n < len(self.ts) and self.ts[n] < bound_ts:
            n += 1
        if n:
            del self.ts[:n]
            del self.events[:n]
        return n

    def oldest_ts(self) -> int | None:
        return self.ts[0] if self.ts else None

    def snapshot(self, events: dict[int, SaseEvent]) -> list[int]:
        """Arrival numbers in buffer order; the events go into the engine's shared ``events`` table."""
        for _, seq, event in self.events:
            events[seq] = event
        return [seq for _, seq, _ in self.events]

    @classmethod
    def restore(cls, state: Sequence[int], events: Mapping[int, SaseEvent]) -> NegationBuffer:
        """The buffer :meth:`snapshot` captured (its order is kept: equal timestamps stay in arrival order)."""
        buf = cls()
        buf.events = [(events[seq].ts, seq, events[seq]) for seq in state]
        buf.ts = [t for t, _, _ in buf.events]
        return buf


@dataclass(slots=True)
class HeldMatch:
    """A match in the holding set.

    Conservative mode: constructed, not yet emitted, waiting until no negation event can invalidate it.
    Aggressive mode: already emitted, kept until final so that a late negation event can retract it.
    """

    match_id: int
    events: tuple[SaseEvent, ...]
    seqs: tuple[int, ...]
    ranges: tuple[tuple[int, int], ...]
    final_at: int
    """max hi over the negation ranges: final once the low watermark L >= final_at."""
    kind: str
    """The output kind it was (or will be) emitted with: "match" or "add"."""

    def snapshot(self, events: dict[int, SaseEvent]) -> list[Any]:
        """``[match_id, seqs, kind]``: ranges and final_at follow from the events and the query, so they are
        recomputed on restore rather than stored."""
        for seq, event in zip(self.seqs, self.events, strict=True):
            events[seq] = event
        return [self.match_id, list(self.seqs), self.kind]

    @classmethod
    def restore(cls, query: Query, state: Sequence[Any], events: Mapping[int, SaseEvent]) -> HeldMatch:
        match_id, seqs, kind = state
        positives = tuple(events[seq] for seq in seqs)
        ranges = negation_ranges(query, positives)
        # Without negation (a suspended match of a terminated trace, cep/sase/engine.py) nothing can negate it.
        return cls(match_id, positives, tuple(seqs), ranges, max((hi for _, hi in ranges), default=positives[-1].ts),
                   kind)
