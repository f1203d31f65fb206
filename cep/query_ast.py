"""The query languages' shared AST (SASE's ``SEQ`` and ISEQ): attribute references, elements and the comparison
predicates over them, and the readers of both grammars for them.  Comparisons use :data:`cep.lexer.COMPARISONS`,
the one table all grammars read."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast

from cep.lexer import COMPARISONS, FLIPPED, Scalar, Token, TokenCursor, canonical_op, is_literal, literal_value

__all__ = ["AttrRef", "Element", "PredOp", "Predicate", "equality_classes", "equality_key_attributes",
           "parse_comparison", "parse_element"]

PredOp = Literal["=", "!=", "<", "<=", ">", ">="]


@dataclass(frozen=True, slots=True)
class AttrRef:
    """``alias.attr``: an attribute of the event bound to one element."""

    alias: str
    attr: str

    def __str__(self) -> str:
        return f"{self.alias}.{self.attr}"


@dataclass(frozen=True, slots=True)
class Element:
    """One element of ``SEQ(...)`` or ``ISEQ[...](...)``: ``TYPE alias``, or negated ``!TYPE alias``."""

    event_type: str
    alias: str
    negated: bool = False


@dataclass(frozen=True, slots=True)
class Predicate:
    """``left op right``; ``right`` is an attribute of another element or a constant."""

    left: AttrRef
    op: PredOp
    right: AttrRef | Scalar

    def aliases(self) -> frozenset[str]:
        return frozenset({self.left.alias} | ({self.right.alias} if isinstance(self.right, AttrRef) else set()))

    def holds(self, attrs: Mapping[str, Mapping[str, Any]]) -> bool:
        """Evaluate with ``attrs[alias]``; a missing or incomparable value makes it false, never raises."""
        try:
            left = attrs[self.left.alias][self.left.attr]
            right = attrs[self.right.alias][self.right.attr] if isinstance(self.right, AttrRef) else self.right
            return bool(COMPARISONS[self.op](left, right))
        except (KeyError, TypeError):
            return False

    def __str__(self) -> str:
        return f"{self.left} {self.op} {self.right if isinstance(self.right, AttrRef) else repr(self.right)}"


def parse_element(cursor: TokenCursor) -> tuple[Element, Token]:
    """``['!'] ( '(' TYPE [alias] ')' | TYPE [alias] )`` at the cursor, the alias being the type's name without
    one; with the token that names the alias (for errors about it)."""
    negated = cursor.is_punct("!")
    if negated:
        cursor.advance()
    paren = cursor.is_punct("(")
    if paren:
        cursor.advance()
    type_tok = cursor.name("an event type")
    alias_tok = cursor.advance() if cursor.at_name() else type_tok
    if paren:
        cursor.expect_punct(")")
    return Element(type_tok.text, alias_tok.text, negated), alias_tok


def parse_operand(cursor: TokenCursor, aliases: Collection[str]) -> AttrRef | Scalar:
    """A constant, or ``alias.attr`` naming one of ``aliases``, at the cursor."""
    if is_literal(cursor.tok):
        return literal_value(cursor.advance())
    alias = cursor.name("alias.attr, a number or a string")
    if alias.text not in aliases:
        raise cursor.syntax_error(f"unknown alias {alias.text!r} (known: {', '.join(sorted(aliases))})", cursor.text,
                                  alias.pos)
    cursor.expect_punct(".")
    attr = cursor.name("an attribute name after '.'")
    return AttrRef(alias.text, attr.text)


def parse_comparison(cursor: TokenCursor, aliases: Collection[str]) -> tuple[Predicate, Token]:
    """``operand OP operand`` at the cursor, at least one side ``alias.attr``, stored attribute-first (``5 < a.x``
    is ``a.x > 5``); with its first token (for errors about the whole condition)."""
    start = cursor.tok
    left = parse_operand(cursor, aliases)
    if cursor.tok.kind != "op":
        raise cursor.error("expected a comparison (=, !=, <, <=, >, >=)")
    op = canonical_op(cursor.advance().text)
    right = parse_operand(cursor, aliases)
    if not isinstance(left, AttrRef):
        if not isinstance(right, AttrRef):
            raise cursor.syntax_error("a condition must reference at least one alias.attr", cursor.text, start.pos)
        left, right, op = right, left, FLIPPED[op]
    return Predicate(left, cast(PredOp, op), right), start


def equality_classes(predicates: Iterable[Predicate]) -> list[list[AttrRef]]:
    """The classes of attribute references that the ``=`` predicates between two attributes make equal: equality is
    transitive, so ``a.id = c.id AND c.id = b.id`` puts all three in one class (its members in no promised order). An
    attribute no such predicate names is in none."""
    parent: dict[AttrRef, AttrRef] = {}

    def find(x: AttrRef) -> AttrRef:
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for p in predicates:
        if p.op == "=" and isinstance(p.right, AttrRef):
            parent[find(p.left)] = find(p.right)
    classes: dict[AttrRef, list[AttrRef]] = {}
    for x in list(parent):
        classes.setdefault(find(x), []).append(x)
    return list(classes.values())


def equality_key_attributes(elements: Sequence[Element], predicates: Sequence[Predicate]) -> dict[str, str]:
    """Event type -> attribute of an equality class of the ``=`` predicates that names one attribute per element
    and covers all of them (positive and negated): then events only combine within equal values of it (SASE's
    partitioned AIS, a key group's key); empty when there is none.  Every element of one event type must use the
    same attribute, because routing happens per event type."""
    alias_type = {e.alias: e.event_type for e in elements}
    for members in sorted(equality_classes(predicates), key=lambda ms: sorted(str(m) for m in ms)):
        by_alias: dict[str, set[str]] = {}
        for m in members:
            by_alias.setdefault(m.alias, set()).add(m.attr)
        if set(by_alias) != set(alias_type):
            continue
        mapping: dict[str, str] = {}
        ok = True
        for alias, attrs in sorted(by_alias.items()):
            attr = min(attrs)
            etype = alias_type[alias]
            if mapping.setdefault(etype, attr) != attr:
                ok = False
        if ok:
            return mapping
    return {}
