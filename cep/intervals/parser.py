"""Text syntax of ISEQ queries (Li 2010 5.3.1 in the SASE style of :mod:`cep.sase.parser`)::

    EVENT ISEQ[A.ts < B.te AND B.te < C.te < D.te](A, B, C, D; 30 s)
    EVENT ISEQ[A^- < B^+ < C^+ < D^+](A, B, C, D; 30)
    EVENT ISEQ[a overlaps b AND b.te < c.ts AND d.ts < c.ts AND b.te < d.te](A a, B b, !D d, C c; 10) WHERE a.id = b.id

Grammar (keywords case-insensitive)::

    query    := 'EVENT' 'ISEQ' '[' [tlist] ']' '(' element (',' element)* ';' window ')' ['WHERE' cond ('AND' cond)*]
    tlist    := atom (('AND' | '∧') atom)*
    atom     := endpoint (OP endpoint)+        -- OP: < <= = > >=; a chain a < b < c is a < b AND b < c
              | alias RELATION alias           -- an Allen relation name (before, meets, overlaps/overlap, ...)
    endpoint := alias '.' ('ts' | 'te' | 'start' | 'end') | alias '^-' | alias '^+'
    element  := ['!'] ( '(' TYPE [alias] ')' | TYPE [alias] )
    cond     := operand OP operand             -- OP: = == != <> < <= > >=; one side is alias.attr
    window   := NUMBER [unit]                  -- no unit: microseconds; us, ms, s, min, h ...

Without an alias an element's alias is its type name.  Errors are :class:`IntervalSyntaxError` with the position.
"""

from __future__ import annotations

from typing import cast

from cep.lexer import FLIPPED, Token, TokenCursor, canonical_op, token_pattern
from cep.query_ast import parse_comparison, parse_element

from .events import IntervalError, IntervalSyntaxError
from .query import Constraint, ConstraintOp, Element, IntervalQuery, Predicate, allen_constraints
from .relations import ALLEN_RELATIONS, EndpointRef

__all__ = ["parse_iseq"]

_TOKEN = token_pattern(r"[()\[\],;!.∧]", name=r"[A-Za-z_][A-Za-z0-9_]*(?:-[A-Za-z]+)*",
                       extra=r"(?P<caret>\^[-+])")
_ORDERINGS = frozenset({"<", "<=", "=", ">", ">="})
"""The comparisons a TList atom may put between endpoints (any spelling :data:`cep.lexer.SPELLINGS` maps to one)."""
_RELATIONS = {*ALLEN_RELATIONS, "overlap"}
_ENDPOINT_WORDS = {"ts": "ts", "te": "te", "start": "ts", "end": "te"}


class _Parser(TokenCursor):
    token_rules = _TOKEN
    syntax_error = IntervalSyntaxError

    def is_and(self) -> bool:
        return self.is_kw("AND") or self.is_punct("∧")

    # -- query ------------------------------------------------------------------------------------------------
    def parse(self) -> IntervalQuery:
        self.expect_kw("EVENT")
        self.expect_kw("ISEQ")
        self.expect_punct("[")
        raw_atoms = [] if self.is_punct("]") else self.separated(self.atom_tokens, self.is_and)
        self.expect_punct("]")
        self.expect_punct("(")
        elements = self.separated(self.element, lambda: self.is_punct(","))
        self.expect_punct(";")
        window_us = self.window("microseconds")
        self.expect_punct(")")
        aliases = {e.alias for e in elements}
        predicates = self.where_clause(lambda: self.condition(aliases))
        if self.tok.kind != "end":
            raise self.error("unexpected text after the query")
        constraints = [c for toks in raw_atoms for c in self.atom(toks, aliases)]
        try:
            return IntervalQuery(elements, constraints, predicates, window_us, text=self.text)
        except IntervalError as exc:
            raise IntervalSyntaxError(str(exc), self.text, 0) from None

    def atom_tokens(self) -> list[Token]:
        """The tokens of one TList atom (parsed once the aliases are known: the element list comes after)."""
        out: list[Token] = []
        depth = 0
        while not (depth == 0 and (self.is_and() or self.is_punct("]"))):
            if self.tok.kind == "end":
                raise self.error("unterminated TList: expected ']'")
            out.append(self.advance())
        if not out:
            raise self.error("empty TList atom")
        return out

    def atom(self, toks: list[Token], aliases: set[str]) -> list[Constraint]:
        if len(toks) == 3 and toks[1].kind == "name" and toks[1].text.lower() in _RELATIONS:
            for t in (toks[0], toks[2]):
                if t.text not in aliases:
                    raise self.error(f"unknown element {t.text!r}", t)
            return allen_constraints(toks[1].text.lower(), toks[0].text, toks[2].text)
        j = 0

        def endpoint() -> EndpointRef:
            nonlocal j
            if j >= len(toks) or toks[j].kind != "name":
                raise self.error("expected an endpoint (alias.ts, alias.te, alias^-, alias^+)",
                                 toks[j] if j < len(toks) else toks[-1])
            name = toks[j]
            if name.text not in aliases:
                raise self.error(f"unknown element {name.text!r}", name)
            j += 1
            if j < len(toks) and toks[j].kind == "caret":
                j += 1
                return EndpointRef(name.text, "ts" if toks[j - 1].text == "^-" else "te")
            if j + 1 < len(toks) and toks[j].text == "." and toks[j + 1].text.lower() in _ENDPOINT_WORDS:
                j += 2
                return EndpointRef(name.text, _ENDPOINT_WORDS[toks[j - 1].text.lower()])  # type: ignore[arg-type]
            raise self.error("expected .ts, .te, ^- or ^+ after the element", toks[j] if j < len(toks) else name)

        out: list[Constraint] = []
        left = endpoint()
        while j < len(toks):
            op = canonical_op(toks[j].text)
            if toks[j].kind != "op" or op not in _ORDERINGS:
                raise self.error("expected <, <=, =, > or >= between endpoints", toks[j])
            j += 1
            right = endpoint()
            if op in (">", ">="):
                out.append(Constraint(right, cast(ConstraintOp, FLIPPED[op]), left))
            else:
                out.append(Constraint(left, cast(ConstraintOp, op), right))
            left = right
        if not out:
            raise self.error("a TList atom compares two endpoints", toks[0])
        return out

    def element(self) -> Element:
        return parse_element(self)[0]

    def condition(self, aliases: set[str]) -> Predicate:
        return parse_comparison(self, aliases)[0]


def parse_iseq(text: str) -> IntervalQuery:
    """Parse ``EVENT ISEQ[TList](E1, ..., Em; W) [WHERE ...]`` into a validated :class:`IntervalQuery`."""
    return _Parser(text).parse()
