"""What the query parsers share (cep.sase.parser, cep.intervals.parser, cep.constraints.regex): the comparison
operators and their literals, a tokenizer over a parser's own token pattern, and a cursor over its tokens.  A module
of its own so cep.constraints can use it without importing the cep.sase package (whose engine imports
cep.constraints)."""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from contract.units import UNIT_US

__all__ = ["COMPARISONS", "FLIPPED", "Scalar", "Token", "TokenCursor", "canonical_op", "is_literal",
           "literal_value", "token_pattern", "tokenize"]

Scalar = int | float | str | bool | None

COMPARISONS: dict[str, Callable[[Any, Any], bool]] = {
    "=": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}
# ``a op b`` is ``b FLIPPED[op] a``: how a condition written constant-first is stored attribute-first.
FLIPPED: dict[str, str] = {"=": "=", "!=": "!=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}
_SPELLINGS = {"==": "=", "<>": "!="}


def canonical_op(text: str) -> str:
    """The comparison as :data:`COMPARISONS` spells it (``==`` is ``=``, ``<>`` is ``!=``)."""
    return _SPELLINGS.get(text, text)


@dataclass(frozen=True, slots=True)
class Token:
    kind: str
    text: str
    pos: int


def token_pattern(punct: str) -> re.Pattern[str]:
    """The token grammar of SASE and constraint texts; ``punct`` is a regex character class of the grammar's own
    punctuation."""
    return re.compile(
        rf"""
        (?P<ws>\s+)
      | (?P<number>-?\d+(?:\.\d+)?)
      | (?P<string>'[^']*'|"[^"]*")
      | (?P<badstring>['"])
      | (?P<op><=|>=|!=|<>|==|=|<|>)
      | (?P<name>[A-Za-z_][A-Za-z0-9_]*(?:-[A-Za-z0-9_]+)*)
      | (?P<punct>{punct})
        """,
        re.VERBOSE,
    )


def tokenize(text: str, pattern: re.Pattern[str], error: Callable[[str, str, int], Exception], *,
             quote_char: bool = True) -> list[Token]:
    """``text`` as tokens of ``pattern``'s named groups (``ws`` skipped, ``badstring`` an unterminated string),
    ending with an ``end`` token; each parser brings its own token pattern and error class.  ``quote_char=False``
    keeps ISEQ's message, which has never named the character (its caret shows it)."""
    toks: list[Token] = []
    pos = 0
    while pos < len(text):
        m = pattern.match(text, pos)
        if m is None:
            raise error(f"unexpected character {text[pos]!r}" if quote_char else "unexpected character", text, pos)
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
    """The value of a token :func:`is_literal` accepts: an int unless the number has a fraction."""
    if tok.kind == "number":
        return float(tok.text) if "." in tok.text else int(tok.text)
    if tok.kind == "string":
        return tok.text[1:-1]
    return tok.text.upper() == "TRUE"


class TokenCursor:
    """A parser's position in its tokens; each grammar subclasses it and says how its errors read (:meth:`error`)."""

    keywords: frozenset[str] = frozenset()
    """Upper-case words that :meth:`name` does not take as a name."""

    def __init__(self, text: str, toks: list[Token]) -> None:
        self.text = text
        self.toks = toks
        self.i = 0

    @property
    def tok(self) -> Token:
        return self.toks[self.i]

    def error(self, message: str, tok: Token | None = None) -> Exception:
        raise NotImplementedError

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

    def unit_factor(self) -> int:
        """Microseconds per unit of an optional unit name after a window's number (1 without one)."""
        if self.tok.kind != "name":
            return 1
        unit = self.tok.text.lower()
        if unit not in UNIT_US:
            raise self.error(f"unknown time unit (use one of {', '.join(UNIT_US)})")
        self.advance()
        return UNIT_US[unit]
