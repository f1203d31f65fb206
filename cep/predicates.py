"""Boolean conditions on event payloads and their small text syntax (used by pattern elements).

Grammar (case-insensitive keywords)::

    expr    := or
    or      := and ('OR' and)*
    and     := not ('AND' not)*
    not     := 'NOT' not | '(' expr ')' | compare
    compare := FIELD OP literal | FIELD 'IN' '(' literal (',' literal)* ')'
    OP      := '==' | '=' | '!=' | '<' | '<=' | '>' | '>='
    literal := 'text' | "text" | number | true | false | null
    FIELD   := name ('.' name)*        (dots walk nested objects)

A comparison on a missing field, or an ordering comparison between values that cannot be ordered (a string and a
number), is false rather than an error: an event that does not carry the field simply does not match.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any, ClassVar

from cep.lexer import (
    COMPARISONS,
    PATTERN_SPELLINGS,
    QuerySyntaxError,
    TokenCursor,
    canonical_op,
    is_literal,
    literal_value,
    token_pattern,
)

__all__ = ["And", "Cmp", "Condition", "ConditionCursor", "ConditionSyntaxError", "Not", "Or", "parse_condition"]

_MISSING = object()


def _lookup(payload: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    cur: Any = payload
    for part in path:
        # A parsed payload is dicts all the way down: their exact type first, the ABC check only for others.
        if type(cur) is dict:
            cur = cur.get(part, _MISSING)
            if cur is _MISSING:
                return _MISSING
            continue
        if not isinstance(cur, Mapping) or part not in cur:
            return _MISSING
        cur = cur[part]
    return cur


def _literal_text(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return repr(value)


@dataclass(frozen=True, slots=True)
class Cmp:
    """``field OP value`` (``op`` one of ``== != < <= > >= in``; for ``in``, ``value`` is a tuple)."""

    field: str
    op: str
    value: Any
    # Derived once from field and op (a condition runs once per event and element): not part of its identity.
    _path: tuple[str, ...] = dataclass_field(init=False, repr=False, compare=False)
    _test: Callable[[Any, Any], bool] | None = dataclass_field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.op != "in" and self.op not in _SPELLED:
            raise ValueError(f"unknown operator {self.op!r}")
        object.__setattr__(self, "_path", tuple(self.field.split(".")))
        object.__setattr__(self, "_test", None if self.op == "in" else COMPARISONS[canonical_op(self.op)])

    def __call__(self, payload: Mapping[str, Any]) -> bool:
        got = _lookup(payload, self._path)
        if got is _MISSING:
            return False
        test = self._test
        if test is None:
            return bool(got in self.value)
        try:
            return bool(test(got, self.value))
        except TypeError:
            return False

    def to_text(self) -> str:
        if self.op == "in":
            return f"{self.field} IN ({', '.join(_literal_text(v) for v in self.value)})"
        return f"{self.field} {self.op} {_literal_text(self.value)}"


@dataclass(frozen=True, slots=True)
class _Junction:
    """``parts`` joined by the subclass's keyword: true when ``holds`` (all or any) of them are."""

    parts: tuple[Condition, ...]
    keyword: ClassVar[str]
    holds: ClassVar[Callable[[Iterable[object]], bool]]

    def __call__(self, payload: Mapping[str, Any]) -> bool:
        return type(self).holds(p(payload) for p in self.parts)

    def to_text(self) -> str:
        return f" {self.keyword} ".join(_wrap(p) for p in self.parts)


@dataclass(frozen=True, slots=True)
class And(_Junction):
    keyword = "AND"
    holds = all


@dataclass(frozen=True, slots=True)
class Or(_Junction):
    keyword = "OR"
    holds = any


@dataclass(frozen=True, slots=True)
class Not:
    part: Condition

    def __call__(self, payload: Mapping[str, Any]) -> bool:
        return not self.part(payload)

    def to_text(self) -> str:
        return f"NOT {_wrap(self.part)}"


Condition = Cmp | And | Or | Not


def _wrap(c: Condition) -> str:
    return c.to_text() if isinstance(c, Cmp) else f"({c.to_text()})"


_TOKEN = token_pattern(
    r"[(),:]",
    number=r"-?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?",
    string=r"'(?:[^'\\]|\\.)*'" + "|" + r'"(?:[^"\\]|\\.)*"',
    name=r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*",
)
"""The pattern language's token rules: strings with backslash escapes, numbers with exponents, dotted field names
(``:`` names a pattern's element, cep.patterns)."""
_SPELLED = frozenset(PATTERN_SPELLINGS.values())


def _pattern_op(text: str) -> str | None:
    """The operator as a :class:`Cmp` spells it (``=`` reads as ``==``), or None for a spelling this language
    does not read."""
    if text in PATTERN_SPELLINGS:
        return PATTERN_SPELLINGS[text]
    return text if text in _SPELLED else None


class ConditionSyntaxError(QuerySyntaxError):
    """A condition, or a pattern of them (cep.patterns.PatternSpec.parse), that does not parse."""


class ConditionCursor(TokenCursor):
    """The condition grammar of the module docstring over the pattern language's tokens; cep.patterns reads a
    pattern's elements with it."""

    keywords = frozenset({"AND", "OR", "NOT", "IN", "TRUE", "FALSE", "NULL"})
    token_rules = _TOKEN
    syntax_error = ConditionSyntaxError
    end_word = "end of condition"

    def shown(self) -> str:
        """The current token as messages show it: keywords in lower case, the end as :attr:`end_word`."""
        t = self.tok
        if t.kind == "end":
            return self.end_word
        return t.text.lower() if t.kind == "name" and t.text.upper() in self.keywords else t.text

    def take(self, kind: str, text: str | None = None) -> str:
        """The current token's text if it is a ``kind`` (a name that is no keyword), and ``text`` if given."""
        t = self.tok
        if t.kind != kind or (text is not None and t.text != text) or (kind == "name" and not self.at_name()):
            raise self.error(f"expected {text or kind}, got {self.shown()!r}")
        return self.advance().text

    def accept(self, word: str) -> bool:
        """Step over the keyword or punctuation ``word`` if it is the current token."""
        if self.is_kw(word.upper()) or self.is_punct(word):
            self.advance()
            return True
        return False

    def condition(self) -> Condition:
        parts = [self.conjunction()]
        while self.accept("or"):
            parts.append(self.conjunction())
        return parts[0] if len(parts) == 1 else Or(tuple(parts))

    def conjunction(self) -> Condition:
        parts = [self.negation()]
        while self.accept("and"):
            parts.append(self.negation())
        return parts[0] if len(parts) == 1 else And(tuple(parts))

    def negation(self) -> Condition:
        if self.accept("not"):
            return Not(self.negation())
        if self.accept("("):
            inner = self.condition()
            self.take("punct", ")")
            return inner
        field = self.take("name")
        if self.accept("in"):
            self.take("punct", "(")
            values = [self.literal()]
            while self.accept(","):
                values.append(self.literal())
            self.take("punct", ")")
            return Cmp(field, "in", tuple(values))
        op_tok = self.tok
        op = _pattern_op(self.take("op"))
        if op is None:
            raise self.error(f"unknown comparison {op_tok.text!r} (use {', '.join(sorted(_SPELLED))})", op_tok)
        return Cmp(field, op, self.literal())

    def literal(self) -> Any:
        t = self.tok
        if t.kind == "end":
            raise self.error(f"expected a literal, got {self.end_word}")
        if t.kind == "string":
            self.advance()
            return re.sub(r"\\(.)", r"\1", t.text[1:-1])
        if is_literal(t) or self.is_kw("NULL"):
            self.advance()
            return None if t.text.upper() == "NULL" else literal_value(t)
        raise self.error(f"expected a literal, got {self.shown()!r}")


def parse_condition(text: str) -> Condition:
    """Parse the condition syntax in the module docstring; raises :class:`ConditionSyntaxError`."""
    cursor = ConditionCursor(text)
    cond = cursor.condition()
    if cursor.tok.kind != "end":
        raise cursor.error(f"unexpected {cursor.shown()!r}")
    return cond
