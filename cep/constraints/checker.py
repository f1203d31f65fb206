"""Early sat/unsat checking of a SEQ query against a constraint (Li 2010, §3.2-3.3, Algorithms 1-3).

Built once per (constraint, query):

1. the alphabet is refined by the conditions of both (Ex. 3.8);
2. τ_C = minimal DFA of L(C), trimmed (no dead state); τ_Q = minimal complete DFA of L(Q);
3. τ_∩~ = τ_C x τ_Q, trimmed (reachable and co-reachable, so a missing transition means no continuation can
   match: Thm 3.1);
4. τ_∩ = the specialised minimisation of τ_∩~ (refinement from the partition keyed by (accepting, τ_C state)), so
   every state p has one constraint state map(p) (Thm 3.3);
5. lightweight (Algorithm 3): every state p gets ``DER_EQUIVALENT`` iff D_p = D_map(p) (Thm 3.2).

Runtime, per trace (a :class:`TraceState`), consulted *before* the engine processes the event (Algorithm 5):

* ``basic`` (Algorithm 1): two lookups per event (τ_C and an ordinarily minimised τ_∩) and, whenever a state
  changes, a derivative comparison D_p' = D_q' computed then (a BFS over both automata);
* ``lightweight`` (Algorithm 2): one lookup per event in the specialised τ_∩ and a test of the precomputed
  encoding of the *new* state p' (the printed l.19 tests p before the move, one state change late: fixed).

Verdicts: SATISFIABLE (every legal continuation matches: early alert), UNSATISFIABLE (no legal continuation can
match: stop monitoring), each at most once per trace; after either the trace is decided and further steps do no
work.  An event that is no legal move of τ_C (the input breaks the constraint, or its type is outside the
alphabet) gives VIOLATION, never UNSATISFIABLE: the checker cannot know what the trace does next, so the trace
falls back to unchecked (plain execution) for the rest of its life.

When the query is windowed (``windowed=True``) or the pattern is inexact (cross predicates), only
UNSATISFIABLE is reported: an untimed workflow cannot promise a match within W, and the checked language is then a
superset of the real matches (see cep.constraints.pattern).
"""

from __future__ import annotations

import enum
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from .alphabet import Alphabet
from .automata import Dfa, complete, derivatives_equal, minimize, nfa_to_dfa, product, regex_dfa, trim
from .pattern import SequencePattern, pattern_of
from .regex import ConstraintError, Node, Sym, parse_constraint, symbols_of, to_text

__all__ = ["CheckerCounters", "ConstraintChecker", "TraceState", "Verdict", "query_dfa"]

Algorithm = Literal["basic", "lightweight"]

_SNAPSHOT_VERSION = 1


class Verdict(enum.IntEnum):
    """What the checker knows about a trace.  Int values are the snapshot encoding."""

    UNDECIDED = 0
    SATISFIABLE = 1
    UNSATISFIABLE = 2
    VIOLATION = 3


_UNDECIDED = Verdict.UNDECIDED
_SATISFIABLE = Verdict.SATISFIABLE


class TraceState:
    """Per-trace checker state: automaton positions and the sticky verdict.

    ``p``: state of τ_∩ (-1 once the trace is decided or unchecked); ``q``: state of τ_C (basic only);
    ``events``: events stepped while the trace was being checked; ``verdict_at``: 1-based index of the event at
    which the verdict was reached (0: static, before any event; -1: none yet)."""

    __slots__ = ("events", "p", "q", "verdict", "verdict_at")

    def __init__(self, p: int, q: int, verdict: Verdict = Verdict.UNDECIDED, events: int = 0, verdict_at: int = -1):
        self.p = p
        self.q = q
        self.verdict = verdict
        self.events = events
        self.verdict_at = verdict_at

    @property
    def checking(self) -> bool:
        """True while steps still do work (no verdict, no violation)."""
        return self.verdict is Verdict.UNDECIDED

    def __repr__(self) -> str:
        return (
            f"TraceState(p={self.p}, q={self.q}, verdict={self.verdict.name}, events={self.events}, "
            f"verdict_at={self.verdict_at})"
        )


@dataclass(slots=True)
class CheckerCounters:
    """Cumulative over all traces of one checker."""

    steps: int = 0
    """events stepped on traces still being checked"""
    sat: int = 0
    unsat: int = 0
    violations: int = 0
    derivative_checks: int = 0
    """runtime derivative comparisons (basic only; lightweight precomputes them)"""

    def as_dict(self) -> dict[str, int]:
        return {
            "steps": self.steps,
            "sat": self.sat,
            "unsat": self.unsat,
            "violations": self.violations,
            "derivative_checks": self.derivative_checks,
        }


def query_dfa(pattern: SequencePattern, alphabet: Alphabet, *, edges: bool = True) -> Dfa:
    """Minimal complete DFA of L(Q) (see cep.constraints.pattern for the language).

    NFA: state i = i positives matched; state i loops on every symbol outside gap i's negated classes and moves
    to i+1 on the class of positive i+1; state m accepts."""
    positives = [frozenset().union(*(alphabet.matching(s) for s in p.symbols)) for p in pattern.positives]
    forbidden = [frozenset().union(*(alphabet.matching(s) for s in g)) for g in pattern.gaps(edges=edges)]
    m = len(positives)

    def successors(states: frozenset[int], a: int) -> frozenset[int]:
        out = set()
        for i in states:
            if a not in forbidden[i]:
                out.add(i)
            if i < m and a in positives[i]:
                out.add(i + 1)
        return frozenset(out)

    d = trim(nfa_to_dfa(len(alphabet), frozenset({0}), successors, lambda s: m in s))
    if d.is_empty():
        return complete(Dfa(len(alphabet), [{}], [False], ["never"]))
    return complete(minimize(d)[0])


def _specialised_intersection(raw: Dfa, tau_c: Dfa) -> tuple[Dfa, Dfa, list[int], list[int], list[bool]]:
    """Steps 4 and 5 from the trimmed product τ_∩~: (τ_∩; the ordinarily minimised τ_∩~ that ``basic`` steps
    through; τ_∩~ state -> its τ_∩ state; τ_∩ state -> its τ_C state, map(p); DER_EQUIVALENT of every τ_∩ state,
    Algorithm 3's encoding, of which the start state's is the static verdict)."""
    if raw.is_empty():
        return raw, raw, [], [], []
    pairs: list[tuple[int, int]] = [o for o in raw.origin]  # type: ignore[misc]
    tau_i, blocks = minimize(raw, key=lambda s: (raw.accepting[s], pairs[s][0]))
    map_c = [0] * tau_i.n_states
    for s, b in enumerate(blocks):
        map_c[b] = pairs[s][0]
    tau_i_ordinary, _ = minimize(raw)
    der_equivalent = [derivatives_equal(tau_i, p, tau_c, map_c[p]) for p in range(tau_i.n_states)]
    return tau_i, tau_i_ordinary, blocks, map_c, der_equivalent


class ConstraintChecker:
    """Sat/unsat checking of one query against one constraint; one :class:`TraceState` per trace."""

    def __init__(
        self,
        constraint: str | Node,
        query: Any,
        algorithm: Algorithm = "lightweight",
        *,
        windowed: bool = False,
    ) -> None:
        if algorithm not in ("basic", "lightweight"):
            raise ConstraintError(f"algorithm must be 'basic' or 'lightweight', got {algorithm!r}")
        self.algorithm: Algorithm = algorithm
        self.constraint: Node = parse_constraint(constraint) if isinstance(constraint, str) else constraint
        self.constraint_text = to_text(self.constraint)
        self.pattern = pattern_of(query)
        self.windowed = windowed
        self.reports_sat = self.pattern.exact and not windowed

        c_syms = symbols_of(self.constraint)
        q_syms = list(self.pattern.symbols())
        types = {s.event_type for s in (*c_syms, *q_syms)}
        conds = [(s.event_type, c) for s in (*c_syms, *q_syms) for c in s.conds]
        self.alphabet = Alphabet(types, conds)
        self.constraint_types = frozenset(s.event_type for s in c_syms)
        self.event_types = frozenset(types)
        """every type the constraint or the query names (an event of another type is a VIOLATION if stepped)"""
        n = len(self.alphabet)

        def resolve(s: Sym) -> frozenset[int]:
            return self.alphabet.matching(s)

        tc = trim(regex_dfa(self.constraint, n, resolve))
        if tc.is_empty():
            raise ConstraintError(f"constraint {self.constraint_text!r} accepts no trace (its symbols' conditions "
                                  "cannot hold)")
        self.tau_c, _ = minimize(tc)
        self.tau_q = query_dfa(self.pattern, self.alphabet, edges=not windowed)
        raw = trim(product(self.tau_c, self.tau_q))
        self.product = raw
        """τ_∩~: the trimmed cross product; origin[s] = (τ_C state, τ_Q state)"""
        self.tau_i, self.tau_i_ordinary, self.product_block, self.map_c, self.der_equivalent = (
            _specialised_intersection(raw, self.tau_c))
        self.static_verdict = self._static()
        self.counters = CheckerCounters()
        # Flat tables for the per-event path.
        self._delta_c = self.tau_c.delta
        self._delta_i = self.tau_i.delta if algorithm == "lightweight" else self.tau_i_ordinary.delta
        self._enc_sat = [e and self.reports_sat for e in self.der_equivalent]
        self._lightweight = algorithm == "lightweight"
        self._plain = self.alphabet.plain_symbols

    def _static(self) -> Verdict:
        if self.product.is_empty():
            return Verdict.UNSATISFIABLE
        if self.reports_sat and self.der_equivalent[0]:
            return Verdict.SATISFIABLE
        return Verdict.UNDECIDED

    # ---------------------------------------------------------------------------------------------------------------
    # per trace

    def new_trace(self) -> TraceState:
        """A trace before its first event; already decided when the static verdict is SAT or UNSAT."""
        if self.static_verdict is not Verdict.UNDECIDED:
            return TraceState(-1, -1, self.static_verdict, 0, 0)
        return TraceState(0, 0)

    def classify(self, event_type: str, attrs: Mapping[str, Any]) -> int:
        """The refined symbol of an event (-1: type outside the alphabet)."""
        return self.alphabet.classify(event_type, attrs)

    def step(self, trace: TraceState, event_type: str, attrs: Mapping[str, Any] | None = None) -> Verdict:
        """Feed one event of the trace; returns the verdict reached *at* this event (see the module docstring)."""
        if trace.verdict is not _UNDECIDED:
            return _UNDECIDED
        sym = self._plain.get(event_type)
        if sym is None:
            sym = self.alphabet.classify(event_type, attrs or {})
        self.counters.steps += 1
        trace.events += 1
        if not self._lightweight:
            return self._step_basic(trace, sym)
        return self._step_lightweight(trace, sym)

    def step_symbol(self, trace: TraceState, sym: int) -> Verdict:
        """:meth:`step` with the event already classified."""
        if trace.verdict is not Verdict.UNDECIDED:
            return Verdict.UNDECIDED
        self.counters.steps += 1
        trace.events += 1
        if self._lightweight:
            return self._step_lightweight(trace, sym)
        return self._step_basic(trace, sym)

    def _step_lightweight(self, trace: TraceState, sym: int) -> Verdict:
        # Algorithm 2 (the per-event path): one τ_∩ lookup, then the new state's encoding.
        p = trace.p
        nxt = self._delta_i[p].get(sym)
        if nxt is None:
            return self._fall_out(trace, p, sym)
        trace.p = nxt
        # Algorithm 2 with l.19 fixed: the encoding of the state just entered (p'), not of the one left.
        if nxt != p and self._enc_sat[nxt]:
            return self._decide(trace, _SATISFIABLE)
        return _UNDECIDED

    def _fall_out(self, trace: TraceState, p: int, sym: int) -> Verdict:
        # Only here does the constraint automaton need a look: every τ_∩ move is a τ_C move.
        if sym < 0 or sym not in self._delta_c[self.map_c[p]]:
            return self._decide(trace, Verdict.VIOLATION)
        return self._decide(trace, Verdict.UNSATISFIABLE)

    def _step_basic(self, trace: TraceState, sym: int) -> Verdict:
        p, q = trace.p, trace.q
        q2 = self._delta_c[q].get(sym)
        if q2 is None:
            return self._decide(trace, Verdict.VIOLATION)
        p2 = self._delta_i[p].get(sym)
        if p2 is None:
            return self._decide(trace, Verdict.UNSATISFIABLE)
        trace.p, trace.q = p2, q2
        if (p2 != p or q2 != q) and self.reports_sat:
            self.counters.derivative_checks += 1
            if derivatives_equal(self.tau_i_ordinary, p2, self.tau_c, q2):
                return self._decide(trace, Verdict.SATISFIABLE)
        return Verdict.UNDECIDED

    def _decide(self, trace: TraceState, verdict: Verdict) -> Verdict:
        trace.verdict = verdict
        trace.verdict_at = trace.events
        trace.p = trace.q = -1
        c = self.counters
        if verdict is Verdict.SATISFIABLE:
            c.sat += 1
        elif verdict is Verdict.UNSATISFIABLE:
            c.unsat += 1
        else:
            c.violations += 1
        return verdict

    def snapshot(self, trace: TraceState) -> list[int]:
        """Plain ints (JSON/msgpack-able); :meth:`restore_trace` reads them back on a checker built from the
        same constraint, query and algorithm."""
        return [_SNAPSHOT_VERSION, trace.p, trace.q, int(trace.verdict), trace.events, trace.verdict_at]

    def restore_trace(self, data: Sequence[int]) -> TraceState:
        if len(data) != 6 or data[0] != _SNAPSHOT_VERSION:
            raise ConstraintError(f"not a trace snapshot of format {_SNAPSHOT_VERSION}: {list(data)!r}")
        _, p, q, verdict, events, verdict_at = (int(x) for x in data)
        v = Verdict(verdict)
        if v is Verdict.UNDECIDED:
            n_i = len(self._delta_i)
            if not (0 <= p < n_i) or (self.algorithm == "basic" and not 0 <= q < self.tau_c.n_states):
                raise ConstraintError(f"trace snapshot {list(data)!r} does not fit this checker's automata")
        return TraceState(p, q, v, events, verdict_at)

    # ---------------------------------------------------------------------------------------------------------------
    # helpers for engines and tests

    def trace_key(self, event_type: str, attrs: Mapping[str, Any], partition: Mapping[str, str]) -> Hashable:
        """The trace an event belongs to: its value of the partition attribute of its type (cep.sase's
        ``Query.partition_attributes``).  A constraint type the query does not mention uses the attribute all
        query types share when they share one (``id``); None when there is no such attribute (one trace)."""
        attr = partition.get(event_type)
        if attr is None:
            names = set(partition.values())
            if len(names) != 1:
                return None
            attr = next(iter(names))
        return attrs.get(attr)

    def symbol_labels(self) -> list[str]:
        return [s.label for s in self.alphabet.symbols]

    def word(self, events: Sequence[tuple[str, Mapping[str, Any]] | str]) -> list[int]:
        """Classify a whole trace (``"A"`` or ``("A", {"id": 3})`` items); for tests and docs."""
        out = []
        for e in events:
            t, attrs = (e, {}) if isinstance(e, str) else e
            out.append(self.alphabet.classify(t, attrs))
        return out

    def describe(self) -> dict[str, Any]:
        """Sizes and the static verdict, for logs and docs."""
        return {
            "constraint": self.constraint_text,
            "pattern": str(self.pattern),
            "algorithm": self.algorithm,
            "symbols": len(self.alphabet),
            "constraint_states": self.tau_c.n_states,
            "query_states": self.tau_q.n_states,
            "product_states": self.product.n_states,
            "intersection_states": self.tau_i.n_states,
            "ordinary_intersection_states": self.tau_i_ordinary.n_states,
            "der_equivalent_states": sum(self.der_equivalent),
            "static_verdict": self.static_verdict.name,
            "reports_sat": self.reports_sat,
        }
