"""The in-order SASE baseline (Wu et al. 2006 as Li et al. describe it in Sec. 2.2): total order assumed.

Append-only stacks, RIP as an absolute index into the previous stack, construction only when an event of the
last type arrives, and the basic purge e.ts + W < CLOCK.  No out-of-order handling at all: a late event is
appended where it does not belong, exactly the failure of Examples 2-3.  Positive queries without predicates
only; it exists to measure the overhead of out-of-order handling on in-order input (Li's Figure 9).
"""

from __future__ import annotations

from .events import SaseError, SaseEvent

__all__ = ["InOrderSequenceEngine"]


class InOrderSequenceEngine:
    """SEQ(E1..Em) WITHIN W over an in-order stream; ``on_event`` returns the new result sequences."""

    def __init__(self, types: list[str], window: int) -> None:
        if not types:
            raise SaseError("SEQ needs at least one element")
        self.types = types
        self.window = window
        self.positions: dict[str, list[int]] = {}
        for i, t in enumerate(types):
            self.positions.setdefault(t, []).append(i)
        # stack j: list of (ts, event, rip) with rip an absolute index into stack j-1 (-1: none)
        self.stacks: list[list[tuple[int, SaseEvent, int]]] = [[] for _ in types]
        self.base = [0] * len(types)
        """Absolute index of each stack's bottom (purged instances shift it)."""
        self.clock: int | None = None

    def on_event(self, event: SaseEvent) -> list[tuple[SaseEvent, ...]]:
        ts = event.ts
        if self.clock is None or ts > self.clock:
            self.clock = ts
            self._purge(ts - self.window)
        positions = self.positions.get(event.event_type)
        if not positions:
            return []
        for j in reversed(positions):  # later positions first: an event never precedes itself
            rip = -1
            if j > 0:
                prev = self.stacks[j - 1]
                k = len(prev) - 1
                while k >= 0 and prev[k][0] >= ts:
                    k -= 1
                rip = self.base[j - 1] + k
            self.stacks[j].append((ts, event, rip))
        if positions[-1] != len(self.types) - 1:
            return []
        out: list[tuple[SaseEvent, ...]] = []
        m = len(self.types)
        chosen: list[SaseEvent] = [event] * m
        low = ts - self.window

        def dfs(j: int, rip: int) -> None:
            if j < 0:
                out.append(tuple(chosen))
                return
            stack = self.stacks[j]
            base = self.base[j]
            for k in range(rip - base, -1, -1):
                t, ev, r = stack[k]
                if t <= low:
                    break
                chosen[j] = ev
                dfs(j - 1, r)

        dfs(m - 2, self.stacks[m - 1][-1][2])
        return out

    def _purge(self, bound: int) -> None:
        for j, stack in enumerate(self.stacks):
            n = 0
            while n < len(stack) and stack[n][0] < bound:
                n += 1
            if n:
                del stack[:n]
                self.base[j] += n
