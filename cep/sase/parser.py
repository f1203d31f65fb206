"""Text syntax of sequence queries (close to SASE / Li et al.):

    EVENT SEQ(SHELF s, !(CHECKOUT c), EXIT e)
    WHERE s.id = c.id AND c.id = e.id
    WITHIN 1 hour

Grammar (keywords are case-insensitive)::

    query     := 'EVENT' 'SEQ' '(' element (',' element)* ')' ['WHERE' condition ('AND' condition)*] 'WITHIN' window
    element   := ['!'] ( '(' TYPE [alias] ')' | TYPE [alias] )
    condition := '[' ATTR ']'                 -- SASE shorthand: every element's ATTR is equal
               | operand OP operand           -- OP: = == != <> < <= > >=; at least one side is alias.attr
    operand   := alias '.' attr | NUMBER | 'string' | "string" | TRUE | FALSE
    window    := NUMBER [unit]                -- no unit: the stream's own time unit;
                                              -- us, ms, s/sec/second(s), min/minute(s), h/hour(s): microseconds

Without an alias an element's alias is its type name.  Errors are :class:`SaseSyntaxError` with the position.
"""

from __future__ import annotations

import itertools

from cep.lexer import Token, TokenCursor, token_pattern
from cep.query_ast import parse_comparison, parse_element
from contract.units import UNIT_US

from .events import SaseError, SaseSyntaxError
from .query import AttrRef, Element, Predicate, Query

__all__ = ["UNIT_US", "parse_query"]

_TOKEN = token_pattern(r"[(),!.\[\]]")


class _Parser(TokenCursor):
    keywords = frozenset({"EVENT", "SEQ", "WHERE", "AND", "WITHIN", "TRUE", "FALSE"})
    token_rules = _TOKEN
    syntax_error = SaseSyntaxError
    end_name = "end of query"

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self._element_toks: list[Token] = []

    def parse(self) -> Query:
        self.expect_kw("EVENT")
        self.expect_kw("SEQ")
        seq_open = self.expect_punct("(")
        elements = self.separated(self.element, lambda: self.is_punct(","))
        if not self.is_punct(")"):
            raise self.error("expected ',' or ')'")
        self.advance()
        seen: dict[str, Element] = {}
        for el, tok in zip(elements, self._element_toks, strict=True):
            if el.alias in seen:
                raise SaseSyntaxError(f"duplicate alias {el.alias!r} (give each element its own alias)", self.text,
                                      tok.pos)
            seen[el.alias] = el
        if all(e.negated for e in elements):
            raise SaseSyntaxError("SEQ needs at least one positive (non-negated) element", self.text, seq_open.pos)
        # A '[attr]' condition stands for several predicates.
        predicates = [p for written in self.where_clause(lambda: self.condition(elements)) for p in written]
        if not self.is_kw("WITHIN"):
            raise self.error("expected WITHIN <window> (a window is required: it bounds the engine's state)"
                             if self.tok.kind == "end" else "expected WHERE, AND or WITHIN")
        self.advance()
        window = self.window("time units")
        if self.tok.kind != "end":
            raise self.error("expected end of query")
        try:
            return Query(tuple(elements), tuple(predicates), window, text=self.text)
        except SaseError as exc:
            raise SaseSyntaxError(str(exc), self.text, 0) from exc

    def element(self) -> Element:
        element, alias_tok = parse_element(self)
        self._element_toks.append(alias_tok)
        return element

    def condition(self, elements: list[Element]) -> list[Predicate]:
        if self.is_punct("["):
            self.advance()
            attr = self.name("an attribute name").text
            self.expect_punct("]")
            return [
                Predicate(AttrRef(a.alias, attr), "=", AttrRef(b.alias, attr))
                for a, b in itertools.pairwise(elements)
            ]
        predicate, start = parse_comparison(self, {e.alias for e in elements})
        if isinstance(predicate.right, AttrRef):
            negated = {e.alias for e in elements if e.negated}
            if predicate.aliases() <= negated:
                raise SaseSyntaxError("a condition may not relate two negated elements", self.text, start.pos)
            if predicate.left.alias == predicate.right.alias:
                raise SaseSyntaxError("a condition must relate two different elements (or compare with a "
                                      "constant)", self.text, start.pos)
        return [predicate]


def parse_query(text: str) -> Query:
    """Parse the text syntax into a :class:`Query`; raises :class:`SaseSyntaxError` with the position."""
    return _Parser(text).parse()
