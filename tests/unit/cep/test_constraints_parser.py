"""Constraint and pattern text: the AST for each operator, error messages with positions, fuzz (parses or raises
ConstraintError, nothing else), and the alphabet refinement's symbols."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cep.constraints import Alphabet, Cond, ConstraintChecker, ConstraintError, Sym, parse_constraint, parse_pattern
from cep.constraints.regex import Alt, Cat, Opt, Plus, Star, to_text


def test_operators_and_precedence() -> None:
    a, b, c = Sym("A"), Sym("B"), Sym("C")
    assert parse_constraint("A") == a
    assert parse_constraint("A B | C") == Alt((Cat((a, b)), c))
    assert parse_constraint("A (B | C)*") == Cat((a, Star(Alt((b, c)))))
    assert parse_constraint("A+ B? C*") == Cat((Plus(a), Opt(b), Star(c)))
    assert parse_constraint("A+?") == Opt(Plus(a))
    assert parse_constraint("(A)(B)") == Cat((a, b))
    assert parse_constraint("AB") == Sym("AB")  # one identifier: write "A B" for two types
    assert parse_constraint("SUPPLIER-WAREHOUSE RETAIL_SHELF") == Cat((Sym("SUPPLIER-WAREHOUSE"), Sym("RETAIL_SHELF")))


def test_predicate_refined_symbols() -> None:
    assert parse_constraint("A[id=3]") == Sym("A", (Cond("id", "=", 3),))
    assert parse_constraint("A[id == 3, x != 'k', p >= 2.5, f = TRUE]") == Sym(
        "A", (Cond("id", "=", 3), Cond("x", "!=", "k"), Cond("p", ">=", 2.5), Cond("f", "=", True))
    )
    assert parse_constraint("A[x<>1]+") == Plus(Sym("A", (Cond("x", "!=", 1),)))
    assert to_text(parse_constraint("A[x<>1]+ (B|C[s='q'])*")) == "A[x!=1]+ (B | C[s='q'])*"


@pytest.mark.parametrize(
    ("text", "message", "position"),
    [
        ("", "empty constraint", 0),
        ("A |", "expected an event type or '('", 3),
        ("| A", "expected an event type or '('", 0),
        ("A ( B", "'(' at position 2 is not closed", 5),
        ("A B )", "unbalanced ')'", 4),
        ("A ()", "empty parentheses", 3),
        ("* A", "'*' needs something before it to repeat", 0),
        ("A # B", "unexpected character '#'", 2),
        ("A[id]", "expected a comparison", 4),
        ("A[=3]", "expected an attribute name", 2),
        ("A[id=B]", "expected a literal", 5),
        ("A[id=3", "',' or ']' after a condition", 6),
        ("A['x=3]", "unterminated string", 2),
    ],
)
def test_errors_name_the_position(text: str, message: str, position: int) -> None:
    with pytest.raises(ConstraintError) as err:
        parse_constraint(text)
    assert message in err.value.message
    assert err.value.position == position
    assert "^" in str(err.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("SEQ()", "expected an event type"),
        ("SEQ(!A)", "at least one positive"),
        ("SEQ(A, B", "',' or ')'"),
        ("PAT(A)", "expected SEQ("),
        ("SEQ(OR(A, B)", "',' or ')'"),
        ("SEQ(A) B", "expected the end"),
    ],
)
def test_pattern_errors(text: str, message: str) -> None:
    with pytest.raises(ConstraintError) as err:
        parse_pattern(text)
    assert message in err.value.message


def test_pattern_forms() -> None:
    p = parse_pattern("SEQ(OR(P, Q), !(B[x>2]), C, !D)")
    assert str(p) == "SEQ(OR(P, Q), !B[x>2], C, !D)"
    assert p.gaps() == [(), (Sym("B", (Cond("x", ">", 2),)),), (Sym("D"),)]
    assert p.gaps(edges=False) == [(), (Sym("B", (Cond("x", ">", 2),)),), ()]


def test_checker_rejects_bad_inputs() -> None:
    with pytest.raises(ConstraintError, match="algorithm"):
        ConstraintChecker("A", "SEQ(A)", "fast")  # type: ignore[arg-type]
    with pytest.raises(ConstraintError, match="query"):
        ConstraintChecker("A", "EVENT SEQ(A a) WITHIN 0")
    with pytest.raises(ConstraintError, match="expected a SequencePattern"):
        ConstraintChecker("A", 42)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="AB ()|*+?[]=<>!,'x0123.", max_size=20))
def test_fuzz_parses_or_raises_constraint_error(text: str) -> None:
    try:
        node = parse_constraint(text)
    except ConstraintError:
        return
    assert to_text(parse_constraint(to_text(node))) == to_text(node)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="SEQOR AB()!,[]=x1", max_size=24))
def test_fuzz_patterns(text: str) -> None:
    try:
        pattern = parse_pattern(text)
    except ConstraintError:
        return
    # What parses prints back as text that parses to the same pattern.
    assert str(parse_pattern(str(pattern))) == str(pattern)


# --- alphabet refinement ------------------------------------------------------------------------------------------


def test_alphabet_one_equality_splits_in_two() -> None:
    alpha = Alphabet(["A", "B"], [("A", Cond("id", "=", 3))])
    assert [s.label for s in alpha.symbols] == ["A[id=3]", "A[not id=3]", "B"]
    assert alpha.matching(Sym("A")) == {0, 1}
    assert alpha.matching(Sym("A", (Cond("id", "=", 3),))) == {0}
    assert alpha.classify("B", {"id": 3}) == 2
    assert alpha.classify("Z", {}) == -1


def test_alphabet_only_realisable_vectors() -> None:
    # id=3 and id=4 can never both hold: three symbols, not four
    alpha = Alphabet(["A"], [("A", Cond("id", "=", 3)), ("A", Cond("id", "=", 4))])
    assert len(alpha) == 3
    # ranges: x<2, x>5 -> below, between, above (and both false for a missing or non-numeric value)
    alpha = Alphabet(["A"], [("A", Cond("x", "<", 2)), ("A", Cond("x", ">", 5))])
    truths = {s.truth for s in alpha.symbols}
    assert truths == {(True, False), (False, False), (False, True)}
    assert alpha.symbols[alpha.classify("A", {"x": 1})].truth == (True, False)
    assert alpha.symbols[alpha.classify("A", {"x": 3})].truth == (False, False)
    assert alpha.symbols[alpha.classify("A", {"x": 9})].truth == (False, True)
    assert alpha.symbols[alpha.classify("A", {"x": "s"})].truth == (False, False)


def test_alphabet_every_event_maps_to_exactly_one_symbol() -> None:
    conds = [Cond("x", "=", 1), Cond("x", "!=", 1), Cond("x", "<", 5), Cond("s", "=", "k"), Cond("s", ">", "k")]
    alpha = Alphabet(["A"], [("A", c) for c in conds])
    values: list[object] = [None, -3, 1, 1.5, 4, 5, 7, "a", "k", "kz", "z", True, False, (), 2.0]
    for x in values:
        for s in values:
            attrs = {"x": x, "s": s}
            i = alpha.classify("A", attrs)
            assert i >= 0
            assert alpha.symbols[i].truth == tuple(c.holds(attrs) for c in alpha.conds["A"])
    assert alpha.classify("A", {}) >= 0
