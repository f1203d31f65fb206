"""Allen's 13 interval relations and the endpoint-order reasoning behind TList.

Li 2010 Table 5.1 prints ``before`` as ``e.ts < e'.ts`` and ``after`` as ``e.ts > e'.ts``: those are the *open*
relations "starts before/after" (a disjunction of five Allen relations each), not Allen's.  This module uses
Allen's definitions: ``before`` is ``e.te < e'.ts``.

The 13 relations partition the pairs of proper intervals (``ts < te``).  For zero-length intervals (point events)
several labels can hold at once (``[5,5]`` both meets and starts ``[5,8]``), so :func:`allen_relations` returns a
set and query evaluation never relies on a single label: it evaluates endpoint constraints (TList).

Endpoint reasoning: a TList is a conjunction of ``x < y``, ``x <= y`` and ``x = y`` over endpoints.  The transitive
closure of that labelled graph (a path is strict when one of its edges is) is exact and polynomial (the note's
decision; Li points to Nebel-Buerckert reasoning, which is exponential for the general interval algebra but not
needed for point constraints).  A cycle through a strict edge is a contradiction.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "ALLEN_RELATIONS",
    "INVERSE",
    "OPEN_RELATION_STARTS_BEFORE",
    "EndpointClosure",
    "EndpointRef",
    "Order",
    "allen_relations",
    "holds",
    "phl_counts",
]

Order = Literal["<", "<="]
Endpoint = Literal["ts", "te"]


def _before(xs: int, xe: int, ys: int, ye: int) -> bool:
    return xe < ys


def _after(xs: int, xe: int, ys: int, ye: int) -> bool:
    return xs > ye


def _meets(xs: int, xe: int, ys: int, ye: int) -> bool:
    return xe == ys


def _met_by(xs: int, xe: int, ys: int, ye: int) -> bool:
    return xs == ye


def _overlaps(xs: int, xe: int, ys: int, ye: int) -> bool:
    return xs < ys < xe < ye


def _overlapped_by(xs: int, xe: int, ys: int, ye: int) -> bool:
    return ys < xs < ye < xe


def _starts(xs: int, xe: int, ys: int, ye: int) -> bool:
    return xs == ys and xe < ye


def _started_by(xs: int, xe: int, ys: int, ye: int) -> bool:
    return xs == ys and xe > ye


def _during(xs: int, xe: int, ys: int, ye: int) -> bool:
    return xs > ys and xe < ye


def _contains(xs: int, xe: int, ys: int, ye: int) -> bool:
    return xs < ys and xe > ye


def _finishes(xs: int, xe: int, ys: int, ye: int) -> bool:
    return xs > ys and xe == ye


def _finished_by(xs: int, xe: int, ys: int, ye: int) -> bool:
    return xs < ys and xe == ye


def _equal(xs: int, xe: int, ys: int, ye: int) -> bool:
    return xs == ys and xe == ye


ALLEN_RELATIONS: Mapping[str, Callable[[int, int, int, int], bool]] = {
    "before": _before,
    "after": _after,
    "meets": _meets,
    "met-by": _met_by,
    "overlaps": _overlaps,
    "overlapped-by": _overlapped_by,
    "starts": _starts,
    "started-by": _started_by,
    "during": _during,
    "contains": _contains,
    "finishes": _finishes,
    "finished-by": _finished_by,
    "equal": _equal,
}
"""``name -> predicate(x.ts, x.te, y.ts, y.te)`` for ``x name y``."""

INVERSE: Mapping[str, str] = {
    "before": "after", "after": "before", "meets": "met-by", "met-by": "meets",
    "overlaps": "overlapped-by", "overlapped-by": "overlaps", "starts": "started-by", "started-by": "starts",
    "during": "contains", "contains": "during", "finishes": "finished-by", "finished-by": "finishes",
    "equal": "equal",
}

OPEN_RELATION_STARTS_BEFORE = frozenset({"before", "meets", "overlaps", "finished-by", "contains"})
"""The open endpoint relation ``x.ts < y.ts`` as a disjunction of Allen relations (what Table 5.1 calls before)."""


def holds(relation: str, x: tuple[int, int], y: tuple[int, int]) -> bool:
    """Whether ``x relation y`` holds for intervals given as ``(ts, te)``."""
    try:
        fn = ALLEN_RELATIONS[relation]
    except KeyError:
        raise ValueError(f"unknown Allen relation {relation!r} (one of {', '.join(ALLEN_RELATIONS)})") from None
    return fn(x[0], x[1], y[0], y[1])


def allen_relations(x: tuple[int, int], y: tuple[int, int]) -> frozenset[str]:
    """Every Allen relation that holds for ``x R y``: exactly one for proper intervals, possibly more with points."""
    return frozenset(name for name, fn in ALLEN_RELATIONS.items() if fn(x[0], x[1], y[0], y[1]))


@dataclass(frozen=True, slots=True, order=True)
class EndpointRef:
    """``alias.ts`` or ``alias.te`` (Li writes ``E^-`` and ``E^+``)."""

    alias: str
    endpoint: Endpoint

    def __str__(self) -> str:
        return f"{self.alias}.{self.endpoint}"


class EndpointClosure:
    """The transitive closure of a conjunction of endpoint constraints (Li's "given or inferred" restrictions).

    ``relation(x, y)`` is ``"<"`` when ``x < y`` follows, ``"<="`` when only ``x <= y`` follows, None otherwise.
    Every alias gets the implicit ``alias.ts <= alias.te``.  Raises ValueError on a contradiction (a cycle through a
    strict edge), naming one endpoint on it.
    """

    def __init__(self, aliases: Iterable[str], constraints: Iterable[tuple[EndpointRef, Order, EndpointRef]]) -> None:
        nodes: list[EndpointRef] = []
        for alias in aliases:
            nodes += [EndpointRef(alias, "ts"), EndpointRef(alias, "te")]
        index = {node: i for i, node in enumerate(nodes)}
        n = len(nodes)
        # 0: unknown, 1: <=, 2: < (a path is as strict as its strictest edge, so "max" composes along paths).
        rel = [[0] * n for _ in range(n)]
        for i in range(n):
            rel[i][i] = 1
        for alias in aliases:
            rel[index[EndpointRef(alias, "ts")]][index[EndpointRef(alias, "te")]] = 1
        for left, op, right in constraints:
            if left not in index or right not in index:
                raise ValueError(f"constraint on an unknown element: {left} {op} {right}")
            i, j = index[left], index[right]
            rel[i][j] = max(rel[i][j], 2 if op == "<" else 1)
        for k in range(n):
            rk = rel[k]
            for i in range(n):
                rik = rel[i][k]
                if not rik:
                    continue
                ri = rel[i]
                for j in range(n):
                    rkj = rk[j]
                    if rkj:
                        ri[j] = max(ri[j], rik, rkj)
        for i in range(n):
            if rel[i][i] == 2:
                raise ValueError(f"contradictory TList: {nodes[i]} < {nodes[i]} follows")
        self.nodes: tuple[EndpointRef, ...] = tuple(nodes)
        self._index = index
        self._rel = rel

    def relation(self, x: EndpointRef, y: EndpointRef) -> Order | None:
        value = self._rel[self._index[x]][self._index[y]]
        return "<" if value == 2 else "<=" if value == 1 else None

    def pairs(self) -> list[tuple[EndpointRef, Order, EndpointRef]]:
        """Every implied ``x op y`` between endpoints of *different* aliases (both directions when ``=``)."""
        out: list[tuple[EndpointRef, Order, EndpointRef]] = []
        for x in self.nodes:
            for y in self.nodes:
                if x.alias == y.alias:
                    continue
                r = self.relation(x, y)
                if r is not None:
                    out.append((x, r, y))
        return out


PHL_COUNTED = ("contains", "finished-by", "meets", "overlaps", "starts")
"""The relations counted by Patel et al.'s hierarchical form (IO3 section 3): ``R[c, f, m, o, s]``; not before."""


def phl_counts(composite: Iterable[tuple[int, int]], nxt: tuple[int, int]) -> list[int]:
    """How many intervals of the composite built so far contain, are finished-by, meet, overlap or start ``nxt``.

    IO3 encodes ``(A Overlap[0,0,0,1,0] B) Overlap[0,0,0,2,0] C`` with these vectors.
    """
    members = list(composite)
    return [sum(1 for x in members if holds(rel, x, nxt)) for rel in PHL_COUNTED]
