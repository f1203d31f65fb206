"""Alphabet refinement (Li 2010, Ex. 3.8): the constant conditions of the constraint and of the query split each
event type into refined symbols, and every event maps to exactly one of them before any automaton sees it.

For an event type with conditions c1..ck (from both sides, deduplicated), an event's refined symbol is the truth
vector (c1(e), ..., ck(e)).  Only vectors some attribute values can produce become symbols: conditions on one
attribute are tried on witness values (every literal, a value between each pair of neighbouring literals, one
below and one above them, a value of an unrelated type, and a missing attribute), and attributes are independent,
so the realisable vectors are the product over attributes.  For numbers the witnesses include non-integer
midpoints, so an integer attribute can get a symbol no integer produces (``x>3, x<4``): that only adds a
continuation that cannot happen, which can make a verdict come later, never a wrong one.

``A`` in a constraint then means every refined symbol of type A; ``A[id=3]`` those whose vector has ``id=3``
true (Ex. 3.8: ``A`` becomes ``A[id=3] | A[not id=3]``).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .regex import Cond, Sym

__all__ = ["Alphabet"]

_MISSING = object()


class _Unrelated:
    """A value of a type no literal has: equality false, inequality true, ordering raises (so false)."""

    def __eq__(self, other: object) -> bool:
        return False

    def __ne__(self, other: object) -> bool:
        return True

    __hash__ = object.__hash__


def _witnesses(literals: Iterable[Any]) -> list[Any]:
    lits = set(literals)
    out: list[Any] = [_MISSING, _Unrelated(), True, False, None]
    nums = sorted({v for v in lits if isinstance(v, int | float) and not isinstance(v, bool)})
    if nums:
        out += [nums[0] - 1, nums[-1] + 1, *nums]
        out += [(a + b) / 2 for a, b in itertools.pairwise(nums)]
    strs = sorted(v for v in lits if isinstance(v, str))
    if strs:
        # s + "\0" is the smallest string greater than s, so it lies strictly between s and the next literal
        # unless that literal is s + "\0" itself (then the gap is empty anyway).
        out += ["", *strs, *(s + "\0" for s in strs)]
    return out


def _vector(conds: Sequence[Cond], value: Any) -> tuple[bool, ...]:
    if value is _MISSING:
        return tuple(False for _ in conds)
    attrs = {conds[0].attr: value}
    return tuple(c.holds(attrs) for c in conds)


@dataclass(frozen=True, slots=True)
class RefinedSymbol:
    """One letter of the checker's alphabet: an event type and the truth of each of its conditions."""

    index: int
    event_type: str
    truth: tuple[bool, ...]
    label: str


class Alphabet:
    """Refined symbols of the given event types under the given conditions; :meth:`classify` maps events."""

    def __init__(self, event_types: Iterable[str], conds: Iterable[tuple[str, Cond]]) -> None:
        types = sorted(set(event_types))
        per_type: dict[str, list[Cond]] = {t: [] for t in types}
        for t, c in conds:
            if t not in per_type:
                per_type[t] = []
            if c not in per_type[t]:
                per_type[t].append(c)
        self.conds: dict[str, tuple[Cond, ...]] = {
            t: tuple(sorted(cs, key=lambda c: (c.attr, c.op, str(c.value)))) for t, cs in sorted(per_type.items())
        }
        self.symbols: list[RefinedSymbol] = []
        self._index: dict[str, dict[tuple[bool, ...], int]] = {}
        for t, cs in self.conds.items():
            table: dict[tuple[bool, ...], int] = {}
            for truth in _realisable(cs):
                idx = len(self.symbols)
                self.symbols.append(RefinedSymbol(idx, t, truth, _label(t, cs, truth)))
                table[truth] = idx
            self._index[t] = table
        self._plain: dict[str, int] = {t: next(iter(tb.values())) for t, tb in self._index.items() if not self.conds[t]}

    def __len__(self) -> int:
        return len(self.symbols)

    @property
    def plain_symbols(self) -> dict[str, int]:
        """Event types without conditions -> their one symbol (the fast path of classify)."""
        return self._plain

    @property
    def event_types(self) -> list[str]:
        return list(self.conds)

    def classify(self, event_type: str, attrs: Mapping[str, Any]) -> int:
        """The refined symbol of an event, or -1 for an event type outside the alphabet."""
        plain = self._plain.get(event_type)
        if plain is not None:
            return plain
        conds = self.conds.get(event_type)
        if conds is None:
            return -1
        return self._index[event_type].get(tuple(c.holds(attrs) for c in conds), -1)

    def matching(self, sym: Sym) -> frozenset[int]:
        """The refined symbols a constraint or pattern symbol stands for (all its conditions true)."""
        conds = self.conds.get(sym.event_type)
        if conds is None:
            return frozenset()
        want = [conds.index(c) for c in sym.conds]
        return frozenset(
            i for truth, i in self._index[sym.event_type].items() if all(truth[k] for k in want)
        )

    def label(self, index: int) -> str:
        return self.symbols[index].label


def _realisable(conds: Sequence[Cond]) -> list[tuple[bool, ...]]:
    if not conds:
        return [()]
    by_attr: dict[str, list[int]] = {}
    for k, c in enumerate(conds):
        by_attr.setdefault(c.attr, []).append(k)
    per_attr: list[tuple[list[int], list[tuple[bool, ...]]]] = []
    for ks in by_attr.values():
        group = [conds[k] for k in ks]
        vectors = sorted({_vector(group, w) for w in _witnesses(c.value for c in group)}, reverse=True)
        per_attr.append((ks, vectors))
    out: list[tuple[bool, ...]] = []
    for combo in itertools.product(*(vs for _, vs in per_attr)):
        truth = [False] * len(conds)
        for (ks, _), vec in zip(per_attr, combo, strict=True):
            for k, b in zip(ks, vec, strict=True):
                truth[k] = b
        out.append(tuple(truth))
    return out


def _label(event_type: str, conds: Sequence[Cond], truth: Sequence[bool]) -> str:
    if not conds:
        return event_type
    parts = [str(c) if b else f"not {c}" for c, b in zip(conds, truth, strict=True)]
    return f"{event_type}[{', '.join(parts)}]"
