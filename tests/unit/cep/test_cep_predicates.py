"""The condition syntax of pattern elements (cep.predicates)."""

from __future__ import annotations

import pytest

from cep.predicates import And, Cmp, Not, Or, parse_condition


@pytest.mark.parametrize(
    ("text", "payload", "expected"),
    [
        ("kind == 'kick'", {"kind": "kick"}, True),
        ("kind = 'kick'", {"kind": "goal"}, False),
        ("kind != 'kick'", {"kind": "goal"}, True),
        ("x > 29880 OR x < 22560", {"x": 30000}, True),
        ("x > 29880 OR x < 22560", {"x": 25000}, False),
        ("(x > 1 OR y > 1) AND NOT z == 3", {"x": 2, "z": 3}, False),
        ("(x > 1 OR y > 1) AND NOT z == 3", {"y": 2, "z": 4}, True),
        ("sid IN (4, 12, 10, 8)", {"sid": 12}, True),
        ("sid in (4, 12)", {"sid": 5}, False),
        ("y <= -33968", {"y": -40000}, True),
        ("a_abs >= 5.5e4", {"a_abs": 55000}, True),
        ("ball.z < 2440", {"ball": {"z": 100}}, True),
        ("ball.z < 2440", {"ball": 3}, False),  # not an object: no field
        ("missing == 1", {}, False),  # a missing field never matches
        ("missing != 1", {}, False),
        ("name > 3", {"name": "text"}, False),  # unorderable: false, not an error
        ("ok == true AND v == null", {"ok": True, "v": None}, True),
        ("s == 'it\\'s'", {"s": "it's"}, True),
        ('s == "a,b"', {"s": "a,b"}, True),
    ],
)
def test_conditions(text: str, payload: dict[str, object], expected: bool) -> None:
    assert parse_condition(text)(payload) is expected


def test_structure_and_text_round_trip() -> None:
    cond = parse_condition("a == 1 AND (b < 2 OR NOT c IN ('x', 'y'))")
    assert cond == And((Cmp("a", "==", 1), Or((Cmp("b", "<", 2), Not(Cmp("c", "in", ("x", "y")))))))
    assert parse_condition(cond.to_text()) == cond


@pytest.mark.parametrize("bad", ["", "a ==", "a == 1 b", "(a == 1", "a ~ 1", "== 1", "a IN 1", "a == b"])
def test_errors(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_condition(bad)


def test_unknown_operator() -> None:
    with pytest.raises(ValueError, match="operator"):
        Cmp("a", "~", 1)


@pytest.mark.parametrize(("bad", "message", "position"), [
    ("a ==", "expected a literal, got end of condition", 4),
    ("a == 1 b", "unexpected 'b'", 7),
    ("(a == 1", "expected ), got 'end of condition'", 7),
    ("a ~ 1", "unexpected character '~'", 2),
    ("a in (1, b)", "expected a literal, got 'b'", 9),
])
def test_a_syntax_error_names_its_position_with_a_caret(bad: str, message: str, position: int) -> None:
    from cep.predicates import ConditionSyntaxError

    with pytest.raises(ConditionSyntaxError) as raised:
        parse_condition(bad)
    assert (raised.value.message, raised.value.position) == (message, position)
    caret = " " * position + "^"
    assert str(raised.value) == f"{message} at line 1, column {position + 1}\n  {bad}\n  {caret}"
