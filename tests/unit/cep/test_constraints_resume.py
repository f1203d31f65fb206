"""Issue 25.2: a terminated trace that breaks the workflow later is processed exactly as without the constraint
from the violating event on (docs/constraints.md), in order and under K-slack, with negation.

The reference is the plain engine (same query, same arrivals, no constraint) and, per trace, the checker run
independently over the trace in timestamp order: the unsatisfiable verdict at u, the first event v after it that
is no legal move of the workflow automaton.  Then, per trace:

* never terminated: exactly the plain engine's matches;
* terminated, never violated: none (the plain engine has none either);
* terminated at u, violated at v: every plain match whose events are all at or after v, nothing the plain engine
  does not find; with K = 0 exactly those (a match spanning the violation is lost; under K-slack one that was
  out before the verdict stays out: it is a plain match; so does one of a trace forgotten in a gap longer than W
  and back unchecked).

Random workflows (regular expressions drawn from a small grammar), random words walked on the workflow automaton
with random letters inserted, five queries (no negation, leading, middle and trailing negation), random W, K,
arrival orders within K, both modes, both checkers.
"""

from __future__ import annotations

import itertools
import random
from collections import Counter, defaultdict
from collections.abc import Hashable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cep.constraints import ConstraintChecker, Verdict
from cep.constraints.checker import Algorithm
from cep.sase import EngineConfig, SaseEvent, SaseOutput, SequenceEngine, parse_query
from cep.sase.events import VerdictOutput
from cep.sase.query import Query

QUERIES = [
    "EVENT SEQ(A a, K k, C c) WHERE [id] WITHIN {w}",
    "EVENT SEQ(!(B b), K k, C c) WHERE [id] WITHIN {w}",
    "EVENT SEQ(A a, !(B b), C c) WHERE [id] WITHIN {w}",
    "EVENT SEQ(A a, K k, !(B b)) WHERE [id] WITHIN {w}",
    "EVENT SEQ(A a, !(K k), B b, C c) WHERE [id] WITHIN {w}",
]
LETTERS = "ABCK"


def random_workflow(rng: random.Random) -> str:
    """A concatenation of 2-5 atoms: a letter, repeated (+, *), or a choice of two letters."""
    atoms = []
    for _ in range(rng.randint(2, 5)):
        x, y = rng.sample(LETTERS, 2)
        atoms.append(rng.choice([x, f"{x}+", f"{x}*", f"({x} | {y})", f"({x} | {y})*"]))
    return " ".join(atoms)


def walk(checker: ConstraintChecker, rng: random.Random, noise: float) -> list[str]:
    """A prefix of a word of the workflow (a walk on τ_C), each step replaced by a random letter with probability
    ``noise`` (which may or may not break the workflow)."""
    tau = checker.tau_c
    names = {sym: t for t, sym in checker.alphabet.plain_symbols.items()}
    letters = sorted(names.values())  # the workflow's and the query's types: the others are in no trace
    state, out = 0, []
    for _ in range(rng.randint(1, 12)):
        if rng.random() < noise:
            letter = rng.choice(letters)
            out.append(letter)
            nxt = tau.delta[state].get(checker.alphabet.plain_symbols[letter]) if state >= 0 else None
            state = -1 if nxt is None else nxt
            continue
        moves = [s for s in tau.delta[state] if s in names] if state >= 0 else []
        if not moves:
            letter = rng.choice(letters)
            out.append(letter)
            state = -1
            continue
        sym = rng.choice(moves)
        out.append(names[sym])
        state = tau.delta[state][sym]
    return out


def verdict_points(checker: ConstraintChecker, events: list[SaseEvent]) -> tuple[int | None, int | None]:
    """(index of the event at which the trace was found unsatisfiable, -1 for a static verdict; index of the first
    violation after it) over one trace in timestamp order; (None, None) when the trace is decided otherwise
    (satisfiable, a violation first) or never."""
    state = checker.new_trace()
    u = -1 if state.verdict == Verdict.UNSATISFIABLE else None
    if u is None and state.verdict == Verdict.UNDECIDED:
        for i, e in enumerate(events):
            verdict = checker.step(state, e.event_type, e.attrs)
            if verdict == Verdict.UNSATISFIABLE:
                u = i
                break
            if verdict != Verdict.UNDECIDED:
                return None, None
    if u is None:
        return None, None
    # The workflow automaton alone over the whole trace: the first event it cannot take is the violation (never
    # at or before u: the checker calls that a violation, not unsatisfiable).
    cstate = 0
    for i, e in enumerate(events):
        nxt = checker.tau_c.delta[cstate].get(checker.alphabet.plain_symbols[e.event_type])
        if nxt is None:
            assert i > u
            return u, i
        cstate = nxt
    return u, None


def net_matches(outputs: list[SaseOutput]) -> dict[Hashable, Counter[tuple[str, ...]]]:
    out: dict[Hashable, Counter[tuple[str, ...]]] = defaultdict(Counter)
    for o in outputs:
        sign = {"match": 1, "add": 1, "late_match": 1, "retract": -1, "invalidated": -1}.get(o.kind)
        if sign is not None and not isinstance(o, VerdictOutput):
            out[o.events[0].attrs["id"]][tuple(str(e.event_id) for e in o.events)] += sign
    return {k: +v for k, v in out.items()}


@st.composite
def workloads(draw: st.DrawFn) -> tuple[str, int, Query, list[SaseEvent], int, str, Algorithm]:
    rng = random.Random(draw(st.integers(0, 2**32)))
    constraint = random_workflow(rng)
    query_index = draw(st.integers(0, len(QUERIES) - 1))
    query = parse_query(QUERIES[query_index].format(w=rng.choice([30, 60, 150, 1000])))
    checker = ConstraintChecker(constraint, query, algorithm="lightweight", windowed=True)
    traces = [walk(checker, rng, rng.choice([0.0, 0.1, 0.3])) for _ in range(rng.randint(1, 3))]
    cursors = [0] * len(traces)
    order = []
    while any(c < len(t) for c, t in zip(cursors, traces, strict=True)):
        i = rng.choice([j for j, t in enumerate(traces) if cursors[j] < len(t)])
        order.append((i, traces[i][cursors[i]]))
        cursors[i] += 1
    events = [SaseEvent(t, 10 * n, {"id": i}, f"{t}{10 * n}") for n, (i, t) in enumerate(order)]
    k = rng.choice([0, 0, 5, 20, 60])
    arrivals = sorted(((e.ts + rng.randint(0, k), n, e) for n, e in enumerate(events)), key=lambda x: x[:2])
    mode = rng.choice(["conservative", "aggressive"])
    algorithm: Algorithm = rng.choice(["basic", "lightweight"])
    return constraint, query_index, query, [e for _, _, e in arrivals], k, mode, algorithm


@given(workloads())
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_from_the_violation_on_a_trace_is_processed_as_without_the_constraint(
        workload: tuple[str, int, Query, list[SaseEvent], int, str, Algorithm]) -> None:
    constraint, _qi, query, arrivals, k, mode, algorithm = workload
    config = {"k_slack_us": k, "mode": mode, "allowed_lateness_us": 0}
    plain = SequenceEngine(query, EngineConfig(**config))  # type: ignore[arg-type]
    watched = SequenceEngine(query, EngineConfig(constraint=constraint, constraint_checker=algorithm,
                                                 **config))  # type: ignore[arg-type]
    plain_net = net_matches([o for e in arrivals for o in plain.on_event(e)] + plain.end_of_stream())
    outs = [o for e in arrivals for o in watched.on_event(e)] + watched.end_of_stream()
    watched_net = net_matches(outs)
    # A snapshot at a random cut, restored into a fresh engine, changes no output (suspended matches included).
    cut = len(arrivals) * (sum(e.ts for e in arrivals) % 7) // 7
    first = SequenceEngine(query, watched.config)
    again = [o for e in arrivals[:cut] for o in first.on_event(e)]
    second = SequenceEngine.restore(query, watched.config, first.snapshot())
    again += [o for e in arrivals[cut:] for o in second.on_event(e)] + second.end_of_stream()
    assert again == outs
    checker = ConstraintChecker(constraint, query, algorithm="lightweight", windowed=True)
    for trace in {e.attrs["id"] for e in arrivals}:
        events = sorted((e for e in arrivals if e.attrs["id"] == trace), key=lambda e: e.ts)
        u, v = verdict_points(checker, events)
        got = watched_net.get(trace, Counter())
        want = plain_net.get(trace, Counter())
        assert all(n == 1 for n in got.values()), (trace, got)
        if u is None:
            assert got == want, (trace, u, v)
        elif v is None:
            assert not got and not want, (trace, u, v)
        else:
            after = Counter({m: n for m, n in want.items() if int(m[0].lstrip(LETTERS)) >= events[v].ts})
            assert +(after - got) == Counter(), ("lost", trace, u, v)
            assert +(got - want) == Counter(), ("extra", trace, u, v)
            # A trace whose events are more than W apart can be forgotten in the gap and come back unchecked
            # (plain, docs/constraints.md): then a match spanning the violation may be found even with K = 0.
            gap = any(b.ts - a.ts >= query.window for a, b in itertools.pairwise(events))
            if k == 0 and not gap:
                assert got == after, (trace, u, v)
    assert watched.stats()["instances"] == 0


@pytest.mark.parametrize("mode", ["conservative", "aggressive"])
def test_in_order_a_negation_event_ignored_while_terminated_still_negates_after_the_violation(mode: str) -> None:
    """K = 0, ``SEQ(!(B b), K k, C c)`` under ``A B* C | K C``: after a1 only B* C can follow, so no K: the trace
    is unsatisfiable at a1.  b2 is a legal move (ignored before the fix), k3 breaks the workflow: plain from k3 on.
    The plain run has no match: b2 lies within W before k3 and negates <k3 c4>; before the fix <k3 c4> came out."""
    query = parse_query("EVENT SEQ(!(B b), K k, C c) WHERE [id] WITHIN 100")
    stream = [SaseEvent(t, ts, {"id": 1}, f"{t}{ts}") for t, ts in [("A", 1), ("B", 2), ("K", 3), ("C", 4)]]
    plain = SequenceEngine(query, EngineConfig(k_slack_us=0, mode=mode))  # type: ignore[arg-type]
    assert net_matches([o for e in stream for o in plain.on_event(e)] + plain.end_of_stream()) == {}
    watched = SequenceEngine(query, EngineConfig(k_slack_us=0, mode=mode,  # type: ignore[arg-type]
                                                 constraint="A B* C | K C"))
    outs = [o for e in stream for o in watched.on_event(e)] + watched.end_of_stream()
    assert [(o.kind, [e.event_id for e in o.events]) for o in outs if isinstance(o, VerdictOutput)] == [
        ("monitor_terminated", ["A1"])]
    assert net_matches(outs) == {}
    assert watched.stats()["constraint_resumed"] == 1


@pytest.mark.parametrize("mode", ["conservative", "aggressive"])
def test_under_k_slack_the_events_from_the_violation_on_are_not_lost(mode: str) -> None:
    """K = 10, ``SEQ(K k, C c)`` under ``A B* C | K C``.  a12 of trace 2 moves L to 2: a1 is final, trace 1 is
    unsatisfiable at a1.  k5 (within K) breaks the workflow, but the checker reaches it only once L passes 5;
    before the fix k5 and c13 arrived while trace 1 was terminated and were ignored, and the plain run's match
    <k5 c13> was lost."""
    query = parse_query("EVENT SEQ(K k, C c) WHERE [id] WITHIN 100")
    stream = [SaseEvent(t, ts, {"id": i}, f"{t}{ts}") for t, ts, i in
              [("A", 1, 1), ("A", 12, 2), ("K", 5, 1), ("C", 13, 1), ("B", 40, 2)]]
    plain = SequenceEngine(query, EngineConfig(k_slack_us=10, mode=mode))  # type: ignore[arg-type]
    assert net_matches([o for e in stream for o in plain.on_event(e)] + plain.end_of_stream()) == {
        1: Counter({("K5", "C13"): 1})}
    watched = SequenceEngine(query, EngineConfig(k_slack_us=10, mode=mode,  # type: ignore[arg-type]
                                                 constraint="A B* C | K C"))
    per_event = [[(o.kind, [e.event_id for e in o.events]) for o in watched.on_event(e)] for e in stream]
    assert per_event == [[], [("monitor_terminated", ["A1"])], [], [],
                         [("monitor_terminated", ["A12"]), ("match", ["K5", "C13"])]]
    assert watched.end_of_stream() == []
    assert watched.stats()["constraint_resumed"] == 1 and watched.stats()["instances"] == 0


def verdicts(outs: list[SaseOutput]) -> list[tuple[str, list[str | None], Hashable, int]]:
    return [(o.kind, [e.event_id for e in o.events], o.trace, o.position) for o in outs
            if isinstance(o, VerdictOutput)]


@pytest.mark.parametrize(("query_text", "expected"), [
    # statically satisfiable under A+ K* B+ K C+ (early alerts): one alert per trace, at its first event
    ("EVENT SEQ(A a, K k, C c) WHERE [id] WITHIN 1000",
     [[], [], [("early_alert", ["a2"], 1, 0)]]),
    # statically unsatisfiable: one record for the stream, at its first event
    ("EVENT SEQ(A a, K k, D d) WHERE [id] WITHIN 1000",
     [[], [], [("monitor_terminated", ["a2"], None, 0)]]),
])
def test_static_verdicts_name_the_first_event_by_timestamp_not_the_first_to_arrive(
        query_text: str, expected: list[list[tuple[str, list[str], Hashable, int]]]) -> None:
    """K = 10: k5 arrives before a2 of the same trace.  The record waits until L passes the earliest event; before
    the fix it named k5 at once."""
    stream = [SaseEvent("K", 5, {"id": 1}, "k5"), SaseEvent("A", 2, {"id": 1}, "a2"),
              SaseEvent("A", 20, {"id": 2}, "a20")]
    eng = SequenceEngine(parse_query(query_text), EngineConfig(k_slack_us=10, constraint="A+ K* B+ K C+",
                                                               early_alerts="C c" in query_text))
    assert [verdicts(eng.on_event(e)) for e in stream] == expected
    rest = verdicts(eng.end_of_stream())
    assert rest == ([("early_alert", ["a20"], 2, 0)] if "C c" in query_text else [])
