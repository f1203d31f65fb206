"""Active Instance Stacks (AIS) for out-of-order sequence scan and construction (Li et al. 2007, Sec. 4.2-4.3).

One stack per positive element of ``SEQ(E1, ..., Em)`` (per NFA state); every state is active from the start so
that an event whose predecessors arrive later is still retrieved (Example 2).  Each instance records its RIP: the
most recent instance of the previous stack with a strictly smaller timestamp.  All instances of the previous
stack from the bottom up to the RIP are its possible predecessors, so construction is a depth-first search over
RIP edges (Figure 2).

Out-of-order handling (Algorithm 1): a late event is inserted with *sort semantics* (its place by timestamp),
its RIP is set, the RIPs of the next stack that it now sits between are reset to it (Example 5), and every new
sequence that contains it, at any position, is constructed.  AIS-CLOCK (Algorithm 2): an event with a timestamp
at or above the largest timestamp in the stacks is in order; it is appended, needs no RIP repair, and only an
event of the last element type can complete a sequence.

Timestamps order sequences strictly (e1.ts < e2.ts < ... < em.ts, as Li): instances with equal timestamps never
follow each other.  Within a stack, equal timestamps keep their arrival order.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Mapping, Sequence
from typing import Any

from .events import SaseEvent
from .query import CompiledPredicate

__all__ = ["ActiveInstanceStacks", "Instance"]

Checks = tuple[tuple[tuple[tuple[CompiledPredicate, int, int], ...], ...], ...]


class Instance:
    """An active instance: an event in one stack, with its RIP pointer."""

    __slots__ = ("event", "n", "rip", "seq", "ts")

    def __init__(self, event: SaseEvent, seq: int, rip: Instance | None = None, n: int = -1) -> None:
        self.event = event
        self.ts = event.ts
        self.seq = seq
        """Arrival number of the event in the engine (identity for snapshots and results)."""
        self.rip = rip
        self.n = n
        """Ordinal in its stack: its index is ``n - stack.base`` (the stack sets it on insertion), so a RIP
        gives the position of its target without a search, like the in-order engine's RIP index."""

    def __repr__(self) -> str:
        rip = f"{self.rip.event.event_type}{self.rip.ts}" if self.rip is not None else "-"
        return f"[{rip}]{self.event.event_type}{self.ts}"


class _Stack:
    """Instances in timestamp order, bottom (oldest) first, with a parallel list of timestamps for bisect."""

    __slots__ = ("base", "items", "ts")

    def __init__(self) -> None:
        self.items: list[Instance] = []
        self.ts: list[int] = []
        self.base = 0
        """Instances ever purged from the bottom: ``items[i].n == base + i``."""


class ActiveInstanceStacks:
    """The AIS of one partition of the stream.

    ``checks`` are the query's cross predicates per construction order (:attr:`Query.checks`).  With the AIS
    partition (``construct(..., prune=True)``: Li's divider between outdated and up-to-date instances),
    construction never visits instances that are too old to be within the window of the triggering event;
    without it, every RIP-compatible sequence is built and the window is applied to finished sequences (the WD
    operator), which is what the optimisation saves.
    """

    __slots__ = ("ais_clock", "candidates", "checks", "length", "rip_resets", "stacks", "window")

    def __init__(self, length: int, window: int, checks: Checks) -> None:
        self.length = length
        self.window = window
        self.checks = checks
        self.stacks = [_Stack() for _ in range(length)]
        self.ais_clock: int | None = None
        """Largest timestamp of any instance ever inserted here (AIS-CLOCK)."""
        self.rip_resets = 0
        self.candidates = 0
        """Sequences built by construction before the window filter (intermediate results of SSC)."""

    def __len__(self) -> int:
        return sum(len(s.items) for s in self.stacks)

    def is_in_order(self, ts: int) -> bool:
        """AIS-CLOCK test: nothing in the stacks is newer than ``ts`` (ties count as in order)."""
        return self.ais_clock is None or ts >= self.ais_clock

    def oldest_ts(self) -> int | None:
        oldest: int | None = None
        for st in self.stacks:
            if st.ts and (oldest is None or st.ts[0] < oldest):
                oldest = st.ts[0]
        return oldest

    def instances(self, pos: int) -> list[Instance]:
        return self.stacks[pos].items

    # ---------------------------------------------------------------- insertion (sequence scan)

    def insert(self, pos: int, inst: Instance, *, append: bool) -> None:
        """Put ``inst`` into stack ``pos``: appended when in order, else by sort semantics with RIP repair."""
        if pos > 0:
            prev = self.stacks[pos - 1]
            if prev.ts and prev.ts[-1] < inst.ts:
                inst.rip = prev.items[-1]
            else:
                k = bisect_left(prev.ts, inst.ts)
                inst.rip = prev.items[k - 1] if k else None
        st = self.stacks[pos]
        if self.ais_clock is None or inst.ts > self.ais_clock:
            self.ais_clock = inst.ts
        if append:
            inst.n = st.base + len(st.items)
            st.items.append(inst)
            st.ts.append(inst.ts)
            return
        k = bisect_right(st.ts, inst.ts)
        inst.n = st.base + k
        st.items.insert(k, inst)
        st.ts.insert(k, inst.ts)
        for above in st.items[k + 1:]:
            above.n += 1
        if pos + 1 < self.length:
            self._repair_next(pos + 1, inst)

    def append_all(self, positions: Sequence[int], event: SaseEvent, seq: int) -> Instance:
        """Append semantics for an in-order event at every position of ``positions`` (ascending; the caller has
        checked ts >= AIS-CLOCK and sets AIS-CLOCK): :meth:`insert` with ``append=True`` per position.  Returns
        the instance at the last of them."""
        inst = None
        for p in positions:
            inst = self.append_at(p, event, seq)
        assert inst is not None, "append_all needs at least one position"
        return inst

    def append_at(self, p: int, event: SaseEvent, seq: int) -> Instance:
        """Append semantics at one position: push the event with its RIP, the most recent instance of the
        previous stack that is strictly earlier (none at position 0)."""
        ts = event.ts
        stacks = self.stacks
        rip = None
        if p:
            prev = stacks[p - 1]
            prev_ts = prev.ts
            if prev_ts:
                if prev_ts[-1] < ts:
                    rip = prev.items[-1]
                else:
                    k = bisect_left(prev_ts, ts)
                    if k:
                        rip = prev.items[k - 1]
        st = stacks[p]
        inst = Instance(event, seq, rip, st.base + len(st.items))
        st.items.append(inst)
        st.ts.append(ts)
        return inst

    def _repair_next(self, pos: int, inst: Instance) -> None:
        """Reset RIP(e') to ``inst`` for every e' of the next stack with RIP(e').ts <= inst.ts < e'.ts.

        RIPs are non-decreasing from bottom to top, so the affected instances are the run that starts just
        above ``inst``'s timestamp.  Equal RIP timestamps are reset as well so that a RIP is always the topmost
        of its timestamp group (``inst`` was inserted above its equals)."""
        nxt = self.stacks[pos]
        for k in range(bisect_right(nxt.ts, inst.ts), len(nxt.items)):
            e2 = nxt.items[k]
            if e2.rip is not None and e2.rip.ts > inst.ts:
                break
            e2.rip = inst
            self.rip_resets += 1

    # ---------------------------------------------------------------- construction

    def construct(self, trigger: int, inst: Instance, *, prune: bool = True) -> list[tuple[Instance, ...]]:
        """Every sequence in the stacks that has ``inst`` at position ``trigger`` and fits the window.

        Leftwards the search follows RIP edges (bottom of the previous stack up to the RIP); rightwards it takes
        the instances of the next stack above the previous binding (what Li's RIN pointer marks).  ``prune``
        cuts candidates outside the window while searching (AIS partition); with ``prune=False`` the window is
        only applied to finished sequences.
        """
        m = self.length
        window = self.window
        checks = self.checks[trigger]
        stacks = self.stacks
        bound: list[Instance] = [inst] * m
        out: list[tuple[Instance, ...]] = []
        # The first element of any sequence containing inst satisfies e1.ts > em.ts - W >= inst.ts - W.
        low = inst.ts - window

        def holds(j: int) -> bool:
            return all(cp.holds(bound[a].event.attrs, bound[b].event.attrs) for cp, a, b in checks[j])

        # Positions without cross predicates skip the call (the common case of partitioned queries).
        needs = [bool(c) for c in checks]

        def right(j: int) -> None:
            if j == m:
                self.candidates += 1
                if bound[m - 1].ts - bound[0].ts < window:
                    out.append(tuple(bound))
                return
            st = stacks[j]
            limit = bound[0].ts + window
            items = st.items
            for k in range(bisect_right(st.ts, bound[j - 1].ts), len(items)):
                x = items[k]
                if x.ts >= limit:
                    break
                bound[j] = x
                if not needs[j] or holds(j):
                    right(j + 1)

        def left(j: int) -> None:
            if j < 0:
                right(trigger + 1)
                return
            rip = bound[j + 1].rip
            if rip is None:
                return
            st = stacks[j]
            hi = bisect_right(st.ts, rip.ts)
            lo = bisect_right(st.ts, low, 0, hi) if prune else 0
            items = st.items
            for k in range(lo, hi):
                bound[j] = items[k]
                if not needs[j] or holds(j):
                    left(j - 1)

        left(trigger - 1)
        return out

    def construct_last(self, inst: Instance, prune: bool = True) -> list[tuple[SaseEvent, ...]]:
        """:meth:`construct` for an in-order trigger at the last position of a query without cross predicates
        (the AIS-CLOCK case of every in-order event of the last type): the same sequences, as event tuples.

        Only the leftward RIP search remains (nothing right of the last stack), no predicate is evaluated and
        the window test reduces to the first element: e1.ts > trigger.ts - W, which ``prune`` applies while
        searching (AIS partition) and the unpruned search applies to finished sequences, counting them as
        candidates like :meth:`construct`."""
        m = self.length
        out: list[tuple[SaseEvent, ...]] = []
        if m == 1:
            self.candidates += 1
            if self.window > 0:
                out.append((inst.event,))
            return out
        rip = inst.rip
        if rip is None:
            return out
        chosen: list[SaseEvent] = [inst.event] * m
        if not prune:
            self.candidates += _left_of(self.stacks, m - 2, rip, inst.ts - self.window, chosen, out)
            return out
        # With the partition every sequence built is within the window: the search runs top down from each
        # RIP and stops at the first instance too old (Li's divider), which visits the tree in exactly the
        # reverse order of the bottom-up search, so one reverse restores :meth:`construct`'s order.
        _left_of_pruned(self.stacks, m - 2, rip, inst.ts - self.window, chosen, out)
        out.reverse()
        self.candidates += len(out)
        return out

    # ---------------------------------------------------------------- purge (PSSC)

    def purge_before(self, bound_ts: int) -> list[Instance]:
        """Remove every instance with ``ts < bound_ts`` (the engine passes bound_ts = L - W: Algorithm 3's
        e.ts + W + K < CLOCK with L = CLOCK - K, or a punctuation).

        Stacks are sorted by timestamp (sort semantics), so each stack's purgeable part is the prefix one binary
        search finds; this subsumes the lazy purge along RIP chains of Li 2010 (Optimization 4.4), which marks a
        purgeable prefix of the previous stack without looking at timestamps, and also purges instances no
        later instance points at (e.g. A events without any D yet), so memory stays bounded.  Stacks are purged
        last first; returned instances are in purge order."""
        purged: list[Instance] = []
        stacks = self.stacks
        for j in range(self.length - 1, -1, -1):
            st = stacks[j]
            ts = st.ts
            if not ts or ts[0] >= bound_ts:
                continue
            cut = bisect_left(ts, bound_ts)
            items = st.items
            purged += items[:cut]
            del items[:cut]
            del ts[:cut]
            st.base += cut
            if j + 1 < self.length:
                # RIPs into the purged prefix must not keep purged events alive; RIPs are non-decreasing
                # bottom to top, so they are the bottom run of the next stack.
                for e2 in stacks[j + 1].items:
                    rip = e2.rip
                    if rip is None:
                        continue
                    if rip.ts >= bound_ts:
                        break
                    e2.rip = None
        return purged

    def outdated(self, pos: int, clock: int) -> int:
        """Li's divider: the number of instances at the bottom of stack ``pos`` with ts + W < CLOCK
        (outdated: kept only for late arrivals).  Construction computes the exact cut from the trigger's
        timestamp; this view is for inspection and tests."""
        return bisect_left(self.stacks[pos].ts, clock - self.window)

    # ---------------------------------------------------------------- state

    def snapshot(self, events: dict[int, SaseEvent]) -> list[Any]:
        """``[AIS-CLOCK, rip_resets, candidates, stacks]``, each stack its (seq, RIP seq) pairs bottom first.

        RIPs are written as arrival numbers because they are pointers; the events themselves go into ``events``
        (keyed by arrival number), which the engine shares between structures so that an event held by several
        stacks, a negation buffer or a held match is stored once."""
        stacks: list[list[list[int | None]]] = []
        for st in self.stacks:
            items: list[list[int | None]] = []
            for inst in st.items:
                events[inst.seq] = inst.event
                items.append([inst.seq, inst.rip.seq if inst.rip is not None else None])
            stacks.append(items)
        return [self.ais_clock, self.rip_resets, self.candidates, stacks]

    @classmethod
    def restore(
        cls, length: int, window: int, checks: Checks, state: Sequence[Any], events: Mapping[int, SaseEvent]
    ) -> ActiveInstanceStacks:
        """The stacks :meth:`snapshot` captured, RIP pointers included (``events`` resolves arrival numbers)."""
        ais = cls(length, window, checks)
        ais.ais_clock, ais.rip_resets, ais.candidates, stacks = state
        # A RIP always points into the previous stack, so one stack's instances by seq resolve the next one's RIPs.
        previous: dict[int, Instance] = {}
        for st, items in zip(ais.stacks, stacks, strict=True):
            current: dict[int, Instance] = {}
            for seq, rip_seq in items:
                inst = Instance(events[seq], seq, n=len(st.items))
                inst.rip = previous.get(rip_seq) if rip_seq is not None else None
                st.items.append(inst)
                st.ts.append(inst.ts)
                current[seq] = inst
            previous = current
        return ais


def _left_of(
    stacks: list[_Stack], j: int, rip: Instance, low: int, chosen: list[SaseEvent], out: list[tuple[SaseEvent, ...]],
) -> int:
    """Without the AIS partition: bind positions j..0 of a sequence whose position j + 1 has RIP ``rip`` (every
    instance from the bottom of stack j up to the RIP), then apply the window to each finished sequence (the WD
    operator: first element newer than ``low``), appending those within it to ``out``; returns the sequences
    built before that filter."""
    st = stacks[j]
    items = st.items
    hi = bisect_right(st.ts, rip.ts)
    built = 0
    if j == 0:
        for k in range(hi):
            # Built, then filtered: every sequence is completed (Li's SSC output) before the window test (WD).
            x = items[k]
            chosen[0] = x.event
            sequence = tuple(chosen)
            built += 1
            if x.ts > low:
                out.append(sequence)
        return built
    for k in range(hi):
        x = items[k]
        r = x.rip
        if r is not None:
            chosen[j] = x.event
            built += _left_of(stacks, j - 1, r, low, chosen, out)
    return built


def _left_of_pruned(
    stacks: list[_Stack], j: int, rip: Instance, low: int, chosen: list[SaseEvent], out: list[tuple[SaseEvent, ...]]
) -> None:
    """:func:`_left_of` with the AIS partition, top down: from the RIP down to the first instance with ts <= low
    (``out`` receives the sequences in reverse order)."""
    st = stacks[j]
    items = st.items
    top = rip.n - st.base
    if j == 1:
        first = stacks[0]
        first_base = first.base
        first_items = first.items
        for k in range(top, -1, -1):
            x = items[k]
            if x.ts <= low:
                return
            r = x.rip
            if r is None:
                continue
            chosen[1] = x.event
            for k0 in range(r.n - first_base, -1, -1):
                y = first_items[k0]
                if y.ts <= low:
                    break
                chosen[0] = y.event
                out.append(tuple(chosen))
        return
    if j == 0:
        for k in range(top, -1, -1):
            x = items[k]
            if x.ts <= low:
                return
            chosen[0] = x.event
            out.append(tuple(chosen))
        return
    for k in range(top, -1, -1):
        x = items[k]
        if x.ts <= low:
            return
        r = x.rip
        if r is not None:
            chosen[j] = x.event
            _left_of_pruned(stacks, j - 1, r, low, chosen, out)
