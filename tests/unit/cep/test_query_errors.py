"""The four query languages (pattern, SASE, ISEQ, constraints) on one front end: every syntax error is a
cep.lexer.QuerySyntaxError that reads the same way (the message, where, the line and a caret under the offset), and
every comparison spelling means what the one comparison table says, checked against Python's operators."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import pytest

from cep.constraints import ConstraintError, ConstraintSyntaxError, parse_constraint
from cep.constraints.regex import Sym
from cep.intervals import IntervalError, IntervalSyntaxError, parse_iseq
from cep.lexer import QuerySyntaxError
from cep.patterns import PatternSpec
from cep.predicates import ConditionSyntaxError, parse_condition
from cep.sase import SaseError, SaseSyntaxError, parse_query


def caret_at(column: int) -> str:
    return " " * (column - 1) + "^"


@pytest.mark.parametrize(("parse", "text", "error", "rendered"), [
    # pattern: an element's condition, positioned in the whole pattern text
    (PatternSpec.parse, "SEQ(a: kind == 'x', b: kind ~ 'y') WITHIN 1 s", ConditionSyntaxError,
     "unexpected character '~' at line 1, column 29\n  SEQ(a: kind == 'x', b: kind ~ 'y') WITHIN 1 s\n  "
     + caret_at(29)),
    # pattern: a clause on the third line
    (PatternSpec.parse, "SEQ(kind == 'kick')\nWITHIN 2 s\nEMIT later", ConditionSyntaxError,
     "cannot parse pattern clause at 'EMIT later' at line 3, column 1\n  EMIT later\n  ^"),
    (parse_condition, "a == 1 b", ConditionSyntaxError, "unexpected 'b' at line 1, column 8\n  a == 1 b\n  "
     + caret_at(8)),
    (parse_query, "EVENT SEQ(A a, B b) WHERE a.id = c.id WITHIN 5 s", SaseSyntaxError,
     "unknown alias 'c' (known: a, b) at line 1, column 34\n  EVENT SEQ(A a, B b) WHERE a.id = c.id WITHIN 5 s\n  "
     + caret_at(34)),
    (parse_iseq, "EVENT ISEQ[a.te != b.ts](A a, B b; 10 s)", IntervalSyntaxError,
     "expected <, <=, =, > or >= between endpoints at line 1, column 17\n  EVENT ISEQ[a.te != b.ts](A a, B b; 10 s)\n  "
     + caret_at(17)),
    (parse_constraint, "A[id <> 3] B[id => 3]", ConstraintSyntaxError,
     "expected a literal (number, 'string', TRUE, FALSE), found '>' at line 1, column 18\n  A[id <> 3] B[id => 3]\n  "
     + caret_at(18)),
])
def test_every_language_renders_its_syntax_error_the_same_way(parse: Callable[[str], object], text: str,
                                                               error: type[QuerySyntaxError], rendered: str) -> None:
    with pytest.raises(QuerySyntaxError) as raised:
        parse(text)
    assert type(raised.value) is error
    assert str(raised.value) == rendered
    line, column = raised.value.line, raised.value.column
    assert text.splitlines()[line - 1][column - 1] == text[raised.value.position]


def test_each_language_keeps_its_own_error_class_catchable() -> None:
    assert issubclass(SaseSyntaxError, SaseError)
    assert issubclass(IntervalSyntaxError, IntervalError)
    assert issubclass(ConstraintSyntaxError, ConstraintError)
    for cls in (ConditionSyntaxError, SaseSyntaxError, IntervalSyntaxError, ConstraintSyntaxError):
        assert issubclass(cls, ValueError)  # PatternSpec.parse's callers catch ValueError


def test_an_unterminated_string_is_named_in_every_language() -> None:
    for parse, text, position in [
        (parse_condition, "kind == 'kick", 8),
        (parse_query, "EVENT SEQ(A a) WHERE a.x = 'y WITHIN 3", 27),
        (parse_iseq, "EVENT ISEQ[](A a; 10) WHERE a.x = 'y", 34),
        (parse_constraint, "A[x='y]", 4),
    ]:
        with pytest.raises(QuerySyntaxError, match=r"^unterminated string at line 1") as raised:
            parse(text)
        assert raised.value.position == position


def test_a_pattern_reports_where_its_problem_is() -> None:
    cases = {
        "SEQ(a == 1,) WITHIN 1 s": ("expected name, got ')'", 11),
        "PATTERN(a == 1) WITHIN 1 s": ("a pattern starts with SEQ(", 0),
        "SEQ(a == 1 WITHIN 1 s": ("expected ',' or ')' after a pattern element, got 'WITHIN'", 11),
        "SEQ(a == 1)": ("a pattern needs WITHIN <duration> (it bounds the matcher's memory)", 11),
        "SEQ(a <> 1) WITHIN 1 s": ("unknown comparison '<>' (use !=, <, <=, ==, >, >=)", 6),
    }
    for text, (message, position) in cases.items():
        with pytest.raises(ConditionSyntaxError) as raised:
            PatternSpec.parse(text)
        assert (raised.value.message, raised.value.position) == (message, position), text
    with pytest.raises(ConditionSyntaxError, match=r"^not a duration: '2 parsecs'") as bad_unit:
        PatternSpec.parse("SEQ(a == 1) WITHIN 2 parsecs")
    assert bad_unit.value.position == 19


OPS: dict[str, Callable[[Any, Any], bool]] = {
    "=": operator.eq, "==": operator.eq, "!=": operator.ne, "<>": operator.ne,
    "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
}


def pattern_holds(op: str, x: int) -> bool:
    return parse_condition(f"x {op} 2")({"x": x})


def sase_holds(op: str, x: int) -> bool:
    return parse_query(f"EVENT SEQ(A a) WHERE a.x {op} 2 WITHIN 1").predicates[0].holds({"a": {"x": x}})


def iseq_holds(op: str, x: int) -> bool:
    return parse_iseq(f"EVENT ISEQ[](A a; 10) WHERE a.x {op} 2").predicates[0].holds({"a": {"x": x}})


def constraint_holds(op: str, x: int) -> bool:
    node = parse_constraint(f"A[x {op} 2]")
    assert isinstance(node, Sym)
    return node.conds[0].holds({"x": x})


@pytest.mark.parametrize("holds", [pattern_holds, sase_holds, iseq_holds, constraint_holds])
@pytest.mark.parametrize("op", sorted(OPS))
def test_every_spelling_compares_as_python_does_in_every_language(holds: Callable[[str, int], bool],
                                                                   op: str) -> None:
    if holds is pattern_holds and op == "<>":
        with pytest.raises(ConditionSyntaxError, match="unknown comparison '<>'"):
            holds(op, 1)
        return
    assert [holds(op, x) for x in (1, 2, 3)] == [OPS[op](x, 2) for x in (1, 2, 3)]


def test_a_constant_first_comparison_is_flipped_the_same_way_in_sase_and_iseq() -> None:
    for op, flipped in [("<", ">"), ("<=", ">="), (">", "<"), (">=", "<="), ("=", "="), ("<>", "!=")]:
        sase = parse_query(f"EVENT SEQ(A a) WHERE 2 {op} a.x WITHIN 1").predicates[0]
        iseq = parse_iseq(f"EVENT ISEQ[](A a; 10) WHERE 2 {op} a.x").predicates[0]
        assert (str(sase), str(iseq)) == (f"a.x {flipped} 2", f"a.x {flipped} 2")


def test_sase_and_iseq_read_conditions_and_windows_the_same_way() -> None:
    for parse, text in [(parse_query, "EVENT SEQ(A a, B b) WHERE a.id = c.id WITHIN 5"),
                        (parse_iseq, "EVENT ISEQ[a.te < b.ts](A a, B b; 5) WHERE a.id = c.id")]:
        with pytest.raises(QuerySyntaxError) as unknown:
            parse(text)
        assert (unknown.value.message, unknown.value.position) == ("unknown alias 'c' (known: a, b)",
                                                                   text.index("c.id"))
    assert parse_query("EVENT SEQ(A a) WITHIN 2 ms").window == parse_iseq("EVENT ISEQ[](A a; 2 ms)").window_us == 2000
    for parse, text in [(parse_query, "EVENT SEQ(A a) WITHIN -5"), (parse_iseq, "EVENT ISEQ[](A a; -5)")]:
        with pytest.raises(QuerySyntaxError, match=r"^expected a positive window length") as negative:
            parse(text)
        assert negative.value.position == text.index("-5")


def test_the_sase_builder_reads_the_table_s_spellings() -> None:
    from cep.sase import SeqBuilder

    query = SeqBuilder().event("A", "a").where("a.x", "==", 1).where("a.y", "<>", 2).within(5).build()
    assert [str(p) for p in query.predicates] == ["a.x = 1", "a.y != 2"]
