"""ISEQ syntax and validation: what parses, what is rejected and where."""

from __future__ import annotations

import pytest

from cep.intervals import IntervalEngine, IntervalEngineConfig, IntervalError, IntervalSyntaxError, parse_iseq
from cep.intervals.query import AttrRef, Predicate


def test_full_syntax_with_negation_predicates_and_units() -> None:
    q = parse_iseq("event iseq[a overlaps b ∧ b^+ < c^- AND d.start < c.ts AND b.end < d.te]"
                   "(A a, B b, !(D d), C c; 2 s) WHERE a.id = b.id AND 3 < c.v")
    assert q.positives == ("a", "b", "c") and q.negatives == ("d",)
    assert q.window_us == 2_000_000
    assert q.predicates == (Predicate(AttrRef("a", "id"), "=", AttrRef("b", "id")),
                            Predicate(AttrRef("c", "v"), ">", 3))
    assert [str(c) for c in q.negations[0].constraints] == ["d.ts < c.ts", "b.te < d.te"]
    assert [str(p) for p, _ in q.negations[0].start_upper_bounds] == ["c.ts", "c.te"]
    assert q.negations[0].end_upper_bounds == ()


@pytest.mark.parametrize(("text", "offset"), [
    ("EVENT SEQ[A.ts < B.ts](A, B; 10)", 6),
    ("EVENT ISEQ[A.ts < X.ts](A, B; 10)", 18),
    ("EVENT ISEQ[A.ts < B](A, B; 10)", 18),
    ("EVENT ISEQ[A.ts < B.ts](A, B; 10 fortnights)", 33),
    ("EVENT ISEQ[A.ts < B.ts](A, B; 0)", 30),
    ("EVENT ISEQ[A.ts < B.ts](A, B 10)", 29),
])
def test_syntax_errors_point_at_the_problem(text: str, offset: int) -> None:
    with pytest.raises(IntervalSyntaxError) as err:
        parse_iseq(text)
    assert err.value.position == offset


def test_duplicate_alias_and_contradiction_are_rejected() -> None:
    with pytest.raises(IntervalError, match="alias"):
        parse_iseq("EVENT ISEQ[A.ts < A.te](A, A; 10)")
    with pytest.raises(IntervalError, match="contradictory"):
        parse_iseq("EVENT ISEQ[A.te < B.ts AND B.te <= A.te](A, B; 10)")


def test_negation_needs_bounds() -> None:
    with pytest.raises(IntervalError, match="bounded below"):
        parse_iseq("EVENT ISEQ[A.te < C.ts AND D.te < C.ts](A, !D, C; 10)")
    start_only = parse_iseq("EVENT ISEQ[A.te < C.ts AND D.ts < C.ts AND A.te < D.te](A, !D, C; 10)")
    with pytest.raises(IntervalError, match="punctuated_types"):
        IntervalEngine(start_only)
    IntervalEngine(start_only, IntervalEngineConfig(punctuated_types=frozenset("D")))


def test_config_validation() -> None:
    with pytest.raises(IntervalError):
        IntervalEngineConfig(k_slack_us=-1)
    with pytest.raises(IntervalError):
        IntervalEngineConfig(indexing="rtree")  # type: ignore[arg-type]


def test_strict_config_raises_on_a_too_late_item() -> None:
    from cep.intervals import Interval

    engine = IntervalEngine(parse_iseq("EVENT ISEQ[A.te < B.ts](A, B; 10)"),
                            IntervalEngineConfig(k_slack_us=1, strict=True))
    engine.on_item(Interval("B", 8, 9, event_id="b"))
    with pytest.raises(IntervalError, match="behind CLOCK"):
        engine.on_item(Interval("A", 1, 7, event_id="a"))
