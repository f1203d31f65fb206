"""The checker's query form: a SEQ pattern whose positions are OR classes of (refined) symbols, some negated.

Built from a cep.sase :class:`~cep.sase.Query` (:meth:`SequencePattern.from_sase`) or parsed from the checker's own
text form (:func:`parse_pattern`), which adds OR classes (cep.sase has none; Ex. 3.6 needs them)::

    pattern  := 'SEQ' '(' position (',' position)* ')'
    position := ['!'] class
    class    := symbol | 'OR' '(' symbol (',' symbol)* ')' | '(' class ')'
    symbol   := TYPE ['[' cond (',' cond)* ']']        -- as in constraints: A, A[id=3]

Language (skip-till-any-match, Li 2010 §3.2.1): with positive classes E1..Em,
``L(Q) = N0* E1 N1* E2 ... Em Nm*`` where Ni is the alphabet minus the negated classes between Ei and Ei+1.
DEC for the ends, since chapter 3 has no window: a *leading* negation (before E1) forbids its events anywhere
before E1 from the trace start, and a *trailing* negation (after Em) forbids them anywhere after Em until the end
of the trace.  That is SASE's window-bounded range with the window grown to the whole trace.  With a window
(``windowed=True`` in the checker) the leading and trailing negations are left out of the language (a windowed
match only needs the range inside W to be free, so the relaxed language is a superset of the windowed matches and
UNSATISFIABLE stays sound) and the checker reports no SATISFIABLE.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .regex import Cond, ConstraintError, ConstraintSyntaxError, Sym, TokenStream

if TYPE_CHECKING:
    from cep.sase.query import Query

__all__ = ["PatternPosition", "SequencePattern", "parse_pattern"]


@dataclass(frozen=True, slots=True)
class PatternPosition:
    """One element of the SEQ: an OR class of symbols, negated or not."""

    symbols: tuple[Sym, ...]
    negated: bool = False

    def __str__(self) -> str:
        body = str(self.symbols[0]) if len(self.symbols) == 1 else f"OR({', '.join(map(str, self.symbols))})"
        return f"!{body}" if self.negated else body


@dataclass(frozen=True, slots=True)
class SequencePattern:
    """``SEQ(positions...)``.  ``exact`` is False when the source query had conditions the pattern cannot
    express (cross predicates other than the trace partition): then the language is a superset of the real
    matches, and the checker reports only UNSATISFIABLE."""

    positions: tuple[PatternPosition, ...]
    exact: bool = True
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.positions:
            raise ConstraintError("SEQ needs at least one element")
        if all(p.negated for p in self.positions):
            raise ConstraintError("SEQ needs at least one positive (non-negated) element")

    def __str__(self) -> str:
        return f"SEQ({', '.join(map(str, self.positions))})"

    @property
    def positives(self) -> tuple[PatternPosition, ...]:
        return tuple(p for p in self.positions if not p.negated)

    def gaps(self, *, edges: bool = True) -> list[tuple[Sym, ...]]:
        """Negated symbols per gap: gap 0 before the first positive, gap i after positive i (1-based), gap m
        after the last.  ``edges=False`` leaves gaps 0 and m empty (the windowed relaxation)."""
        m = len(self.positives)
        gaps: list[list[Sym]] = [[] for _ in range(m + 1)]
        seen = 0
        for p in self.positions:
            if p.negated:
                gaps[seen].extend(p.symbols)
            else:
                seen += 1
        if not edges:
            gaps[0], gaps[m] = [], []
        return [tuple(g) for g in gaps]

    def symbols(self) -> Iterable[Sym]:
        for p in self.positions:
            yield from p.symbols

    @classmethod
    def from_sase(cls, query: Query) -> SequencePattern:
        """Event types, negation and constant predicates of a cep.sase query.  The partition equalities define
        the trace (one checker state per key), not symbols.  Any other cross predicate makes the pattern
        inexact: a cross predicate between positives is dropped (the language grows), and a negated element
        with a cross predicate is dropped entirely (it forbids fewer events than the plain negation would)."""
        from cep.sase.query import AttrRef

        partition = query.partition_attributes
        alias_type = {e.alias: e.event_type for e in query.elements}
        conds: dict[str, list[Cond]] = {e.alias: [] for e in query.elements}
        crossed: set[str] = set()
        notes: list[str] = []
        for p in query.predicates:
            if not isinstance(p.right, AttrRef):
                conds[p.left.alias].append(Cond(p.left.attr, p.op, p.right))
                continue
            implied = (
                p.op == "="
                and partition.get(alias_type[p.left.alias]) == p.left.attr
                and partition.get(alias_type[p.right.alias]) == p.right.attr
            )
            if not implied:
                crossed.update((p.left.alias, p.right.alias))
                notes.append(f"cross predicate {p} is not checked against the constraint")
        positions: list[PatternPosition] = []
        exact = not crossed
        for e in query.elements:
            if e.negated and e.alias in crossed:
                notes.append(f"negated element {e.alias} has a cross predicate: left out of the checked language")
                continue
            positions.append(PatternPosition((Sym(e.event_type, tuple(conds[e.alias])),), e.negated))
        return cls(tuple(positions), exact, tuple(notes))


class _PatternParser(TokenStream):
    def parse(self) -> SequencePattern:
        t = self.tok
        if t.kind != "name" or t.text.upper() != "SEQ":
            raise self.error("expected SEQ(")
        self.advance()
        self.expect("(", "'(' after SEQ")
        positions = [self._position()]
        while self.at(","):
            self.advance()
            positions.append(self._position())
        self.expect(")", "',' or ')'")
        if self.tok.kind != "end":
            raise self.error("expected the end of the pattern")
        try:
            return SequencePattern(tuple(positions))
        except ConstraintError as exc:
            raise ConstraintSyntaxError(exc.message, self.text, 0) from None

    def _position(self) -> PatternPosition:
        negated = False
        if self.at("!"):
            self.advance()
            negated = True
        return PatternPosition(self._class(), negated)

    def _class(self) -> tuple[Sym, ...]:
        if self.at("("):
            self.advance()
            inner = self._class()
            self.expect(")", "')'")
            return inner
        t = self.tok
        if t.kind == "name" and t.text.upper() == "OR" and self.toks[self.i + 1].text == "(":
            self.advance()
            self.advance()
            syms = [self.symbol()]
            while self.at(","):
                self.advance()
                syms.append(self.symbol())
            self.expect(")", "',' or ')' in OR(...)")
            return tuple(syms)
        return (self.symbol(),)


def parse_pattern(text: str) -> SequencePattern:
    """Parse ``SEQ(OR(P, Q), A[id=3], !B, C)`` (see the module docstring)."""
    return _PatternParser(text).parse()


def pattern_of(query: Any) -> SequencePattern:
    """A SequencePattern from a pattern, a cep.sase Query, or text (``EVENT SEQ(...)`` goes to cep.sase's parser,
    ``SEQ(...)`` to :func:`parse_pattern`)."""
    if isinstance(query, SequencePattern):
        return query
    if isinstance(query, str):
        if query.lstrip().upper().startswith("EVENT"):
            # submodules only: cep.sase's package imports the engine, which imports this package
            from cep.sase.events import SaseError
            from cep.sase.parser import parse_query

            try:
                return SequencePattern.from_sase(parse_query(query))
            except SaseError as exc:
                raise ConstraintError(f"query: {exc}") from exc
        return parse_pattern(query)
    from cep.sase.query import Query

    if isinstance(query, Query):
        return SequencePattern.from_sase(query)
    raise ConstraintError(f"expected a SequencePattern, a cep.sase Query or pattern text, got {type(query).__name__}")
