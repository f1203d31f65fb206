"""Query text syntax and builder: accepted forms, units, partitioning, and error messages with positions."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cep.sase import (
    AttrRef,
    Element,
    EngineConfig,
    SaseError,
    SaseEvent,
    SaseSyntaxError,
    SeqBuilder,
    SequenceEngine,
    parse_query,
    ref,
)

SHOPLIFT = "EVENT SEQ(SHELF s, !(CHECKOUT c), EXIT e) WHERE s.id = c.id AND c.id = e.id WITHIN 1 hour"


def test_shoplifting_query_of_the_paper() -> None:
    q = parse_query(SHOPLIFT)
    assert q.elements == (
        Element("SHELF", "s"),
        Element("CHECKOUT", "c", negated=True),
        Element("EXIT", "e"),
    )
    assert q.window == 3_600_000_000
    assert q.partition_attributes == {"SHELF": "id", "CHECKOUT": "id", "EXIT": "id"}
    assert [e.alias for e in q.positives] == ["s", "e"]
    (neg,) = q.negations
    assert (neg.after, neg.before) == (0, 1)


def test_builder_equals_text() -> None:
    built = (
        SeqBuilder()
        .event("SHELF", "s")
        .negated("CHECKOUT", "c")
        .event("EXIT", "e")
        .where("s.id", "=", ref("c.id"))
        .where("c.id", "==", ref("e.id"))
        .within(3_600_000_000)
        .build()
    )
    q = parse_query(SHOPLIFT)
    assert (built.elements, built.predicates, built.window) == (q.elements, q.predicates, q.window)
    assert built.partition_attributes == q.partition_attributes


def test_builder_errors() -> None:
    with pytest.raises(SaseError, match="window is required"):
        SeqBuilder().event("A").build()
    with pytest.raises(SaseError, match="unknown comparison"):
        SeqBuilder().event("A", "a").where("a.x", "~", 1)
    with pytest.raises(SaseError, match=r"alias\.attr"):
        ref("nodot")


@pytest.mark.parametrize(
    ("window", "expected"),
    [("7", 7), ("10 ms", 10_000), ("2 s", 2_000_000), ("3 sec", 3_000_000), ("1 min", 60_000_000),
     ("1 hour", 3_600_000_000), ("2 HOURS", 7_200_000_000), ("1.5 s", 1_500_000), ("250 us", 250)],
)
def test_window_units(window: str, expected: int) -> None:
    assert parse_query(f"EVENT SEQ(A a) WITHIN {window}").window == expected


def test_lowercase_keywords_default_aliases_and_shorthand() -> None:
    q = parse_query("event seq(A, !B, C) where [id] and A.v >= 2.5 and 'x' != C.name within 9")
    assert [e.alias for e in q.elements] == ["A", "B", "C"]
    assert q.partition_attributes == {"A": "id", "B": "id", "C": "id"}
    ops = [(str(p.left), p.op, p.right) for p in q.predicates]
    assert ("A.v", ">=", 2.5) in ops
    assert ("C.name", "!=", "x") in ops  # constant moved to the right
    q2 = parse_query("EVENT SEQ(A a) WHERE 3 < a.v AND a.ok = TRUE WITHIN 4")
    assert [(str(p.left), p.op, p.right) for p in q2.predicates] == [("a.v", ">", 3), ("a.ok", "=", True)]


def test_no_partition_when_equalities_do_not_cover_every_element() -> None:
    assert parse_query("EVENT SEQ(A a, B b, C c) WHERE a.id = b.id WITHIN 5").partition_attributes == {}
    assert parse_query("EVENT SEQ(A a, B b) WHERE a.id < b.id WITHIN 5").partition_attributes == {}
    # different attribute names per type are fine
    q = parse_query("EVENT SEQ(A a, B b) WHERE a.book = b.tag WITHIN 5")
    assert q.partition_attributes == {"A": "book", "B": "tag"}
    # one type at two positions with two different attributes cannot be routed by one attribute
    q3 = parse_query("EVENT SEQ(A a, A b) WHERE a.x = b.y WITHIN 5")
    assert q3.partition_attributes == {}


def test_transitive_equality_through_a_negated_element() -> None:
    """a.x = c.x AND c.x = b.y with c negated still requires a.x = b.y of a match, partitioned or not."""
    q = parse_query("EVENT SEQ(A a, !(C c), B b) WHERE a.x = c.x AND c.x = b.y WITHIN 5")
    assert q.partition_attributes == {"A": "x", "B": "y", "C": "x"}
    q2 = parse_query("EVENT SEQ(A a, !(C c), B b, D d) WHERE a.x = c.x AND c.x = b.y WITHIN 5")
    assert q2.partition_attributes == {}  # d is not connected
    assert AttrRef("a", "x") in {p.left for p in q2.predicates}
    for query in (q, q2):
        eng = SequenceEngine(query, EngineConfig(k_slack_us=0))
        out = []
        for e in (SaseEvent("A", 1, {"x": 1}), SaseEvent("B", 2, {"y": 2}), SaseEvent("B", 3, {"y": 1}),
                  SaseEvent("D", 4, {})):
            out.extend(eng.on_event(e))
        out.extend(eng.end_of_stream())
        assert [tuple(ev.ts for ev in o.events) for o in out] == ([(1, 3)] if query is q else [(1, 3, 4)])


@pytest.mark.parametrize(
    ("text", "message", "column"),
    [
        ("EVENT SEQ(A a, B b) WITHIN", "expected a positive window length, found end of query", 27),
        ("EVENT SEQ(A a B b) WITHIN 5", "expected ',' or ')'", 15),
        ("EVENT SEQ(A a, B b) WHERE a.x = z.y WITHIN 5", "unknown alias 'z' (known: a, b)", 33),
        ("EVENT SEQ(A a) WHERE a.x = 'abc WITHIN 5", "unterminated string", 28),
        ("EVENT SEQ(A a, A a) WITHIN 3", "duplicate alias 'a'", 18),
        ("EVENT SEQ(A a) WITHIN 5 fortnights", "unknown time unit", 25),
        ("EVENT SEQ(A a) WHERE a.x = 1 AND WITHIN 2", "expected alias.attr, a number or a string", 34),
        ("EVENT SEQ(!(A a)) WITHIN 2", "at least one positive", 10),
        ("EVENT SEQ(A a) WITHIN 0", "positive whole number", 23),
        ("EVENT SEQ(A a) WITHIN 0.5", "positive whole number", 23),
        ("EVENT SEQ(A a, !(B b), !(C c)) WHERE b.x = c.x WITHIN 4", "two negated elements", 38),
        ("EVENT SEQ(A a) WHERE a.x = a.y WITHIN 4", "two different elements", 22),
        ("EVENT SEQ(A a) WHERE 3 < 4 WITHIN 3", "at least one alias.attr", 22),
        ("EVENT SEQ(A a) WITHIN 5 %", "unexpected character '%'", 25),
        ("EVENT SEQ(A a)", "expected WITHIN <window>", 15),
        ("EVENT SEQ(A a) WHERE a.x 3 WITHIN 3", "expected a comparison", 26),
        ("SEQ(A a) WITHIN 3", "expected EVENT", 1),
        ("EVENT SEQ() WITHIN 3", "expected an event type", 11),
        ("EVENT SEQ(A a) WHERE a. = 3 WITHIN 3", "expected an attribute name after '.'", 25),
        ("EVENT SEQ(A a) WITHIN 3 ms extra", "expected end of query", 28),
        ("EVENT SEQ(A a) WHERE [id WITHIN 3", "expected ']'", 26),
    ],
)
def test_syntax_errors_name_the_position(text: str, message: str, column: int) -> None:
    with pytest.raises(SaseSyntaxError) as info:
        parse_query(text)
    err = info.value
    assert message in str(err)
    assert err.line == 1
    assert err.column == column, str(err)
    assert str(err).splitlines()[-1].index("^") - 2 == column - 1  # caret under the problem


def test_multiline_error_position() -> None:
    with pytest.raises(SaseSyntaxError) as info:
        parse_query("EVENT SEQ(A a, B b)\nWHERE a.x = q.y\nWITHIN 5")
    assert (info.value.line, info.value.column) == (2, 13)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="EVNTSQWHIRDAB(),!.=<>[]'0123456789 abcxyz\n", max_size=60))
def test_fuzz_parses_or_raises_syntax_error(text: str) -> None:
    with contextlib.suppress(SaseSyntaxError):
        parse_query(text)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 40), st.sampled_from(["", " ", "\n"]))
def test_fuzz_truncated_valid_query(cut: int, pad: str) -> None:
    text = (SHOPLIFT + pad)[: len(SHOPLIFT) - cut]
    try:
        parse_query(text)
    except SaseSyntaxError as exc:
        assert 0 <= exc.position <= len(text)
