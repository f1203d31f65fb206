"""The sequence query model: ``EVENT SEQ(E1, ..., Em) WHERE ... WITHIN W`` and its compiled form.

A query is a list of elements (event type, alias, negated or not), a conjunction of comparison predicates and a
window.  :class:`Query` validates the combination once and precomputes what the engine needs at run time:

* the positive elements (the NFA states / AIS stacks) and, for each negated element, the positive neighbours
  that bound its time range;
* the constant predicates per element (they decide whether an event enters a stack or the negation buffer);
* the cross predicates, each attached to the construction step at which both of its elements are bound;
* the equality partitioning (``partition_attributes``) when the equality predicates connect every element.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cep.lexer import COMPARISONS, Scalar, canonical_op
from cep.query_ast import AttrRef, Element, Predicate, equality_classes, equality_key_attributes

from .events import SaseError

__all__ = [
    "AttrRef",
    "CompiledPredicate",
    "Element",
    "NegatedElement",
    "Predicate",
    "Query",
    "SeqBuilder",
    "ref",
]



def ref(text: str) -> AttrRef:
    """``ref("c.id")`` for the builder: the right-hand side of a predicate that is an attribute, not a constant."""
    alias, dot, attr = text.partition(".")
    if not dot or not alias or not attr:
        raise SaseError(f"attribute reference must be 'alias.attr', got {text!r}")
    return AttrRef(alias, attr)


@dataclass(frozen=True, slots=True)
class CompiledPredicate:
    """A cross predicate between two elements, ready to evaluate on their events' attributes."""

    left_alias: str
    left_attr: str
    fn: Callable[[Any, Any], bool]
    right_alias: str
    right_attr: str
    text: str

    def holds(self, left_attrs: Mapping[str, Any], right_attrs: Mapping[str, Any]) -> bool:
        """Evaluate; values that cannot be compared (``"a" < 1``) make the predicate false, never raise."""
        try:
            return bool(self.fn(left_attrs[self.left_attr], right_attrs[self.right_attr]))
        except (TypeError, KeyError):
            return False


@dataclass(frozen=True, slots=True)
class ConstantPredicate:
    """``alias.attr op constant``: a filter on single events."""

    attr: str
    fn: Callable[[Any, Any], bool]
    value: Scalar

    def holds(self, attrs: Mapping[str, Any]) -> bool:
        try:
            return bool(self.fn(attrs[self.attr], self.value))
        except (TypeError, KeyError):
            return False


@dataclass(frozen=True, slots=True)
class NegatedElement:
    """A negated element and the positive positions around it.

    ``after`` is the position of the closest positive element before it (None when the negation leads the
    sequence), ``before`` the closest positive element after it (None when it trails).  Its time range for a
    match ``p`` is the open interval (lo, hi) with lo = p[after].ts (or p[-1].ts - W when leading) and
    hi = p[before].ts (or p[0].ts + W when trailing).
    """

    element: Element
    index: int
    after: int | None
    before: int | None
    constant_predicates: tuple[ConstantPredicate, ...]
    cross_predicates: tuple[tuple[CompiledPredicate, int, bool], ...]
    """(predicate, positive position of the other element, True when the negated element is the left side)."""


@dataclass(slots=True)
class Query:
    """A validated sequence query.  Build with :func:`cep.sase.parse_query` or :class:`SeqBuilder`."""

    elements: tuple[Element, ...]
    predicates: tuple[Predicate, ...]
    window: int
    text: str = ""
    positives: tuple[Element, ...] = field(init=False)
    negations: tuple[NegatedElement, ...] = field(init=False)
    partition_attributes: dict[str, str] = field(init=False)
    """Event type -> attribute used for equality partitioning; empty when the equalities do not connect all
    elements (then the engine keeps a single AIS)."""
    positions_by_type: dict[str, tuple[int, ...]] = field(init=False)
    negations_by_type: dict[str, tuple[int, ...]] = field(init=False)
    constant_predicates: tuple[tuple[ConstantPredicate, ...], ...] = field(init=False)
    required_attributes: dict[str, frozenset[str]] = field(init=False)
    checks: tuple[tuple[tuple[tuple[CompiledPredicate, int, int], ...], ...], ...] = field(init=False)
    """checks[i][j]: cross predicates between positives to evaluate when position j is bound during a
    construction triggered at position i, as (predicate, left position, right position)."""

    def __post_init__(self) -> None:
        _validate(self)
        self.positives = tuple(e for e in self.elements if not e.negated)
        pos_of_alias = {e.alias: i for i, e in enumerate(self.positives)}
        self.partition_attributes = equality_key_attributes(self.elements, self.predicates)
        effective = (*self.predicates, *_transitive_equalities(self.predicates, pos_of_alias))
        implied = _implied_by_partition(self.elements, effective, self.partition_attributes)

        const: dict[str, list[ConstantPredicate]] = {e.alias: [] for e in self.elements}
        cross_pos: list[tuple[CompiledPredicate, int, int]] = []
        cross_neg: dict[str, list[tuple[CompiledPredicate, int, bool]]] = {}
        required: dict[str, set[str]] = {e.event_type: set() for e in self.elements}
        alias_type = {e.alias: e.event_type for e in self.elements}
        for p in effective:
            required[alias_type[p.left.alias]].add(p.left.attr)
            if not isinstance(p.right, AttrRef):
                const[p.left.alias].append(ConstantPredicate(p.left.attr, COMPARISONS[p.op], p.right))
                continue
            required[alias_type[p.right.alias]].add(p.right.attr)
            if p in implied:
                continue
            cp = CompiledPredicate(p.left.alias, p.left.attr, COMPARISONS[p.op], p.right.alias, p.right.attr, str(p))
            left_neg, right_neg = p.left.alias not in pos_of_alias, p.right.alias not in pos_of_alias
            if left_neg:
                cross_neg.setdefault(p.left.alias, []).append((cp, pos_of_alias[p.right.alias], True))
            elif right_neg:
                cross_neg.setdefault(p.right.alias, []).append((cp, pos_of_alias[p.left.alias], False))
            else:
                cross_pos.append((cp, pos_of_alias[p.left.alias], pos_of_alias[p.right.alias]))
        for etype, attr in self.partition_attributes.items():
            required[etype].add(attr)
        self.required_attributes = {t: frozenset(a) for t, a in required.items()}
        self.constant_predicates = tuple(tuple(const[e.alias]) for e in self.positives)

        negs: list[NegatedElement] = []
        pos_seen = -1
        for idx, e in enumerate(self.elements):
            if not e.negated:
                pos_seen += 1
                continue
            after = pos_seen if pos_seen >= 0 else None
            before = pos_seen + 1 if pos_seen + 1 < len(self.positives) else None
            negs.append(
                NegatedElement(e, idx, after, before, tuple(const[e.alias]), tuple(cross_neg.get(e.alias, ())))
            )
        self.negations = tuple(negs)

        by_type: dict[str, list[int]] = {}
        for i, e in enumerate(self.positives):
            by_type.setdefault(e.event_type, []).append(i)
        self.positions_by_type = {t: tuple(v) for t, v in by_type.items()}
        neg_by_type: dict[str, list[int]] = {}
        for k, n in enumerate(self.negations):
            neg_by_type.setdefault(n.element.event_type, []).append(k)
        self.negations_by_type = {t: tuple(v) for t, v in neg_by_type.items()}
        self.checks = tuple(self._checks_for_trigger(i, cross_pos) for i in range(len(self.positives)))

    def _checks_for_trigger(
        self, trigger: int, cross: list[tuple[CompiledPredicate, int, int]]
    ) -> tuple[tuple[tuple[CompiledPredicate, int, int], ...], ...]:
        """Construction binds the trigger, then leftwards to 0, then rightwards to m-1 (Li's DFS over RIP
        edges, extended to the right for out-of-order triggers).  A predicate is checked at the step that binds
        the later of its two positions in that order, so partial sequences are cut as early as possible."""
        m = len(self.positives)
        order = [trigger, *range(trigger - 1, -1, -1), *range(trigger + 1, m)]
        rank = {pos: r for r, pos in enumerate(order)}
        per_pos: list[list[tuple[CompiledPredicate, int, int]]] = [[] for _ in range(m)]
        for cp, a, b in cross:
            per_pos[a if rank[a] > rank[b] else b].append((cp, a, b))
        return tuple(tuple(x) for x in per_pos)

    @property
    def length(self) -> int:
        return len(self.positives)


def _validate(q: Query) -> None:
    if not q.elements:
        raise SaseError("SEQ needs at least one element")
    if all(e.negated for e in q.elements):
        raise SaseError("SEQ needs at least one positive (non-negated) element")
    if isinstance(q.window, bool) or not isinstance(q.window, int) or q.window <= 0:
        raise SaseError(f"WITHIN must be a positive integer number of time units, got {q.window!r}")
    seen: set[str] = set()
    for e in q.elements:
        if not e.event_type or not e.alias:
            raise SaseError("element needs an event type and an alias")
        if e.alias in seen:
            raise SaseError(f"duplicate alias {e.alias!r}: give each element its own alias")
        seen.add(e.alias)
    negated = {e.alias for e in q.elements if e.negated}
    for p in q.predicates:
        if p.op not in COMPARISONS:
            raise SaseError(f"unknown comparison {p.op!r}")
        for side in (p.left, p.right):
            if isinstance(side, AttrRef) and side.alias not in seen:
                raise SaseError(f"predicate {p} uses unknown alias {side.alias!r}")
        if isinstance(p.right, AttrRef) and p.left.alias in negated and p.right.alias in negated:
            raise SaseError(f"predicate {p} relates two negated elements; only negated-to-positive is supported")
        if isinstance(p.right, AttrRef) and p.left.alias == p.right.alias:
            raise SaseError(f"predicate {p} compares an element with itself; use a constant predicate")


def _transitive_equalities(predicates: Sequence[Predicate], positive_aliases: Mapping[str, int]) -> list[Predicate]:
    """Equalities between positive elements that follow by transitivity but are not written: with
    ``a.id = c.id AND c.id = b.id`` and ``c`` negated (usually unbound), the match still needs a.id = b.id."""
    eq = {(p.left, p.right) for p in predicates if p.op == "=" and isinstance(p.right, AttrRef)}
    written = eq | {(b, a) for a, b in eq}
    implied = {(a, b) for members in equality_classes(predicates) for a in members for b in members
               if a != b and (a, b) not in written}
    out: list[Predicate] = []
    for a, b in sorted(implied, key=str):
        if a.alias in positive_aliases and b.alias in positive_aliases and a.alias != b.alias and str(a) < str(b):
            out.append(Predicate(a, "=", b))
    return out


def _implied_by_partition(
    elements: Sequence[Element], predicates: Sequence[Predicate], partition: Mapping[str, str]
) -> set[Predicate]:
    """Equalities that partitioning already guarantees (both sides are the partition attributes)."""
    if not partition:
        return set()
    alias_type = {e.alias: e.event_type for e in elements}
    out: set[Predicate] = set()
    for p in predicates:
        if (
            p.op == "="
            and isinstance(p.right, AttrRef)
            and partition.get(alias_type[p.left.alias]) == p.left.attr
            and partition.get(alias_type[p.right.alias]) == p.right.attr
        ):
            out.add(p)
    return out


class SeqBuilder:
    """Python builder for queries, an alternative to the text syntax.

    >>> q = (SeqBuilder().event("SHELF", "s").negated("CHECKOUT", "c").event("EXIT", "e")
    ...      .where("s.id", "=", ref("c.id")).where("c.id", "=", ref("e.id")).within(3_600_000_000).build())
    """

    def __init__(self) -> None:
        self._elements: list[Element] = []
        self._predicates: list[Predicate] = []
        self._window: int | None = None

    def event(self, event_type: str, alias: str | None = None) -> SeqBuilder:
        self._elements.append(Element(event_type, alias or event_type))
        return self

    def negated(self, event_type: str, alias: str | None = None) -> SeqBuilder:
        self._elements.append(Element(event_type, alias or event_type, negated=True))
        return self

    def where(self, left: str, op: str, right: AttrRef | Scalar) -> SeqBuilder:
        op = canonical_op(op)
        if op not in COMPARISONS:
            raise SaseError(f"unknown comparison {op!r}; use one of {sorted(COMPARISONS)}")
        self._predicates.append(Predicate(ref(left), op, right))  # type: ignore[arg-type]
        return self

    def within(self, window: int) -> SeqBuilder:
        self._window = window
        return self

    def build(self) -> Query:
        if self._window is None:
            raise SaseError("a window is required (within(...)): without one no state could ever be purged")
        return Query(tuple(self._elements), tuple(self._predicates), self._window)
