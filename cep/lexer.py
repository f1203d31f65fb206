"""What the query languages share (pattern conditions in cep.predicates and cep.patterns, SASE in cep.sase.parser,
ISEQ in cep.intervals.parser, constraints in cep.constraints.regex): the one comparison table, one tokenizer over a
token grammar each language picks its rules for, a cursor over the tokens, and the one syntax error every parser
raises.  A module of its own so cep.constraints can use it without importing the cep.sase package (whose engine
imports cep.constraints)."""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from contract.units import UNIT_US

__all__ = ["COMPARISONS", "FLIPPED", "PATTERN_SPELLINGS", "SPELLINGS", "Comparison", "QuerySyntaxError", "Scalar",
           "Token", "TokenCursor", "canonical_op", "is_literal", "literal_value", "token_pattern", "tokenize"]

Scalar = int | float | str | bool | None
_Item = TypeVar("_Item")


@dataclass(frozen=True, slots=True)
class Comparison:
    """One comparison operator of the query languages."""

    op: str
    """The canonical spelling: how SASE, ISEQ and constraint ASTs store and print it."""
    test: Callable[[Any, Any], bool]
    flipped: str
    """``a op b`` is ``b flipped a``: how a condition written constant-first is stored attribute-first."""
    pattern_spelling: str
    """How pattern conditions (cep.predicates) store and print it: they spell equality ``==``."""
    aliases: tuple[str, ...] = ()
    """Further spellings SASE, ISEQ's WHERE and constraints read as this operator."""


_TABLE = (
    Comparison("=", operator.eq, "=", "==", ("==",)),
    Comparison("!=", operator.ne, "!=", "!=", ("<>",)),
    Comparison("<", operator.lt, ">", "<"),
    Comparison("<=", operator.le, ">=", "<="),
    Comparison(">", operator.gt, "<", ">"),
    Comparison(">=", operator.ge, "<=", ">="),
)
COMPARISONS: dict[str, Callable[[Any, Any], bool]] = {c.op: c.test for c in _TABLE}
FLIPPED: dict[str, str] = {c.op: c.flipped for c in _TABLE}
SPELLINGS: dict[str, str] = {s: c.op for c in _TABLE for s in (c.op, *c.aliases)}
"""Every spelling a query text may use -> the canonical operator."""
PATTERN_SPELLINGS: dict[str, str] = {c.op: c.pattern_spelling for c in _TABLE}
"""Canonical operator -> how pattern conditions spell it; they read either spelling (``=`` and ``==``), not the
other aliases (``<>``)."""


def canonical_op(text: str) -> str:
    """The comparison as :data:`COMPARISONS` spells it (``==`` is ``=``, ``<>`` is ``!=``)."""
    return SPELLINGS.get(text, text)


class QuerySyntaxError(ValueError):
    """A query text of any of the languages that does not parse.  ``position`` is the 0-based character offset of
    the problem (``line`` and ``column`` count from 1); the message reads the same in every language: what is
    wrong, where, then the line of the text with a caret under the offset."""

    def __init__(self, message: str, text: str, position: int) -> None:
        self.message = message
        self.text = text
        self.position = position
        line_start = text.rfind("\n", 0, position) + 1
        line_end = text.find("\n", position)
        self.line = text.count("\n", 0, position) + 1
        self.column = position - line_start + 1
        source_line = text[line_start : len(text) if line_end < 0 else line_end]
        caret = " " * (position - line_start) + "^"
        super().__init__(f"{message} at line {self.line}, column {self.column}\n  {source_line}\n  {caret}")


@dataclass(frozen=True, slots=True)
class Token:
    kind: str
    text: str
    pos: int


NUMBER = r"-?\d+(?:\.\d+)?"
STRING = "'[^']*'|" + '"[^"]*"'
NAME = r"[A-Za-z_][A-Za-z0-9_]*(?:-[A-Za-z0-9_]+)*"
"""Names may have dashes inside (SASE's event types)."""
_OPERATOR = "|".join(re.escape(s) for s in sorted(SPELLINGS, key=len, reverse=True))


def token_pattern(punct: str, *, number: str = NUMBER, string: str = STRING, name: str = NAME,
                  extra: str = "") -> re.Pattern[str]:
    """The token grammar of the query texts: whitespace, numbers, quoted strings, the comparison spellings of
    :data:`SPELLINGS`, names and ``punct`` (a regex character class of the language's own punctuation).  A language
    may bring its own rule for numbers, strings and names, and ``extra`` named groups tried before the operators."""
    return re.compile(
        rf"""
        (?P<ws>\s+)
      | (?P<number>{number})
      | (?P<string>{string})
      | (?P<badstring>['"])
      {'| ' + extra if extra else ''}
      | (?P<op>{_OPERATOR})
      | (?P<name>{name})
      | (?P<punct>{punct})
        """,
        re.VERBOSE,
    )


def tokenize(text: str, pattern: re.Pattern[str], error: Callable[[str, str, int], Exception]) -> list[Token]:
    """``text`` as tokens of ``pattern``'s named groups (``ws`` skipped, ``badstring`` an unterminated string),
    ending with an ``end`` token; ``error`` is the language's :class:`QuerySyntaxError`."""
    toks: list[Token] = []
    pos = 0
    while pos < len(text):
        m = pattern.match(text, pos)
        if m is None:
            raise error(f"unexpected character {text[pos]!r}", text, pos)
        kind = m.lastgroup or ""
        if kind == "badstring":
            raise error("unterminated string", text, pos)
        if kind != "ws":
            toks.append(Token(kind, m.group(), pos))
        pos = m.end()
    toks.append(Token("end", "", len(text)))
    return toks


def is_literal(tok: Token) -> bool:
    """A number, a quoted string, TRUE or FALSE (any case)."""
    return tok.kind in ("number", "string") or (tok.kind == "name" and tok.text.upper() in ("TRUE", "FALSE"))


def literal_value(tok: Token) -> Scalar:
    """The value of a token :func:`is_literal` accepts: an int unless the number has a fraction or an exponent."""
    if tok.kind == "number":
        return float(tok.text) if any(c in tok.text for c in ".eE") else int(tok.text)
    if tok.kind == "string":
        return tok.text[1:-1]
    return tok.text.upper() == "TRUE"


class TokenCursor:
    """A parser's position in its tokens; each language subclasses it with its token rules and error class."""

    keywords: frozenset[str] = frozenset()
    """Upper-case words that :meth:`name` does not take as a name."""
    token_rules: ClassVar[re.Pattern[str]]
    """The language's :func:`token_pattern`."""
    syntax_error: type[QuerySyntaxError] = QuerySyntaxError
    """The language's subclass of :class:`QuerySyntaxError`."""
    end_name: str | None = None
    """How :meth:`error` names the end of the text after ``, found``; None: its messages do not say what was
    found (the caret shows it)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.toks = tokenize(text, self.token_rules, self.syntax_error)
        self.i = 0

    @property
    def tok(self) -> Token:
        return self.toks[self.i]

    def error(self, message: str, tok: Token | None = None) -> QuerySyntaxError:
        """The language's :attr:`syntax_error` at ``tok`` (the current token without one); with :attr:`end_name`
        the message goes on to say what was found there."""
        t = tok or self.tok
        if self.end_name is not None:
            message += f", found {self.end_name if t.kind == 'end' else repr(t.text)}"
        return self.syntax_error(message, self.text, t.pos)

    def advance(self) -> Token:
        t = self.toks[self.i]
        self.i += 1
        return t

    def is_kw(self, word: str) -> bool:
        return self.tok.kind == "name" and self.tok.text.upper() == word

    def is_punct(self, ch: str) -> bool:
        return self.tok.kind == "punct" and self.tok.text == ch

    def at_name(self) -> bool:
        return self.tok.kind == "name" and self.tok.text.upper() not in self.keywords

    def name(self, what: str) -> Token:
        """A name that is not one of :attr:`keywords`; else the error ``expected <what>``."""
        if not self.at_name():
            raise self.error(f"expected {what}")
        return self.advance()

    def expect_kw(self, word: str) -> Token:
        if not self.is_kw(word):
            raise self.error(f"expected {word}")
        return self.advance()

    def expect_punct(self, ch: str) -> Token:
        if not self.is_punct(ch):
            raise self.error(f"expected {ch!r}")
        return self.advance()

    def separated(self, item: Callable[[], _Item], separator: Callable[[], bool]) -> list[_Item]:
        """The grammar's ``item (SEPARATOR item)*``: one item, then another after each separator token, while
        ``separator()`` holds at the cursor."""
        items = [item()]
        while separator():
            self.advance()
            items.append(item())
        return items

    def where_clause(self, condition: Callable[[], _Item]) -> list[_Item]:
        """An optional ``'WHERE' cond ('AND' cond)*`` (SASE and ISEQ): its conditions, none without WHERE."""
        if not self.is_kw("WHERE"):
            return []
        self.advance()
        return self.separated(condition, lambda: self.is_kw("AND"))

    def window(self, units: str) -> int:
        """``NUMBER [unit]`` at the cursor in microseconds (:meth:`unit_factor`); it must come to a positive whole
        number, which the error calls a whole number of ``units``."""
        t = self.tok
        if t.kind != "number" or t.text.startswith("-"):
            raise self.error("expected a positive window length")
        self.advance()
        factor = self.unit_factor()
        value = float(t.text) * factor if "." in t.text else int(t.text) * factor
        if value != int(value) or int(value) <= 0:
            raise self.syntax_error(f"the window must be a positive whole number of {units}", self.text, t.pos)
        return int(value)

    def unit_factor(self) -> int:
        """Microseconds per unit of an optional unit name after a window's number (1 without one)."""
        if self.tok.kind != "name":
            return 1
        unit = self.tok.text.lower()
        if unit not in UNIT_US:
            raise self.error(f"unknown time unit (use one of {', '.join(UNIT_US)})")
        self.advance()
        return UNIT_US[unit]
