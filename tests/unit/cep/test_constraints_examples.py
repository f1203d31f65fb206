"""Li 2010 chapter 3's worked examples as exact tests (../shared/notes/intervals-and-constraints.md, table 2.4).

Every trace runs through both checkers (basic = Algorithm 1, lightweight = Algorithms 2-3); they must agree event
by event.  Example 3.6 uses the reconstructed constraint C6 = PAB | QB | QAB (labelled "reconstructed").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from cep.constraints import ConstraintChecker, ConstraintError, Verdict, parse_pattern
from cep.constraints.automata import derivatives_equal
from cep.sase import parse_query

U, S, N, V = Verdict.UNDECIDED, Verdict.SATISFIABLE, Verdict.UNSATISFIABLE, Verdict.VIOLATION
C1 = "A+ K* B+ K C+"
Q2 = "SEQ(A, K, K, C)"
C6 = "P A B | Q B | Q A B"  # reconstructed (the print "PAB|Q*B|R*A" is garbled)
Q6 = "SEQ(OR(P, Q), A, B)"
C8 = "A+ B+ A+ C+"
Q8 = "EVENT SEQ(A a, B b, C c) WHERE a.id = 3 WITHIN 100"

Event = str | tuple[str, Mapping[str, Any]]
ALGORITHMS = ("basic", "lightweight")


def run(constraint: str, query: Any, trace: Sequence[Event], algorithm: str) -> list[Verdict]:
    checker = ConstraintChecker(constraint, query, algorithm)  # type: ignore[arg-type]
    state = checker.new_trace()
    out = []
    for e in trace:
        t, attrs = (e, {}) if isinstance(e, str) else e
        out.append(checker.step(state, t, attrs))
    return out


def run_both(constraint: str, query: Any, trace: Sequence[Event]) -> list[Verdict]:
    basic = run(constraint, query, trace, "basic")
    light = run(constraint, query, trace, "lightweight")
    assert basic == light
    return light


# --- Ex. 3.1 / 3.2: consistency and matches (the query language itself) -----------------------------------------


def test_ex_3_1_both_traces_are_consistent_and_h1_matches_h2_does_not() -> None:
    checker = ConstraintChecker(C1, Q2)
    h1 = checker.word(["A", "K", "B", "B", "K", "C"])
    h2 = checker.word(["A", "B", "B", "K", "C"])
    assert checker.tau_c.accepts(h1) and checker.tau_c.accepts(h2)
    assert checker.tau_q.accepts(h1)  # <a1 k2 k8 c9>
    assert not checker.tau_q.accepts(h2)  # Ex. 3.2: only one K between A and C


# --- Ex. 3.3 / 3.5 / 3.7: runtime verdicts ------------------------------------------------------------------------


def test_ex_3_3_h3_is_satisfiable_at_k2() -> None:
    assert run_both(C1, Q2, ["A", "K"]) == [U, S]


def test_ex_3_3_h4_is_unsatisfiable_at_b4() -> None:
    assert run_both(C1, Q2, ["A", "B"]) == [U, N]


def test_ex_3_3_h5_is_undecided() -> None:
    assert run_both(C1, Q2, ["A", "A"]) == [U, U]


def test_ex_3_9_after_a_verdict_later_events_do_no_work() -> None:
    checker = ConstraintChecker(C1, Q2)
    trace = checker.new_trace()
    verdicts = [checker.step(trace, t) for t in ["A", "K", "B", "B", "K", "C"]]
    assert verdicts == [U, S, U, U, U, U]
    assert (trace.verdict, trace.verdict_at, trace.events) == (S, 2, 2)
    assert checker.counters.as_dict() == {"steps": 2, "sat": 1, "unsat": 0, "violations": 0, "derivative_checks": 0}
    trace2 = checker.new_trace()
    assert [checker.step(trace2, t) for t in ["A", "B", "B", "K", "C"]] == [U, N, U, U, U]
    assert (trace2.verdict, trace2.verdict_at) == (N, 2)


# --- Ex. 3.4: static verdicts -------------------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_ex_3_4_static_verdicts(algorithm: str) -> None:
    sat = ConstraintChecker(C1, "SEQ(A, K, C)", algorithm)  # type: ignore[arg-type]
    unsat = ConstraintChecker(C1, "SEQ(A, K, D)", algorithm)  # type: ignore[arg-type]
    undecided = ConstraintChecker(C1, Q2, algorithm)  # type: ignore[arg-type]
    assert (sat.static_verdict, unsat.static_verdict, undecided.static_verdict) == (S, N, U)
    trace = sat.new_trace()
    assert (trace.verdict, trace.verdict_at) == (S, 0)
    assert sat.step(trace, "A") == U  # decided before any event: no more work
    assert unsat.new_trace().verdict == N


# --- Ex. 3.5 / 3.7: the automata ----------------------------------------------------------------------------------


def test_ex_3_7_tau_intersection_of_c1_and_q2() -> None:
    """s0 -a-> s1 -k-> s2 (= (c2,AK) merged with (c2,AKK)); s3 = c3, s4 = c4, s5 = c5; s1 -b-> undefined.
    DER_EQUIVALENT: s2-s5 yes, s0 and s1 no."""
    checker = ConstraintChecker(C1, Q2)
    ti = checker.tau_i

    def state(word: str) -> int:
        return ti.run(checker.word(word.split()))

    assert ti.n_states == 6
    s0, s1, s2 = 0, state("A"), state("A K")
    s3, s4, s5 = state("A K B"), state("A K B K"), state("A K B K C")
    assert sorted({s0, s1, s2, s3, s4, s5}) == list(range(6))
    assert state("A K K") == s2  # (c2, AK) and (c2, AKK) merged
    assert state("A A") == s1 and state("A K B B") == s3 and state("A K B K C C") == s5
    assert state("A B") == -1  # falls out of τ_∩: Thm 3.1
    assert ti.accepting == [s == s5 for s in range(6)]
    der = checker.der_equivalent
    assert [der[s] for s in (s0, s1, s2, s3, s4, s5)] == [False, False, True, True, True, True]
    # map(p) is the constraint state the same prefix reaches
    tc = checker.tau_c
    for w in ("", "A", "A K", "A K K", "A K B", "A K B K", "A K B K C"):
        assert checker.map_c[state(w)] == tc.run(checker.word(w.split()))


def test_ex_3_5_product_state_after_a_b_has_no_route_to_acceptance_and_is_trimmed() -> None:
    checker = ConstraintChecker(C1, Q2)
    word = checker.word(["A", "B"])
    assert checker.tau_c.run(word) >= 0  # legal for the constraint
    assert checker.product.run(word) == -1  # but the trimmed product has no such state


# --- Ex. 3.6 (reconstructed): OR classes and the specialised minimisation ------------------------------------------


def test_ex_3_6_reconstructed_verdicts() -> None:
    assert run_both(C6, Q6, ["P"]) == [S]  # h6: (2)-1, DER_EQUIVALENT
    assert run_both(C6, Q6, ["Q"]) == [U]  # h7: (2)-4, AB vs B|AB
    assert run_both(C6, Q6, ["Q", "A"]) == [U, S]  # h8
    assert run_both(C6, Q6, ["Q", "B"]) == [U, N]  # derived case


def test_ex_3_6_reconstructed_constraint_automaton_has_five_states() -> None:
    checker = ConstraintChecker(C6, Q6)
    assert checker.tau_c.n_states == 5


def test_ex_3_6_reconstructed_ordinary_minimisation_merges_what_the_specialised_one_keeps_apart() -> None:
    checker = ConstraintChecker(C6, Q6)
    after_p, after_q = checker.word(["P"]), checker.word(["Q"])
    ordinary, special = checker.tau_i_ordinary, checker.tau_i
    assert ordinary.run(after_p) == ordinary.run(after_q)  # both derivatives are AB
    assert special.run(after_p) != special.run(after_q)
    assert (ordinary.n_states, special.n_states) == (4, 5)
    # the merged ordinary state cannot carry one encoding: it equals the constraint's derivative after P, not Q
    merged = ordinary.run(after_p)
    tc = checker.tau_c
    assert derivatives_equal(ordinary, merged, tc, tc.run(after_p))
    assert not derivatives_equal(ordinary, merged, tc, tc.run(after_q))
    # specialised: one map state per τ_∩ state (Thm 3.3)
    assert checker.map_c[special.run(after_p)] == tc.run(after_p)
    assert checker.map_c[special.run(after_q)] == tc.run(after_q)


# --- Ex. 3.8: predicates ------------------------------------------------------------------------------------------


def test_ex_3_8_alphabet_is_refined_by_the_query_predicate() -> None:
    checker = ConstraintChecker(C8, Q8)
    assert checker.symbol_labels() == ["A[id=3]", "A[not id=3]", "B", "C"]
    assert checker.classify("A", {"id": 3}) == 0
    assert checker.classify("A", {"id": 2}) == 1
    assert checker.classify("A", {}) == 1  # a missing attribute fails the condition, as in cep.sase


def test_ex_3_8_h9_unsatisfiable_at_b3() -> None:
    assert run_both(C8, Q8, [("A", {"id": 2}), ("B", {})]) == [U, N]


def test_ex_3_8_h10_satisfiable_already_at_a1() -> None:
    """DER: every continuation of a1[id=3] has a B and then a C, so the verdict holds at a1 (the print does not
    say when)."""
    assert run_both(C8, Q8, [("A", {"id": 3}), ("B", {})]) == [S, U]


def test_ex_3_8_with_the_predicate_in_the_constraint_instead() -> None:
    c = "A[id=3]+ B+ A+ C+"
    assert ConstraintChecker(c, "SEQ(A, B, C)").static_verdict == S
    assert ConstraintChecker(c, "SEQ(A[id=2], B, C)").static_verdict == N  # id=2 only in the last A+ block
    a3, a5, a2 = ("A", {"id": 3}), ("A", {"id": 5}), ("A", {"id": 2})
    b: Event = ("B", {})
    cc: Event = ("C", {})
    assert ConstraintChecker(c, "SEQ(A[id=2], C)").static_verdict == U
    assert run_both(c, "SEQ(A[id=2], C)", [a3, b, a5, a2]) == [U, U, U, S]
    assert run_both(c, "SEQ(A[id=2], C)", [a3, b, a5, cc]) == [U, U, U, N]
    assert run_both(c, "SEQ(A[id=2], C)", [a2]) == [V]  # the first block must be id=3


# --- violations ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_violation_is_not_unsat_and_the_trace_falls_back_to_unchecked(algorithm: str) -> None:
    checker = ConstraintChecker(C1, Q2, algorithm)  # type: ignore[arg-type]
    trace = checker.new_trace()
    # C after A breaks C1 (a K or B must come first): VIOLATION, not UNSATISFIABLE
    assert [checker.step(trace, t) for t in ["A", "C", "K", "K", "C"]] == [U, V, U, U, U]
    assert (trace.verdict, trace.verdict_at, trace.checking) == (V, 2, False)
    other = checker.new_trace()
    assert checker.step(other, "X") == V  # a type the constraint does not know
    assert checker.counters.violations == 2 and checker.counters.unsat == 0


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_unsat_only_where_the_constraint_allows_the_event(algorithm: str) -> None:
    checker = ConstraintChecker(C1, Q2, algorithm)  # type: ignore[arg-type]
    trace = checker.new_trace()
    assert [checker.step(trace, t) for t in ["A", "K", "B"]] == [U, S, U]
    t2 = checker.new_trace()
    assert [checker.step(t2, t) for t in ["A", "B", "Z"]] == [U, N, U]


# --- snapshots ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_snapshot_restore_mid_trace(algorithm: str) -> None:
    checker = ConstraintChecker(C1, Q2, algorithm)  # type: ignore[arg-type]
    trace = checker.new_trace()
    checker.step(trace, "A")
    blob = checker.snapshot(trace)
    assert all(type(x) is int for x in blob)
    restored = checker.restore_trace(blob)
    assert checker.step(restored, "K") == S
    assert checker.step(trace, "B") == N  # the original is independent of the copy
    assert checker.snapshot(checker.restore_trace(checker.snapshot(restored))) == checker.snapshot(restored)
    with pytest.raises(ConstraintError):
        checker.restore_trace([1, 99, 99, 0, 1, -1])
    with pytest.raises(ConstraintError):
        checker.restore_trace([7, 0, 0, 0, 0, -1])


# --- windowed / inexact queries -----------------------------------------------------------------------------------


def test_windowed_reports_only_unsat() -> None:
    checker = ConstraintChecker(C1, Q2, windowed=True)
    assert not checker.reports_sat
    assert checker.static_verdict == U
    t = checker.new_trace()
    assert [checker.step(t, x) for x in ["A", "K", "B"]] == [U, U, U]
    t = checker.new_trace()
    assert [checker.step(t, x) for x in ["A", "B"]] == [U, N]


def test_windowed_drops_edge_negations_so_unsat_stays_sound() -> None:
    # Without a window, a trailing !C makes SEQ(A, K, !C) impossible under C1 (every word ends in C)...
    strict = ConstraintChecker(C1, "SEQ(A, K, !C)")
    assert strict.static_verdict == N
    # ...but with a window the C may come after the window closes: no verdict.
    assert ConstraintChecker(C1, "SEQ(A, K, !C)", windowed=True).static_verdict == U


def test_cross_predicates_make_the_pattern_inexact() -> None:
    q = parse_query("EVENT SEQ(A a, K k, C c) WHERE a.id = k.id AND k.id = c.id AND a.v < c.v WITHIN 10")
    checker = ConstraintChecker(C1, q)
    assert not checker.pattern.exact and not checker.reports_sat
    assert checker.static_verdict == U  # SEQ(A,K,C) is statically SAT without the a.v < c.v predicate
    assert any("a.v < c.v" in n for n in checker.pattern.notes)


def test_partition_equalities_do_not_make_the_pattern_inexact() -> None:
    q = parse_query("EVENT SEQ(A a, K k, C c) WHERE [id] WITHIN 10")
    checker = ConstraintChecker(C1, q)
    assert checker.pattern.exact and checker.static_verdict == S
    assert checker.trace_key("B", {"id": 7}, q.partition_attributes) == 7
    assert checker.trace_key("A", {"id": 8}, q.partition_attributes) == 8


def test_negation_between_neighbours() -> None:
    # SEQ(A, !B, K): an A then a K with no B between.  Under C1 the first K after an A has no B before it
    # unless K* was skipped.
    assert run_both(C1, "SEQ(A, !B, C)", ["A"]) == [U]
    assert ConstraintChecker(C1, "SEQ(A, !B, C)").static_verdict == N  # every word has B+ between A and C
    assert run_both(C1, "SEQ(A, !B, K)", ["A", "K"]) == [U, S]
    assert run_both(C1, "SEQ(A, !B, K)", ["A", "B"]) == [U, N]


def test_leading_negation_forbids_from_the_trace_start() -> None:
    assert run_both("X? A B", "SEQ(!X, A)", ["X"]) == [N]
    assert run_both("X? A B", "SEQ(!X, A)", ["A"]) == [S]
    assert ConstraintChecker("X? A B", "SEQ(!X, A)").static_verdict == U


def test_empty_constraint_language_is_an_error() -> None:
    with pytest.raises(ConstraintError, match="accepts no trace"):
        ConstraintChecker("A[id=1, id=2]", "SEQ(A)")


def test_pattern_parser_or_classes() -> None:
    p = parse_pattern("SEQ(OR(P, Q), !B[x>2], C)")
    assert str(p) == "SEQ(OR(P, Q), !B[x>2], C)"
    assert [len(pos.symbols) for pos in p.positions] == [2, 1, 1]
