"""Property tests: the checkers' early verdicts against brute force written independently of the automata.

* the constraint's meaning: words are enumerated straight from the regex AST (set semantics, no automata);
* the query's meaning: a brute-force SEQ matcher (choose positions, check the negated gaps), itself checked
  against cep.sase's reference evaluator with a window longer than the trace;
* events are concrete: types A, B, C with an attribute x in {0, 1, 2} or missing.  Conditions are x=0, x=1,
  x!=1, which cut that universe into every truth vector the checker's alphabet can produce, so the checker and
  the brute force quantify over the same continuations.

Traces are drawn from the constraint (prefixes of words of L(C)).  For every prefix h:
SATISFIABLE at h => every completion in L(C) (up to a length bound) matches; UNSATISFIABLE => none does.  For
constraints with a finite language (no * or +) the enumeration is complete, and the checker's verdict sequence
must equal the brute-force decision exactly.  Basic and lightweight agree on every event.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from functools import cache

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from cep.constraints import ConstraintChecker, Verdict
from cep.constraints.automata import derivatives_equal, derivatives_equal_via_query, minimize, regex_dfa, trim
from cep.constraints.pattern import PatternPosition, SequencePattern
from cep.constraints.regex import Alt, Cat, Cond, Node, Opt, Plus, Star, Sym, parse_constraint, to_text
from cep.sase import SaseEvent, parse_query, reference_matches

TYPES = ("A", "B", "C")
MISSING = "missing"
VALUES: tuple[int | str, ...] = (0, 1, 2, MISSING)
LETTERS: tuple[tuple[str, int | str], ...] = (*(("A", v) for v in VALUES), ("B", MISSING), ("C", MISSING))
Letter = tuple[str, int | str]
CONDS = (Cond("x", "=", 0), Cond("x", "=", 1), Cond("x", "!=", 1))

SETTINGS = settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]
)


# --- independent semantics ----------------------------------------------------------------------------------------


def cond_holds(c: Cond, value: int | str) -> bool:
    if value == MISSING:
        return False
    return value == c.value if c.op == "=" else value != c.value


def sym_matches(s: Sym, letter: Letter) -> bool:
    return letter[0] == s.event_type and all(cond_holds(c, letter[1]) for c in s.conds)


def language(node: Node, max_len: int) -> frozenset[tuple[Letter, ...]]:
    """Every word of L(node) of length <= max_len, by structural recursion (no automata)."""

    @cache
    def lang(n: Node, k: int) -> frozenset[tuple[Letter, ...]]:
        out = _lang(n, k)
        if len(out) > LIMIT:
            raise TooBig
        return out

    def _lang(n: Node, k: int) -> frozenset[tuple[Letter, ...]]:
        if isinstance(n, Sym):
            return frozenset((letter,) for letter in LETTERS if sym_matches(n, letter)) if k >= 1 else frozenset()
        if isinstance(n, Alt):
            return frozenset().union(*(lang(o, k) for o in n.options))
        if isinstance(n, Cat):
            words: frozenset[tuple[Letter, ...]] = frozenset({()})
            for part in n.parts:
                words = frozenset(w + v for w in words for v in lang(part, k - len(w)))
                if len(words) > LIMIT:
                    raise TooBig
            return words
        inner = lang(n.inner, k)
        if isinstance(n, Opt):
            return inner | {()}
        words = frozenset(w for w in inner if w)  # Plus: one or more non-empty repetitions
        frontier = words
        while frontier:
            frontier = frozenset(w + v for w in frontier for v in words if len(w) + len(v) <= k) - words
            words |= frontier
            if len(words) > LIMIT:
                raise TooBig
        if isinstance(n, Star) or () in inner:
            words |= {()}
        return words

    return lang(node, max_len)


def language_or_skip(node: Node, max_len: int) -> frozenset[tuple[Letter, ...]]:
    try:
        return language(node, max_len)
    except TooBig:
        assume(False)
        raise


def brute_match(pattern: SequencePattern, word: Sequence[Letter]) -> bool:
    """SEQ with skip-till-any-match; a negated class forbids its events strictly between its positive
    neighbours (leading: from the trace start, trailing: to the trace end)."""
    groups: list[tuple[tuple[Sym, ...], list[Sym]]] = []
    leading: list[Sym] = []
    for pos in pattern.positions:
        if pos.negated:
            (groups[-1][1] if groups else leading).extend(pos.symbols)
        else:
            groups.append((pos.symbols, []))

    def in_class(syms: Sequence[Sym], letter: Letter) -> bool:
        return any(sym_matches(s, letter) for s in syms)

    def bound(g: int, i: int) -> bool:
        """Positive g is bound to word[i]: can the rest be bound after it?"""
        after = groups[g][1]
        for j in range(i + 1, len(word)):
            if g + 1 < len(groups) and in_class(groups[g + 1][0], word[j]) and bound(g + 1, j):
                return True
            if in_class(after, word[j]):
                return False
        return g + 1 == len(groups)

    for i, letter in enumerate(word):
        if in_class(groups[0][0], letter) and bound(0, i):
            return True
        if in_class(leading, letter):
            return False
    return False


def attrs_of(letter: Letter) -> dict[str, int]:
    return {} if letter[1] == MISSING else {"x": int(letter[1])}


# --- strategies ---------------------------------------------------------------------------------------------------

symbols = st.one_of(
    st.builds(Sym, st.sampled_from(TYPES)),
    st.builds(Sym, st.just("A"), st.tuples(st.sampled_from(CONDS))),
)


class TooBig(Exception):
    """The enumeration would be too large for a unit test: the example is skipped."""


LIMIT = 4000


def regexes(finite: bool) -> st.SearchStrategy[Node]:
    def extend(inner: st.SearchStrategy[Node]) -> st.SearchStrategy[Node]:
        unary: list[st.SearchStrategy[Node]] = [st.builds(Opt, inner)]
        if not finite:
            unary += [st.builds(Star, inner), st.builds(Plus, inner)]
        return st.one_of(
            st.builds(lambda xs: Cat(tuple(xs)), st.lists(inner, min_size=2, max_size=3)),
            st.builds(lambda xs: Alt(tuple(xs)), st.lists(inner, min_size=2, max_size=2)),
            *unary,
        )

    return st.recursive(symbols, extend, max_leaves=6)


@st.composite
def patterns(draw: st.DrawFn) -> SequencePattern:
    n = draw(st.integers(1, 4))
    positions = []
    for _ in range(n):
        syms = tuple(draw(st.lists(symbols, min_size=1, max_size=2)))
        positions.append(PatternPosition(syms, draw(st.booleans()) and draw(st.booleans())))
    assume(any(not p.negated for p in positions))
    return SequencePattern(tuple(positions))


# --- helpers ------------------------------------------------------------------------------------------------------


def verdicts(checker: ConstraintChecker, word: Sequence[Letter]) -> list[Verdict]:
    """Sticky verdict after each prefix (index 0: static)."""
    trace = checker.new_trace()
    out = [trace.verdict]
    for letter in word:
        checker.step(trace, letter[0], attrs_of(letter))
        out.append(trace.verdict)
    return out


def both(constraint: Node, pattern: SequencePattern, word: Sequence[Letter]) -> list[Verdict]:
    basic = ConstraintChecker(constraint, pattern, "basic")
    light = ConstraintChecker(constraint, pattern, "lightweight")
    vb, vl = verdicts(basic, word), verdicts(light, word)
    assert vb == vl, (to_text(constraint), str(pattern), word)
    assert Verdict.VIOLATION not in vl  # the words are drawn from the constraint
    return vl


def reference(words: frozenset[tuple[Letter, ...]], pattern: SequencePattern, prefix: tuple[Letter, ...]) -> Verdict:
    completions = [w for w in words if w[: len(prefix)] == prefix]
    assert completions, "the prefix is drawn from the constraint"
    matched = [brute_match(pattern, w) for w in completions]
    if all(matched):
        return Verdict.SATISFIABLE
    if not any(matched):
        return Verdict.UNSATISFIABLE
    return Verdict.UNDECIDED


def expected_sticky(decisions: list[Verdict]) -> list[Verdict]:
    out, current = [], Verdict.UNDECIDED
    for d in decisions:
        if current is Verdict.UNDECIDED:
            current = d
        out.append(current)
    return out


def nonempty(node: Node) -> bool:
    return bool(language_or_skip(node, 4))


# --- properties ---------------------------------------------------------------------------------------------------


@SETTINGS
@given(regexes(finite=True), patterns(), st.randoms(use_true_random=False))
def test_finite_constraints_verdicts_equal_brute_force(
    constraint: Node, pattern: SequencePattern, rnd: random.Random
) -> None:
    words = language_or_skip(constraint, 64)
    assume(words)
    word = rnd.choice(sorted(words, key=repr))
    got = both(constraint, pattern, word)
    want = expected_sticky([reference(words, pattern, tuple(word[:i])) for i in range(len(word) + 1)])
    assert got == want, (to_text(constraint), str(pattern), word)


@SETTINGS
@given(regexes(finite=False), patterns(), st.randoms(use_true_random=False))
def test_early_verdicts_never_contradict_the_completions(
    constraint: Node, pattern: SequencePattern, rnd: random.Random
) -> None:
    words = language_or_skip(constraint, 6)
    assume(words)
    word = rnd.choice(sorted(words, key=repr))
    got = both(constraint, pattern, word)
    for i, v in enumerate(got):
        prefix = tuple(word[:i])
        completions = [w for w in words if w[:i] == prefix]
        if v is Verdict.SATISFIABLE:
            assert all(brute_match(pattern, w) for w in completions), (to_text(constraint), str(pattern), prefix)
        elif v is Verdict.UNSATISFIABLE:
            assert not any(brute_match(pattern, w) for w in completions), (to_text(constraint), str(pattern), prefix)
        else:
            assert v is Verdict.UNDECIDED


@SETTINGS
@given(regexes(finite=False), st.lists(st.sampled_from(LETTERS), max_size=7))
def test_constraint_dfa_equals_python_re(constraint: Node, word: list[Letter]) -> None:
    """τ_C accepts a word iff Python's re engine accepts its encoding (one character per concrete letter)."""
    checker = ConstraintChecker(constraint, "SEQ(A)") if nonempty(constraint) else None
    assume(checker is not None)
    assert checker is not None
    chars = {letter: chr(ord("a") + i) for i, letter in enumerate(LETTERS)}

    def rx(n: Node) -> str:
        if isinstance(n, Sym):
            return "[" + "".join(chars[x] for x in LETTERS if sym_matches(n, x)) + "]" if any(
                sym_matches(n, x) for x in LETTERS
            ) else "(?!)"
        if isinstance(n, Cat):
            return "".join(f"(?:{rx(p)})" for p in n.parts)
        if isinstance(n, Alt):
            return "|".join(f"(?:{rx(p)})" for p in n.options)
        op = "*" if isinstance(n, Star) else "+" if isinstance(n, Plus) else "?"
        return f"(?:{rx(n.inner)}){op}"

    encoded = "".join(chars[x] for x in word)
    want = re.fullmatch(rx(constraint), encoded) is not None
    syms = [checker.classify(t, attrs_of((t, v))) for t, v in word]
    assert checker.tau_c.accepts(syms) == want


@SETTINGS
@given(regexes(finite=False))
def test_constraint_text_round_trips(constraint: Node) -> None:
    assert to_text(parse_constraint(to_text(constraint))) == to_text(constraint)


@SETTINGS
@given(regexes(finite=False), patterns())
def test_specialised_minimisation_is_minimal_among_constraint_consistent_automata(
    constraint: Node, pattern: SequencePattern
) -> None:
    """Thm 3.3: every τ_∩ state has one τ_C state; τ_∩ accepts the same language as the ordinary minimum; and
    the ordinary minimum is never larger."""
    assume(nonempty(constraint))
    checker = ConstraintChecker(constraint, pattern)
    assume(checker.tau_i.n_states > 0)
    for w in language_or_skip(constraint, 4):
        syms = [checker.classify(t, attrs_of((t, v))) for t, v in w]
        p = checker.tau_i.run(syms)
        assert (p >= 0) == (checker.tau_i_ordinary.run(syms) >= 0)
        if p >= 0:
            assert checker.map_c[p] == checker.tau_c.run(syms)
            assert checker.tau_i.accepting[p] == checker.tau_i_ordinary.accepting[checker.tau_i_ordinary.run(syms)]
    assert checker.tau_i_ordinary.n_states <= checker.tau_i.n_states
    # the encoding: D_p = D_map(p) computed on τ_∩, equal to the note's BFS over (τ_C, complete τ_Q) pairs
    for k, pair in enumerate(checker.product.origin):
        assert isinstance(pair, tuple)
        c, s = int(pair[0]), int(pair[1])
        p = checker.product_block[k]
        assert checker.map_c[p] == c
        want = derivatives_equal_via_query(checker.tau_c, c, checker.tau_q, s)
        assert checker.der_equivalent[p] == want
        assert derivatives_equal(checker.tau_i_ordinary, minimize(checker.product)[1][k], checker.tau_c, c) == want
    assert minimize(checker.tau_i)[0].n_states == checker.tau_i_ordinary.n_states


SASE_QUERIES = [
    ("SEQ(A, B)", "EVENT SEQ(A a, B b) WITHIN 1000"),
    ("SEQ(A, !C, B)", "EVENT SEQ(A a, !(C c), B b) WITHIN 1000"),
    ("SEQ(!C, A, B)", "EVENT SEQ(!(C c), A a, B b) WITHIN 1000"),
    ("SEQ(A, B, !C)", "EVENT SEQ(A a, B b, !(C c)) WITHIN 1000"),
    ("SEQ(A[x=1], !B[x!=1], A)", "EVENT SEQ(A a, !(B b), A d) WHERE a.x = 1 AND b.x != 1 WITHIN 1000"),
    ("SEQ(A, A, C)", "EVENT SEQ(A a, A b, C c) WITHIN 1000"),
]


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(SASE_QUERIES), st.lists(st.sampled_from(LETTERS), max_size=7))
def test_brute_force_matcher_agrees_with_sase_reference(queries: tuple[str, str], word: list[Letter]) -> None:
    """The brute-force matcher's semantics are SASE's with a window longer than the trace."""
    from cep.constraints import parse_pattern

    pattern, sase = parse_pattern(queries[0]), parse_query(queries[1])
    events = [SaseEvent(t, i + 1, attrs_of((t, v)), f"e{i}") for i, (t, v) in enumerate(word)]
    assert brute_match(pattern, word) == bool(reference_matches(sase, events))


@SETTINGS
@given(regexes(finite=True), patterns(), st.lists(st.sampled_from(LETTERS), max_size=6))
def test_violation_exactly_where_the_trace_leaves_the_constraint(
    constraint: Node, pattern: SequencePattern, word: list[Letter]
) -> None:
    words = language_or_skip(constraint, 64)
    assume(words)
    prefixes = {w[:i] for w in words for i in range(len(w) + 1)}
    leave = next((i for i in range(1, len(word) + 1) if tuple(word[:i]) not in prefixes), None)
    for algorithm in ("basic", "lightweight"):
        checker = ConstraintChecker(constraint, pattern, algorithm)
        trace = checker.new_trace()
        decided_before = None
        for i, letter in enumerate(word, start=1):
            if decided_before is None and trace.verdict is not Verdict.UNDECIDED:
                decided_before = i - 1
            v = checker.step(trace, letter[0], attrs_of(letter))
            if v is Verdict.VIOLATION:
                assert i == leave
        if leave is not None and trace.verdict is not Verdict.VIOLATION:
            assert trace.verdict_at < leave  # decided (SAT/UNSAT) before the trace left the constraint
        if leave is None:
            assert trace.verdict is not Verdict.VIOLATION


@SETTINGS
@given(regexes(finite=False), patterns(), st.randoms(use_true_random=False), st.sampled_from(["basic", "lightweight"]))
def test_snapshot_restore_at_any_cut_changes_nothing(
    constraint: Node, pattern: SequencePattern, rnd: random.Random, algorithm: str
) -> None:
    words = language_or_skip(constraint, 6)
    assume(words)
    word = rnd.choice(sorted(words, key=repr))
    cut = rnd.randrange(len(word) + 1)
    checker = ConstraintChecker(constraint, pattern, "basic" if algorithm == "basic" else "lightweight")
    whole = verdicts(checker, word)
    trace = checker.new_trace()
    for letter in word[:cut]:
        checker.step(trace, letter[0], attrs_of(letter))
    blob = checker.snapshot(trace)
    fresh = ConstraintChecker(constraint, pattern, "basic" if algorithm == "basic" else "lightweight")
    restored = fresh.restore_trace(blob)
    after = [restored.verdict]
    for letter in word[cut:]:
        fresh.step(restored, letter[0], attrs_of(letter))
        after.append(restored.verdict)
    assert after == whole[cut:]
    full = checker.new_trace()
    for letter in word:
        checker.step(full, letter[0], attrs_of(letter))
    assert checker.snapshot(full) == fresh.snapshot(restored)


def test_language_enumeration_sanity() -> None:
    node = parse_constraint("A B* | C")
    words = language(node, 3)
    assert {tuple(t for t, _ in w) for w in words} == {("A",), ("A", "B"), ("A", "B", "B"), ("C",)}
    assert regex_dfa(node, 1, lambda s: frozenset({0})).n_states > 0
    assert trim(regex_dfa(node, 1, lambda s: frozenset({0}))).n_states > 0
