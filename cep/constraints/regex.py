"""Constraint text: a regular expression over event types, parsed into a small AST.

Grammar (Li 2010, §3.2: a constraint is a regular expression over the event types of a workflow)::

    alternation := sequence ('|' sequence)*
    sequence    := postfix+                      -- juxtaposition, symbols separated by whitespace or operators
    postfix     := atom ('*' | '+' | '?')*
    atom        := symbol | '(' alternation ')'
    symbol      := TYPE ['[' cond (',' cond)* ']']   -- A, SHELF, A[id=3], A[id != 3, price >= 2.5]
    cond        := ATTR OP literal               -- OP: = == != <> < <= > >=; literal: number, 'string', TRUE, FALSE

Type names are identifiers (``[A-Za-z_][A-Za-z0-9_]*``, dashes inside allowed like cep.sase's types), so ``AB`` is one
type named ``AB``: write ``A B`` for A followed by B.  A symbol with conditions stands for the events of that type
whose attributes satisfy all of them (Ex. 3.8's alphabet refinement); a condition on a missing attribute, or one
that cannot compare (``'x' < 3``), is false, as in cep.sase.

Errors are :class:`ConstraintSyntaxError` (a :class:`ConstraintError`) with the 0-based ``position`` of the problem
in the text.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cep.lexer import (
    COMPARISONS,
    QuerySyntaxError,
    Scalar,
    TokenCursor,
    canonical_op,
    is_literal,
    literal_value,
    token_pattern,
)
from cep.lexer import Token as Tok

__all__ = [
    "Alt",
    "Cat",
    "Cond",
    "ConstraintError",
    "ConstraintSyntaxError",
    "Node",
    "Opt",
    "Plus",
    "Star",
    "Sym",
    "parse_constraint",
]


class ConstraintError(ValueError):
    """A constraint or pattern the checker cannot use: a text that does not parse (:class:`ConstraintSyntaxError`),
    a bad argument, a query it cannot key by trace."""

    def __init__(self, message: str) -> None:
        self.message = message
        super().__init__(message)


class ConstraintSyntaxError(ConstraintError, QuerySyntaxError):
    """A constraint or pattern text that does not parse (:class:`cep.lexer.QuerySyntaxError`: ``position``,
    ``line``, ``column`` and the caret under the problem)."""

    def __init__(self, message: str, text: str, position: int) -> None:
        QuerySyntaxError.__init__(self, message, text, position)


@dataclass(frozen=True, slots=True)
class Cond:
    """``attr op value`` on one event's attributes."""

    attr: str
    op: str
    value: Scalar

    def holds(self, attrs: Mapping[str, Any]) -> bool:
        """False for a missing attribute or values that cannot be compared, never an exception (as cep.sase)."""
        if self.attr not in attrs:
            return False
        try:
            return bool(COMPARISONS[self.op](attrs[self.attr], self.value))
        except TypeError:
            return False

    def __str__(self) -> str:
        return f"{self.attr}{self.op}{self.value!r}" if isinstance(self.value, str) else (
            f"{self.attr}{self.op}{self.value}"
        )


@dataclass(frozen=True, slots=True)
class Sym:
    """A symbol: an event type, optionally refined by conditions on its attributes (all must hold)."""

    event_type: str
    conds: tuple[Cond, ...] = ()

    def __str__(self) -> str:
        if not self.conds:
            return self.event_type
        return f"{self.event_type}[{', '.join(str(c) for c in self.conds)}]"


@dataclass(frozen=True, slots=True)
class Cat:
    parts: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class Alt:
    options: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class Star:
    inner: Node


@dataclass(frozen=True, slots=True)
class Plus:
    inner: Node


@dataclass(frozen=True, slots=True)
class Opt:
    inner: Node


Node = Sym | Cat | Alt | Star | Plus | Opt


_TOKEN = token_pattern(r"[()|*+?\[\],!]")


class TokenStream(TokenCursor):
    """Shared by the constraint parser and the pattern parser (cep.constraints.pattern)."""

    token_rules = _TOKEN
    syntax_error = ConstraintSyntaxError
    end_name = "end of text"

    def at(self, text: str) -> bool:
        return self.tok.kind in ("punct", "op") and self.tok.text == text

    def expect(self, text: str, what: str) -> Tok:
        if not self.at(text):
            raise self.error(f"expected {what}")
        return self.advance()

    def symbol(self) -> Sym:
        """``TYPE ['[' cond (',' cond)* ']']``."""
        t = self.tok
        if t.kind != "name":
            raise self.error("expected an event type")
        self.advance()
        conds: list[Cond] = []
        if self.at("["):
            self.advance()
            while True:
                conds.append(self._cond())
                if self.at(","):
                    self.advance()
                    continue
                self.expect("]", "',' or ']' after a condition")
                break
        return Sym(t.text, tuple(conds))

    def _cond(self) -> Cond:
        a = self.tok
        if a.kind != "name" or a.text.upper() in ("TRUE", "FALSE"):
            raise self.error("expected an attribute name")
        self.advance()
        o = self.tok
        if o.kind != "op":
            raise self.error("expected a comparison (= != < <= > >=)")
        self.advance()
        if not is_literal(self.tok):
            raise self.error("expected a literal (number, 'string', TRUE, FALSE)")
        return Cond(a.text, canonical_op(o.text), literal_value(self.advance()))


class _Parser(TokenStream):
    def parse(self) -> Node:
        if self.tok.kind == "end":
            raise ConstraintSyntaxError("empty constraint: give a regular expression over event types", self.text, 0)
        node = self._alternation()
        if self.tok.kind != "end":
            if self.at(")"):
                raise self.error("unbalanced ')'")
            raise self.error("expected an event type, '(', an operator or the end")
        return node

    def _alternation(self) -> Node:
        options = [self._sequence()]
        while self.at("|"):
            self.advance()
            options.append(self._sequence())
        return options[0] if len(options) == 1 else Alt(tuple(options))

    def _sequence(self) -> Node:
        parts: list[Node] = []
        while self.tok.kind == "name" or self.at("("):
            parts.append(self._postfix())
        if not parts:
            if self.at("*") or self.at("+") or self.at("?"):
                raise self.error(f"'{self.tok.text}' needs something before it to repeat")
            raise self.error("expected an event type or '('")
        return parts[0] if len(parts) == 1 else Cat(tuple(parts))

    def _postfix(self) -> Node:
        node = self._atom()
        while self.at("*") or self.at("+") or self.at("?"):
            op = self.advance().text
            node = Star(node) if op == "*" else Plus(node) if op == "+" else Opt(node)
        return node

    def _atom(self) -> Node:
        if self.at("("):
            open_tok = self.advance()
            if self.at(")"):
                raise self.error("empty parentheses")
            node = self._alternation()
            if not self.at(")"):
                raise self.error(f"'(' at position {open_tok.pos} is not closed")
            self.advance()
            return node
        return self.symbol()


def parse_constraint(text: str) -> Node:
    """Parse a constraint regular expression (see the module docstring for the grammar)."""
    return _Parser(text).parse()


def symbols_of(node: Node) -> list[Sym]:
    """Every symbol occurrence, left to right."""
    if isinstance(node, Sym):
        return [node]
    if isinstance(node, Cat):
        return [s for p in node.parts for s in symbols_of(p)]
    if isinstance(node, Alt):
        return [s for p in node.options for s in symbols_of(p)]
    return symbols_of(node.inner)


def to_text(node: Node) -> str:
    """Canonical text of an AST (round-trips through :func:`parse_constraint`)."""
    if isinstance(node, Sym):
        return str(node)
    if isinstance(node, Cat):
        return " ".join(_wrap(p, (Alt,)) for p in node.parts)
    if isinstance(node, Alt):
        return " | ".join(to_text(p) for p in node.options)
    op = "*" if isinstance(node, Star) else "+" if isinstance(node, Plus) else "?"
    return _wrap(node.inner, (Alt, Cat)) + op


def _wrap(node: Node, kinds: tuple[type, ...]) -> str:
    return f"({to_text(node)})" if isinstance(node, kinds) else to_text(node)
