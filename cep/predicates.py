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
from typing import Any, ClassVar

from cep.lexer import COMPARISONS

__all__ = ["And", "Cmp", "Condition", "ConditionSyntaxError", "Not", "Or", "parse_condition"]

_MISSING = object()
# This syntax spells equality ``==`` (``=`` is read as ``==``); otherwise the one comparison table.
_OPS = {("==" if op == "=" else op): fn for op, fn in COMPARISONS.items()}


def _lookup(payload: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    cur: Any = payload
    for part in path:
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

    def __post_init__(self) -> None:
        if self.op != "in" and self.op not in _OPS:
            raise ValueError(f"unknown operator {self.op!r}")

    def __call__(self, payload: Mapping[str, Any]) -> bool:
        got = _lookup(payload, tuple(self.field.split(".")))
        if got is _MISSING:
            return False
        if self.op == "in":
            return bool(got in self.value)
        try:
            return bool(_OPS[self.op](got, self.value))
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


_TOKEN = re.compile(
    r"""\s*(?:
        (?P<str>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")
      | (?P<num>-?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)
      | (?P<op>==|!=|<=|>=|<|>|=)
      | (?P<punct>[(),])
      | (?P<name>[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)
    )""",
    re.VERBOSE,
)
_KEYWORDS = {"and", "or", "not", "in", "true", "false", "null"}


class ConditionSyntaxError(ValueError):
    """A condition that does not parse; ``position`` is the 0-based character offset of the problem, shown with a
    caret under the text, as the other query languages' errors are (cep.sase.events.SaseSyntaxError)."""

    def __init__(self, message: str, text: str, position: int) -> None:
        self.message, self.text, self.position = message, text, position
        super().__init__(f"{message} at column {position + 1} of the condition {text!r}\n  {text}\n  {' ' * position}^")


def _tokenize(text: str) -> list[tuple[str, str, int]]:
    """(kind, value, offset) per token, ending with ("end", "", len(text))."""
    tokens: list[tuple[str, str, int]] = []
    pos = 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        m = _TOKEN.match(text, pos)
        if m is None:
            start = len(text) - len(text[pos:].lstrip())
            raise ConditionSyntaxError(f"unexpected character {text[start]!r}", text, start)
        kind = m.lastgroup or ""
        value, start = m.group(kind), m.start(kind)
        if kind == "name" and value.lower() in _KEYWORDS:
            kind, value = "kw", value.lower()
        tokens.append((kind, value, start))
        pos = m.end()
    tokens.append(("end", "", len(text)))
    return tokens


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = _tokenize(text)
        self.i = 0

    def peek(self) -> tuple[str, str] | None:
        kind, value, _pos = self.tokens[self.i]
        return None if kind == "end" else (kind, value)

    def error(self, message: str) -> ConditionSyntaxError:
        return ConditionSyntaxError(message, self.text, self.tokens[self.i][2])

    def take(self, kind: str, value: str | None = None) -> str:
        tok = self.peek()
        if tok is None or tok[0] != kind or (value is not None and tok[1] != value):
            raise self.error(f"expected {value or kind}, got {tok[1] if tok else 'end of condition'!r}")
        self.i += 1
        return tok[1]

    def accept(self, kind: str, value: str) -> bool:
        tok = self.peek()
        if tok is not None and tok == (kind, value):
            self.i += 1
            return True
        return False

    def parse(self) -> Condition:
        cond = self.parse_or()
        tok = self.peek()
        if tok is not None:
            raise self.error(f"unexpected {tok[1]!r}")
        return cond

    def parse_or(self) -> Condition:
        parts = [self.parse_and()]
        while self.accept("kw", "or"):
            parts.append(self.parse_and())
        return parts[0] if len(parts) == 1 else Or(tuple(parts))

    def parse_and(self) -> Condition:
        parts = [self.parse_not()]
        while self.accept("kw", "and"):
            parts.append(self.parse_not())
        return parts[0] if len(parts) == 1 else And(tuple(parts))

    def parse_not(self) -> Condition:
        if self.accept("kw", "not"):
            return Not(self.parse_not())
        if self.accept("punct", "("):
            inner = self.parse_or()
            self.take("punct", ")")
            return inner
        field = self.take("name")
        if self.accept("kw", "in"):
            self.take("punct", "(")
            values = [self.literal()]
            while self.accept("punct", ","):
                values.append(self.literal())
            self.take("punct", ")")
            return Cmp(field, "in", tuple(values))
        op = self.take("op")
        return Cmp(field, "==" if op == "=" else op, self.literal())

    def literal(self) -> Any:
        tok = self.peek()
        if tok is None:
            raise self.error("expected a literal, got end of condition")
        kind, value = tok
        if kind == "str":
            self.i += 1
            return re.sub(r"\\(.)", r"\1", value[1:-1])
        if kind == "num":
            self.i += 1
            return float(value) if any(c in value for c in ".eE") else int(value)
        if kind == "kw" and value in ("true", "false", "null"):
            self.i += 1
            return {"true": True, "false": False, "null": None}[value]
        raise self.error(f"expected a literal, got {value!r}")


def parse_condition(text: str) -> Condition:
    """Parse the condition syntax in the module docstring."""
    return _Parser(text).parse()
