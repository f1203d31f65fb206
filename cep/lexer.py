"""What the query parsers share (cep.sase.parser, cep.constraints.regex): the comparison operators and their
literals, and a tokenizer over a parser's own token pattern.  A module of its own so cep.constraints can use it
without importing the cep.sase package (whose engine imports cep.constraints)."""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["COMPARISONS", "Scalar", "Token", "tokenize"]

Scalar = int | float | str | bool | None

COMPARISONS: dict[str, Callable[[Any, Any], bool]] = {
    "=": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


@dataclass(frozen=True, slots=True)
class Token:
    kind: str
    text: str
    pos: int


def tokenize(text: str, pattern: re.Pattern[str], error: Callable[[str, str, int], Exception]) -> list[Token]:
    """``text`` as tokens of ``pattern``'s named groups (``ws`` skipped, ``badstring`` an unterminated string),
    ending with an ``end`` token; each parser brings its own token pattern and error class."""
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
