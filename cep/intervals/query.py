"""The ISEQ query model: ``EVENT ISEQ[TList](E1, ..., Em; W)`` (Li 2010 5.3.1) and its compiled form.

Semantics (Li's equation 5.1, with negation and predicates added)::

    { <e1..em> in E1 x ... x Em | TList(e1..em)  and  max(ei.te) - min(ej.ts) < W  and  WHERE(e1..em)
                                  and  for every negated element !D: no interval d of type D satisfies
                                       the TList atoms and WHERE conditions that mention D }

* The argument list implies **no order** (unlike SEQ): all ordering comes from TList.
* The window is strict and spans the positive members only; a positive interval with ``te - ts >= W`` can never
  be in a result.
* Negation (IO3's ``!Ek``; Li leaves interval negation out of scope): the TList atoms that mention a negated
  element are *its condition*, they do not constrain the positives (so ``B.te < D.ts AND D.te < C.ts`` does not
  imply ``B.te < C.ts`` for the result; write it if it is meant).  A negated element needs a lower bound on its
  end from a positive endpoint (else one old interval would negate every future result and could never be
  purged) and an upper bound on its end, or on its start when its type's begins are punctuated (else no result
  could ever be declared permanently valid).  The engine checks the second part (it knows the punctuated types).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from cep.query_ast import AttrRef, Element, Predicate

from .events import IntervalError
from .relations import EndpointClosure, EndpointRef, Order

__all__ = [
    "AttrRef",
    "Constraint",
    "Element",
    "IntervalQuery",
    "NegationSpec",
    "Predicate",
    "allen_constraints",
]

ConstraintOp = Literal["<", "<=", "="]


@dataclass(frozen=True, slots=True)
class Constraint:
    """One TList atom ``left op right`` (``>``/``>=`` are stored mirrored)."""

    left: EndpointRef
    op: ConstraintOp
    right: EndpointRef

    def __str__(self) -> str:
        return f"{self.left} {self.op} {self.right}"

    def orders(self) -> list[tuple[EndpointRef, Order, EndpointRef]]:
        """As closure edges: ``=`` is ``<=`` both ways."""
        if self.op == "=":
            return [(self.left, "<=", self.right), (self.right, "<=", self.left)]
        return [(self.left, self.op, self.right)]

    def holds(self, values: Mapping[EndpointRef, float]) -> bool:
        a, b = values[self.left], values[self.right]
        return a < b if self.op == "<" else a <= b if self.op == "<=" else a == b


def allen_constraints(relation: str, x: str, y: str) -> list[Constraint]:
    """TList atoms stating the closed Allen relation ``x relation y`` between two aliases.

    IO3's ``before``/``overlap``/``after`` compile through this (``overlap`` is Allen's ``overlaps``).
    """
    xs, xe, ys, ye = (EndpointRef(x, "ts"), EndpointRef(x, "te"), EndpointRef(y, "ts"), EndpointRef(y, "te"))
    table: dict[str, list[Constraint]] = {
        "before": [Constraint(xe, "<", ys)],
        "after": [Constraint(ye, "<", xs)],
        "meets": [Constraint(xe, "=", ys)],
        "met-by": [Constraint(xs, "=", ye)],
        "overlaps": [Constraint(xs, "<", ys), Constraint(ys, "<", xe), Constraint(xe, "<", ye)],
        "overlapped-by": [Constraint(ys, "<", xs), Constraint(xs, "<", ye), Constraint(ye, "<", xe)],
        "starts": [Constraint(xs, "=", ys), Constraint(xe, "<", ye)],
        "started-by": [Constraint(xs, "=", ys), Constraint(ye, "<", xe)],
        "during": [Constraint(ys, "<", xs), Constraint(xe, "<", ye)],
        "contains": [Constraint(xs, "<", ys), Constraint(ye, "<", xe)],
        "finishes": [Constraint(ys, "<", xs), Constraint(xe, "=", ye)],
        "finished-by": [Constraint(xs, "<", ys), Constraint(xe, "=", ye)],
        "equal": [Constraint(xs, "=", ys), Constraint(xe, "=", ye)],
    }
    table["overlap"] = table["overlaps"]
    try:
        return table[relation]
    except KeyError:
        raise IntervalError(f"unknown relation {relation!r}") from None


@dataclass(frozen=True, slots=True)
class NegationSpec:
    """A negated element, compiled: its condition and the positive endpoints that bound it."""

    alias: str
    event_type: str
    constraints: tuple[Constraint, ...]
    """The TList atoms that mention this element (the other side is a positive endpoint)."""
    constant_predicates: tuple[Predicate, ...]
    cross_predicates: tuple[Predicate, ...]
    end_upper_bounds: tuple[tuple[EndpointRef, Order], ...]
    """``d.te op p``, given or inferred: a future interval ending at or after p's value cannot negate."""
    start_upper_bounds: tuple[tuple[EndpointRef, Order], ...]
    """``d.ts op p``: with punctuated begins, a future start at or after p's value cannot negate."""


class IntervalQuery:
    """A validated ISEQ query.  Build with :func:`cep.intervals.parse_iseq` or directly."""

    def __init__(self, elements: Sequence[Element], constraints: Sequence[Constraint],
                 predicates: Sequence[Predicate] = (), window_us: int = 0, text: str | None = None) -> None:
        if isinstance(window_us, bool) or not isinstance(window_us, int) or window_us <= 0:
            raise IntervalError(f"the window must be a positive integer of microseconds, got {window_us!r}")
        self.elements = tuple(elements)
        self.constraints = tuple(constraints)
        self.predicates = tuple(predicates)
        self.window_us = window_us
        self.text = text
        aliases = [e.alias for e in self.elements]
        if len(set(aliases)) != len(aliases):
            raise IntervalError("every element needs its own alias (number repeated types: A1, A2)")
        self.by_alias: dict[str, Element] = {e.alias: e for e in self.elements}
        self.positives: tuple[str, ...] = tuple(e.alias for e in self.elements if not e.negated)
        self.negatives: tuple[str, ...] = tuple(e.alias for e in self.elements if e.negated)
        if not self.positives:
            raise IntervalError("ISEQ needs at least one positive element")
        for c in self.constraints:
            for side in (c.left, c.right):
                if side.alias not in self.by_alias:
                    raise IntervalError(f"TList refers to unknown element {side.alias!r} in {c}")
            if c.left.alias == c.right.alias and c.left.alias in self.negatives:
                continue
            if c.left.alias in self.negatives and c.right.alias in self.negatives:
                raise IntervalError(f"a TList atom may mention at most one negated element: {c}")
        for p in self.predicates:
            for alias in p.aliases():
                if alias not in self.by_alias:
                    raise IntervalError(f"WHERE refers to unknown element {alias!r} in {p}")
            if len(p.aliases() & set(self.negatives)) > 1:
                raise IntervalError(f"a WHERE condition may mention at most one negated element: {p}")
        neg = set(self.negatives)
        self.positive_constraints: tuple[Constraint, ...] = tuple(
            c for c in self.constraints if c.left.alias not in neg and c.right.alias not in neg)
        try:
            self.closure = EndpointClosure(self.positives, [o for c in self.positive_constraints for o in c.orders()])
        except ValueError as exc:
            raise IntervalError(str(exc)) from None
        self.constant_predicates: dict[str, tuple[Predicate, ...]] = {
            a: tuple(p for p in self.predicates if p.aliases() == {a} and not isinstance(p.right, AttrRef))
            for a in aliases}
        self.cross_predicates: tuple[Predicate, ...] = tuple(
            p for p in self.predicates if isinstance(p.right, AttrRef) and p.left.alias != p.right.alias
            and not (p.aliases() & neg))
        self.self_predicates: tuple[Predicate, ...] = tuple(
            p for p in self.predicates if isinstance(p.right, AttrRef) and p.left.alias == p.right.alias)
        self.negations: tuple[NegationSpec, ...] = tuple(self._compile_negation(a) for a in self.negatives)

    def _compile_negation(self, alias: str) -> NegationSpec:
        own = tuple(c for c in self.constraints if alias in (c.left.alias, c.right.alias))
        try:
            closure = EndpointClosure(
                (*self.positives, alias),
                [o for c in (*self.positive_constraints, *own) for o in c.orders()])
        except ValueError as exc:
            raise IntervalError(f"the condition of !{alias} can never hold: {exc}") from None
        d_ts, d_te = EndpointRef(alias, "ts"), EndpointRef(alias, "te")
        pos_endpoints = [EndpointRef(a, e) for a in self.positives for e in ("ts", "te")]
        lower = [p for p in pos_endpoints if closure.relation(p, d_te) is not None]
        if not lower:
            raise IntervalError(
                f"!{alias} needs its end bounded below by a positive endpoint (e.g. B.te < {alias}.te): "
                "otherwise an old interval negates every future result and can never be purged")
        end_upper = tuple((p, r) for p in pos_endpoints if (r := closure.relation(d_te, p)) is not None)
        start_upper = tuple((p, r) for p in pos_endpoints if (r := closure.relation(d_ts, p)) is not None)
        preds = [p for p in self.predicates if alias in p.aliases()]
        return NegationSpec(
            alias=alias, event_type=self.by_alias[alias].event_type, constraints=own,
            constant_predicates=tuple(p for p in preds if p.aliases() == {alias} and not isinstance(p.right, AttrRef)),
            cross_predicates=tuple(p for p in preds if p.aliases() != {alias}),
            end_upper_bounds=end_upper, start_upper_bounds=start_upper)

    def event_types(self) -> frozenset[str]:
        return frozenset(e.event_type for e in self.elements)

    def aliases_of_type(self, event_type: str) -> tuple[str, ...]:
        return tuple(e.alias for e in self.elements if e.event_type == event_type)

    def __str__(self) -> str:
        if self.text is not None:
            return self.text
        tl = " AND ".join(str(c) for c in self.constraints)
        args = ", ".join(("!" if e.negated else "") + f"{e.event_type} {e.alias}" for e in self.elements)
        where = (" WHERE " + " AND ".join(str(p) for p in self.predicates)) if self.predicates else ""
        return f"EVENT ISEQ[{tl}]({args}; {self.window_us}){where}"
