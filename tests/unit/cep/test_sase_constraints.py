"""Constraint-aware execution in the SASE engine (Li 2010, Algorithm 5; docs/constraints.md).

Li's worked examples (Ex. 3.4, 3.8, 3.9) as exact tests, then the decisions the dissertation leaves open
(windows, violations, out-of-order input, snapshots, bounded trace records), then properties on random traces
drawn from the constraint: the constraint never changes a match of a trace it does not terminate, a terminated
trace has no match, an early alert is followed by a match.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Sequence
from typing import Any, Literal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cep.constraints import ConstraintChecker
from cep.sase import EngineConfig, SaseError, SaseEvent, SaseOutput, SequenceEngine, parse_query
from cep.sase import monitor as monitor_module
from cep.sase.events import VerdictOutput

C1 = "A+ K* B+ K C+"
Q2 = "EVENT SEQ(A a, K k1, K k2, C c) WITHIN 1000"
H1 = [("A", 1), ("K", 2), ("B", 4), ("B", 7), ("K", 8), ("C", 9)]
H2 = [("A", 1), ("B", 4), ("B", 7), ("K", 8), ("C", 9)]


def ev(etype: str, ts: int, **attrs: Any) -> SaseEvent:
    return SaseEvent(etype, ts, attrs, f"{etype.lower()}{ts}")


def engine(query: str = Q2, constraint: str | None = C1, **config: Any) -> SequenceEngine:
    config.setdefault("k_slack_us", 0)
    return SequenceEngine(parse_query(query), EngineConfig(constraint=constraint, **config))


def brief(out: SaseOutput) -> tuple[Any, ...]:
    ids = [e.event_id for e in out.events]
    if isinstance(out, VerdictOutput):
        return (out.kind, ids, out.trace, out.position, out.reason)
    return (out.kind, ids)


def feed(eng: SequenceEngine, events: Sequence[SaseEvent]) -> list[list[tuple[Any, ...]]]:
    """The outputs of each event, in order."""
    return [[brief(o) for o in eng.on_event(e)] for e in events]


# ------------------------------------------------------------------------------------------ Li's examples


@pytest.mark.parametrize("mode", ["conservative", "aggressive"])
@pytest.mark.parametrize("checker", ["basic", "lightweight"])
def test_ex_3_9_h1_early_alert_at_k2_then_the_match_at_c9(mode: str, checker: str) -> None:
    eng = engine(early_alerts=True, mode=mode, constraint_checker=checker)
    assert feed(eng, [ev(t, ts) for t, ts in H1]) == [
        [],
        [("early_alert", ["k2"], None, 2, "satisfiable")],
        [], [], [],
        [("match", ["a1", "k2", "k8", "c9"])],
    ]
    assert eng.stats()["early_alerts"] == 1
    assert eng.end_of_stream() == []


def test_ex_3_9_h2_b4_purges_a1_terminates_and_nothing_after_is_buffered() -> None:
    eng = engine()
    assert feed(eng, [ev("A", 1)]) == [[]]
    ais = eng.partition()
    assert ais is not None and [len(s.items) for s in ais.stacks] == [1, 0, 0, 0]
    assert eng.counters.instances == 1
    assert feed(eng, [ev("B", 4)]) == [[("monitor_terminated", ["b4"], None, 2, "unsatisfiable")]]
    assert eng.partition() is None and eng.counters.instances == 0
    for t, ts in H2[2:]:
        assert eng.on_event(ev(t, ts)) == []
        assert eng.partition() is None  # b7, k8, c9 never buffered
    stats = eng.stats()
    assert (stats["instances"], stats["events"], stats["constraint_ignored"], stats["constraint_released"],
            stats["monitors_terminated"], stats["partitions"]) == (0, 1, 4, 1, 1, 1)
    assert stats["clock"] == 9  # ignored events still move time
    assert eng.end_of_stream() == []


def test_without_the_constraint_h2_buffers_everything_and_still_has_no_match() -> None:
    eng = engine(constraint=None)
    assert feed(eng, [ev(t, ts) for t, ts in H2]) == [[]] * 5
    ais = eng.partition()
    assert ais is not None and [len(s.items) for s in ais.stacks] == [1, 1, 1, 1]


def test_ex_3_4_static_sat_alerts_each_trace_at_its_first_event() -> None:
    eng = engine("EVENT SEQ(A a, K k, C c) WHERE [id] WITHIN 1000", early_alerts=True)
    assert feed(eng, [ev("A", 1, id=1), ev("A", 2, id=2), ev("K", 3, id=1)]) == [
        [("early_alert", ["a1"], 1, 0, "satisfiable")],
        [("early_alert", ["a2"], 2, 0, "satisfiable")],
        [],
    ]
    # Windowed reading (no early alerts): an allowed trace can never be terminated, so nothing is monitored.
    assert engine("EVENT SEQ(A a, K k, C c) WITHIN 1000").monitor is None
    assert engine("EVENT SEQ(A a, K k, K j, C c) WITHIN 1000").monitor is not None


def test_ex_3_4_static_unsat_terminates_once_and_never_buffers() -> None:
    eng = engine("EVENT SEQ(A a, K k, D d) WHERE [id] WITHIN 1000")
    out = feed(eng, [ev("A", 1, id=1), ev("K", 2, id=1), ev("A", 3, id=2), ev("B", 4, id=1)])
    assert out == [[("monitor_terminated", ["a1"], None, 0, "unsatisfiable")], [], [], []]
    assert eng.counters.instances == 0 and eng.counters.partitions == 0
    assert not eng.is_idle()  # a fresh engine would report again
    stats = eng.stats()
    assert (stats["constraint_ignored"], stats["constraint_violations"], stats["traces"]) == (4, 0, 2)


def test_static_unsat_still_follows_each_trace_and_a_violation_makes_it_plain() -> None:
    # Reviewer case B3: A B makes SEQ(A, C) unsatisfiable before any event.  Trace 1 (a1 c2) breaks the
    # constraint at c2: counted, and processed plainly from c2 on.  a1 was consistent when it came, so it was
    # not buffered (the point of the verdict): the plain run's match <a1 c2> needs it and is lost, with the
    # violation counted.  Trace 2 breaks the constraint first (c3), so it is plain before its a4: its match
    # <a4 c5> is exactly the plain run's.
    query = "EVENT SEQ(A a, C c) WHERE [id] WITHIN 10"
    stream = [ev("A", 1, id=1), ev("C", 2, id=1), ev("C", 3, id=2), ev("A", 4, id=2), ev("C", 5, id=2)]
    eng = engine(query, "A B")
    assert feed(eng, stream) == [[("monitor_terminated", ["a1"], None, 0, "unsatisfiable")], [], [], [],
                                 [("match", ["a4", "c5"])]]
    plain = engine(query, None)
    assert feed(plain, stream) == [[], [("match", ["a1", "c2"])], [], [], [("match", ["a4", "c5"])]]
    stats = eng.stats()
    assert {k: stats[k] for k in ("monitors_terminated", "constraint_violations", "constraint_resumed",
                                  "constraint_ignored", "traces")} == {
        "monitors_terminated": 1, "constraint_violations": 2, "constraint_resumed": 2, "constraint_ignored": 1,
        "traces": 2}


def test_a_terminated_trace_that_breaks_the_constraint_later_is_plain_from_the_violation_on() -> None:
    # b4 terminates h2 (A B ... leaves one K for SEQ(A, K, K, C)); c5 cannot follow b4 in A+ K* B+ K C+: from c5
    # on the trace is processed plainly (a6 k7 k8 c9 matches), what came before stays released.
    eng = engine("EVENT SEQ(A a, K k1, K k2, C c) WITHIN 1000")
    stream = [ev("A", 1), ev("B", 4), ev("C", 5), ev("A", 6), ev("K", 7), ev("K", 8), ev("C", 9)]
    assert feed(eng, stream) == [[], [("monitor_terminated", ["b4"], None, 2, "unsatisfiable")], [], [], [], [],
                                 [("match", ["a6", "k7", "k8", "c9"])]]
    stats = eng.stats()
    assert (stats["constraint_violations"], stats["constraint_resumed"], stats["constraint_ignored"]) == (1, 1, 1)


def test_ex_3_8_predicates_split_the_alphabet() -> None:
    query = "EVENT SEQ(A a, B b, C c) WHERE a.id = 3 WITHIN 1000"
    h9 = engine(query, "A+ B+ A+ C+", early_alerts=True)
    assert feed(h9, [ev("A", 1, id=2), ev("B", 3, id=0)]) == [
        [], [("monitor_terminated", ["b3"], None, 2, "unsatisfiable")]]
    h10 = engine(query, "A+ B+ A+ C+", early_alerts=True)
    assert feed(h10, [ev("A", 1, id=3), ev("B", 3, id=0), ev("A", 4, id=0), ev("C", 5, id=0)]) == [
        [("early_alert", ["a1"], None, 1, "satisfiable")], [], [], [("match", ["a1", "b3", "c5"])]]


# ------------------------------------------------------------------------------------------ decisions


def test_a_violation_is_counted_and_never_terminates() -> None:
    # a1 c2 breaks A+ K* B+ K C+ (C cannot follow A); the trace is processed plainly from then on: b3 would
    # have made it unsatisfiable (it has only one K left), yet its match comes.
    eng = engine()
    assert feed(eng, [ev("A", 1), ev("C", 2), ev("B", 3), ev("K", 4), ev("K", 5), ev("C", 6)]) == [
        [], [], [], [], [], [("match", ["a1", "k4", "k5", "c6"])]]
    stats = eng.stats()
    assert (stats["constraint_violations"], stats["monitors_terminated"], stats["constraint_ignored"]) == (1, 0, 0)


def test_a_windowed_query_uses_only_the_unsatisfiable_verdict() -> None:
    eng = engine()  # early_alerts off: the window counts
    assert feed(eng, [ev(t, ts) for t, ts in H1]) == [[], [], [], [], [], [("match", ["a1", "k2", "k8", "c9"])]]
    assert feed(engine(), [ev(t, ts) for t, ts in H2])[1] == [
        ("monitor_terminated", ["b4"], None, 2, "unsatisfiable")]


def test_early_alerts_need_a_query_the_checker_sees_whole() -> None:
    with pytest.raises(SaseError, match="cross predicate"):
        engine("EVENT SEQ(A a, C c) WHERE a.v < c.v WITHIN 1000", early_alerts=True)
    with pytest.raises(SaseError, match="early_alerts needs a constraint"):
        EngineConfig(early_alerts=True)
    with pytest.raises(SaseError, match="constraint_checker"):
        EngineConfig(constraint=C1, constraint_checker="fast")  # type: ignore[arg-type]
    with pytest.raises(SaseError, match="constraint"):
        engine(constraint="A+ (K")
    with pytest.raises(SaseError, match="one partition attribute name"):
        engine("EVENT SEQ(A a, C c) WHERE a.id = c.key WITHIN 1000")


@pytest.mark.parametrize("checker", ["basic", "lightweight"])
def test_several_traces_are_independent(checker: str) -> None:
    query = "EVENT SEQ(A a, K k1, K k2, C c) WHERE [id] WITHIN 1000"
    eng = engine(query, constraint_checker=checker, early_alerts=True)
    h1 = [ev(t, 10 * ts, id=1) for t, ts in H1]
    h2 = [ev(t, 10 * ts + 1, id=2) for t, ts in H2]
    out = [o for e in sorted([*h1, *h2], key=lambda e: e.ts) for o in map(brief, eng.on_event(e))]
    assert out == [
        ("early_alert", ["k20"], 1, 2, "satisfiable"),
        ("monitor_terminated", ["b41"], 2, 2, "unsatisfiable"),
        ("match", ["a10", "k20", "k80", "c90"]),
    ]
    assert eng.partition(2) is None
    ais = eng.partition(1)
    assert ais is not None and len(ais) == 6  # a, k twice (both K positions) twice, c
    assert eng.stats()["constraint_ignored"] == 4  # b41, b71, k81, c91


def test_out_of_order_input_is_checked_once_final_under_the_low_watermark() -> None:
    # K = 3: an event is checked once L = CLOCK - 3 reaches it, in timestamp order whatever the arrival order.
    eng = engine(k_slack_us=3)
    assert feed(eng, [ev("B", 4), ev("A", 1), ev("B", 7)]) == [
        [], [], [("monitor_terminated", ["b4"], None, 2, "unsatisfiable")]]
    assert eng.partition() is None  # a1 and b4 were buffered, then released at the verdict
    # b7 is above L: the checker has not reached it, a violation before it would make it plain (issue 25.2), so it
    # is processed (B is no query type: nothing to buffer); once L passes it, it is followed and the trace's next
    # final events are ignored.
    assert eng.stats()["constraint_ignored"] == 0
    assert feed(eng, [ev("B", 20), ev("B", 15)]) == [[], []]  # b15 is final at once (L = 17): followed, ignored
    assert eng.stats()["constraint_ignored"] == 1 and eng.partition() is None
    # Punctuations instead of K: nothing is checked before the punctuation reaches the events.
    eng = engine(k_slack_us=None, early_alerts=True)
    assert feed(eng, [ev("K", 2), ev("A", 1)]) == [[], []]
    assert [brief(o) for o in eng.on_punctuation(2)] == [("early_alert", ["k2"], None, 2, "satisfiable")]


def test_an_event_behind_what_the_checker_saw_stops_checking_its_trace() -> None:
    eng = engine(allowed_lateness_us=100)
    assert feed(eng, [ev("A", 2), ev("A", 3), ev("A", 1), ev("B", 5)]) == [[], [], [], []]
    stats = eng.stats()
    assert (stats["constraint_unordered"], stats["monitors_terminated"]) == (1, 0)
    ais = eng.partition()
    assert ais is not None and len(ais) == 3  # b5 was processed plainly (no stack of its own: B is no query type)


def test_end_of_stream_checks_what_is_pending_then_ends_every_monitor() -> None:
    eng = engine(k_slack_us=None)
    assert feed(eng, [ev("A", 1), ev("B", 4)]) == [[], []]
    assert [brief(o) for o in eng.end_of_stream()] == [("monitor_terminated", ["b4"], None, 2, "unsatisfiable")]
    monitor = eng.monitor
    assert monitor is not None and not monitor.traces and not monitor.pending and eng.is_idle()


def test_trace_records_are_forgotten_once_no_event_can_share_a_window_with_them() -> None:
    query = "EVENT SEQ(A a, K k1, K k2, C c) WHERE [id] WITHIN 10"
    eng = engine(query, allowed_lateness_us=5)
    for i in range(200):  # 200 traces, each terminated at its B, spread over time
        base = 20 * i
        eng.on_event(ev("A", base, id=i))
        eng.on_event(ev("B", base + 1, id=i))
        assert eng.stats()["traces"] <= 2  # W + A = 15 < 20 between traces
    assert eng.stats()["monitors_terminated"] == 200
    # A forgotten key is processed plainly (its checker state is gone): id 0 again, long after.
    assert feed(eng, [ev("A", 10_000, id=0), ev("K", 10_001, id=0)]) == [[], []]
    ais = eng.partition(0)
    assert ais is not None and len(ais) == 3  # a, and k at both K positions
    stats = eng.stats()
    assert (stats["traces_forgotten"], stats["traces_resumed_unchecked"], stats["constraint_checked"]) == (
        200, 1, 400)


def test_a_forgotten_trace_that_comes_back_is_not_checked_from_the_start() -> None:
    # Reviewer case B2: a2 (trace 2) moves L past trace 1's a0 by more than W + A, so trace 1's record is
    # forgotten.  Its x100 b101 continue A X B (allowed); checked from the start, x100 would look like the X C
    # branch (unsatisfiable) and the match would be lost.
    query = "EVENT SEQ(X x, B b) WHERE [id] WITHIN 10"
    stream = [ev("A", 0, id=1), ev("A", 50, id=2), ev("X", 100, id=1), ev("B", 101, id=1)]
    outs = {}
    for constraint in ("A X B | X C", None):
        eng = engine(query, constraint, allowed_lateness_us=0)
        outs[constraint] = [*feed(eng, stream), [brief(o) for o in eng.end_of_stream()]]
    assert outs["A X B | X C"] == outs[None] == [[], [], [], [("match", ["x100", "b101"])], []]
    eng = engine(query, "A X B | X C", allowed_lateness_us=0)
    feed(eng, stream)
    stats = eng.stats()
    assert {k: stats[k] for k in ("traces_forgotten", "traces_resumed_unchecked", "constraint_checked",
                                  "monitors_terminated", "constraint_violations", "traces")} == {
        "traces_forgotten": 2, "traces_resumed_unchecked": 1, "constraint_checked": 2, "monitors_terminated": 0,
        "constraint_violations": 0, "traces": 1}
    monitor = eng.monitor
    assert monitor is not None and not eng.is_idle()  # a fresh engine would check trace 1 from the start


def test_the_filter_of_forgotten_keys_survives_a_snapshot_and_knows_equal_keys() -> None:
    query = "EVENT SEQ(X x, B b) WHERE [id] WITHIN 10"
    eng = engine(query, "A X B | X C", allowed_lateness_us=0)
    feed(eng, [ev("A", 0, id=1), ev("A", 1, id="k"), ev("A", 2, id=(3, "z")), ev("A", 50, id=2)])
    config = eng.config
    restored = SequenceEngine.restore(parse_query(query), config, eng.snapshot())
    monitor = restored.monitor
    assert monitor is not None and monitor.counters.traces_forgotten == 3
    # 1.0 and True are the dict key 1; the str key would hash differently in another process without _canonical.
    assert all(key in monitor.forgotten for key in (1, 1.0, True, "k", (3, "z")))
    assert feed(restored, [ev("X", 100, id=1.0), ev("B", 101, id=1)]) == [[], [("match", ["x100", "b101"])]]


def test_a_false_positive_of_the_filter_only_makes_a_new_key_unchecked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(monitor_module, "FORGOTTEN_FILTER_BITS", 8)  # one byte: soon every key is "known"
    query = "EVENT SEQ(X x, B b) WHERE [id] WITHIN 10"
    eng = engine(query, "A X B | X C", allowed_lateness_us=0)
    feed(eng, [ev("A", 20 * i, id=i) for i in range(20)])
    monitor = eng.monitor
    assert monitor is not None and all(i in monitor.forgotten for i in range(1000, 1010))
    resumed = eng.stats()["traces_resumed_unchecked"]
    # Key 1000 is new; X C under the constraint would be unsatisfiable, but unchecked it is simply processed.
    assert feed(eng, [ev("X", 1000, id=1000), ev("C", 1001, id=1000)]) == [[], []]
    assert eng.stats()["monitors_terminated"] == 0 and eng.stats()["traces_resumed_unchecked"] == resumed + 1
    fresh = engine(query, "A X B | X C", allowed_lateness_us=0)
    assert feed(fresh, [ev("X", 1000, id=1000)]) == [[("monitor_terminated", ["x1000"], 1000, 1, "unsatisfiable")]]


@pytest.mark.parametrize("cut", range(0, 12))
def test_snapshot_and_restore_mid_trace_give_identical_outputs(cut: int) -> None:
    query = "EVENT SEQ(A a, K k1, K k2, C c) WHERE [id] WITHIN 1000"
    config = EngineConfig(k_slack_us=2, constraint=C1, early_alerts=True)
    h1 = [ev(t, 10 * ts, id=1) for t, ts in H1]
    h2 = [ev(t, 10 * ts + 1, id=2) for t, ts in H2]
    stream = sorted([*h1, *h2], key=lambda e: e.ts)
    stream[3], stream[4] = stream[4], stream[3]  # one out-of-order arrival
    q = parse_query(query)
    whole = SequenceEngine(q, config)
    expected = [o.to_dict() for e in stream for o in whole.on_event(e)] + [o.to_dict() for o in whole.end_of_stream()]
    first = SequenceEngine(q, config)
    got = [o.to_dict() for e in stream[:cut] for o in first.on_event(e)]
    second = SequenceEngine.restore(q, config, first.snapshot())
    got += [o.to_dict() for e in stream[cut:] for o in second.on_event(e)] + [
        o.to_dict() for o in second.end_of_stream()]
    assert got == expected
    assert [o["kind"] for o in expected] == ["early_alert", "monitor_terminated", "match"]
    assert second.stats() == whole.stats()


def test_a_snapshot_needs_the_same_constraint_configuration() -> None:
    q = parse_query(Q2)
    blob = SequenceEngine(q, EngineConfig(k_slack_us=0, constraint=C1)).snapshot()
    with pytest.raises(SaseError, match="different constraint"):
        SequenceEngine.restore(q, EngineConfig(k_slack_us=0), blob)
    with pytest.raises(SaseError, match="different constraint"):
        SequenceEngine.restore(q, EngineConfig(k_slack_us=0, constraint=C1, constraint_checker="basic"), blob)
    plain = SequenceEngine(q, EngineConfig(k_slack_us=0)).snapshot()
    with pytest.raises(SaseError, match="different constraint"):
        SequenceEngine.restore(q, EngineConfig(k_slack_us=0, constraint=C1), plain)


# ------------------------------------------------------------------------------------------ properties

# (constraint, query, word drawer): complete words of L(C), one trace per id.
C6 = "P A B | Q B | Q A B"  # Ex. 3.6 reconstructed (../shared/notes/intervals-and-constraints.md 2.4)


@st.composite
def c1_word(draw: st.DrawFn) -> list[str]:
    a, k, b, c = (draw(st.integers(lo, 3)) for lo in (1, 0, 1, 1))
    return ["A"] * a + ["K"] * k + ["B"] * b + ["K"] + ["C"] * c


@st.composite
def c6_word(draw: st.DrawFn) -> list[str]:
    return list(draw(st.sampled_from(["PAB", "QB", "QAB"])))


CASES = [
    (C1, "EVENT SEQ(A a, K k1, K k2, C c) WHERE [id] WITHIN 1000000", c1_word),
    (C1, "EVENT SEQ(A a, B b, C c) WHERE [id] WITHIN 1000000", c1_word),
    (C1, "EVENT SEQ(K k, K j, K i) WHERE [id] WITHIN 1000000", c1_word),
    (C1, "EVENT SEQ(A a, !(B b), K k) WHERE [id] WITHIN 1000000", c1_word),
    (C6, "EVENT SEQ(A a, B b) WHERE [id] WITHIN 1000000", c6_word),
    (C6, "EVENT SEQ(Q q, B b) WHERE [id] WITHIN 1000000", c6_word),
]


@st.composite
def workloads(draw: st.DrawFn) -> tuple[int, list[SaseEvent], int, str, list[bool]]:
    case = draw(st.integers(0, len(CASES) - 1))
    word = CASES[case][2]
    n_traces = draw(st.integers(1, 4))
    traces = [draw(word()) for _ in range(n_traces)]
    cut = [draw(st.booleans()) for _ in range(n_traces)]  # some traces end early (a consistent prefix)
    traces = [t[: draw(st.integers(1, len(t)))] if c else t for t, c in zip(traces, cut, strict=True)]
    # Interleave the traces; timestamps strictly increase over the whole stream.
    cursors = [0] * n_traces
    order = []
    while any(cursors[i] < len(traces[i]) for i in range(n_traces)):
        live = [i for i in range(n_traces) if cursors[i] < len(traces[i])]
        i = draw(st.sampled_from(live))
        order.append((i, traces[i][cursors[i]]))
        cursors[i] += 1
    events = [SaseEvent(t, 10 * n, {"id": i}, f"{t}{10 * n}") for n, (i, t) in enumerate(order)]
    k = draw(st.integers(0, 40))
    arrivals = sorted(((e.ts + draw(st.integers(0, k)), n, e) for n, e in enumerate(events)),
                      key=lambda x: (x[0], x[1]))
    complete = [not c for c in cut]
    return case, [e for _, _, e in arrivals], k, draw(st.sampled_from(["basic", "lightweight"])), complete


def by_trace(outputs: list[SaseOutput], kinds: set[str]) -> dict[Hashable, list[tuple[Any, ...]]]:
    out: dict[Hashable, list[tuple[Any, ...]]] = defaultdict(list)
    for o in outputs:
        if o.kind in kinds:
            trace = o.trace if isinstance(o, VerdictOutput) else o.events[0].attrs["id"]
            out[trace].append(tuple(e.event_id for e in o.events))
    return dict(out)


@given(workloads(), st.integers(0, 40))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_verdicts_never_contradict_the_constraint_free_run(workload: Any, cut: int) -> None:
    case, arrivals, k, checker, complete = workload
    constraint, text, _ = CASES[case]
    query = parse_query(text)
    plain = SequenceEngine(query, EngineConfig(k_slack_us=k))
    watched = SequenceEngine(query, EngineConfig(k_slack_us=k, constraint=constraint, constraint_checker=checker,
                                                 early_alerts=True))
    plain_out = [o for e in arrivals for o in plain.on_event(e)] + plain.end_of_stream()
    watched_out: list[SaseOutput] = []
    gone: set[Hashable] = set()
    for n, e in enumerate(arrivals):
        if n == cut:  # a snapshot and restore mid-stream changes nothing
            watched = SequenceEngine.restore(query, watched.config, watched.snapshot())
        outs = watched.on_event(e)
        gone |= {o.trace for o in outs if isinstance(o, VerdictOutput) and o.kind == "monitor_terminated"}
        # A terminated trace's state is released at once, except events the checker has not reached (above L: a
        # violation before them would make them part of the plain trace, issue 25.2).
        low = watched.low_watermark
        for trace in gone:
            ais = watched.partition(trace)
            oldest = None if ais is None else ais.oldest_ts()
            assert oldest is None or low is None or oldest > low
        watched_out += outs
    watched_out += watched.end_of_stream()
    plain_matches = by_trace(plain_out, {"match"})
    matches = by_trace(watched_out, {"match"})
    terminated = by_trace(watched_out, {"monitor_terminated"})
    alerted = by_trace(watched_out, {"early_alert"})
    assert watched.stats()["constraint_violations"] == 0
    for trace in {e.attrs["id"] for e in arrivals}:
        assert len(terminated.get(trace, [])) + len(alerted.get(trace, [])) <= 1
        if trace in terminated:
            assert trace not in plain_matches and trace not in matches
        else:
            assert sorted(matches.get(trace, [])) == sorted(plain_matches.get(trace, []))
        if trace in alerted and complete[trace]:
            assert plain_matches[trace]
    assert watched.stats()["instances"] == 0 and watched.is_idle()


@given(st.lists(st.tuples(st.sampled_from("AKBCX"), st.integers(0, 2)), max_size=25), st.integers(0, 5))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_traces_never_terminated_keep_every_match_even_when_the_input_breaks_the_constraint(
        items: list[tuple[str, int]], k: int) -> None:
    query = parse_query("EVENT SEQ(A a, K k1, C c) WHERE [id] WITHIN 50")
    events = [SaseEvent(t, n, {"id": i}, f"{t}{n}") for n, (t, i) in enumerate(items)]
    plain = SequenceEngine(query, EngineConfig(k_slack_us=k))
    watched = SequenceEngine(query, EngineConfig(k_slack_us=k, constraint=C1))
    plain_out = [o for e in events for o in plain.on_event(e)] + plain.end_of_stream()
    watched_out = [o for e in events for o in watched.on_event(e)] + watched.end_of_stream()
    plain_matches = by_trace(plain_out, {"match"})
    matches = by_trace(watched_out, {"match"})
    terminated = by_trace(watched_out, {"monitor_terminated"})
    for trace in {e.attrs["id"] for e in events}:
        if trace not in terminated:
            assert sorted(matches.get(trace, [])) == sorted(plain_matches.get(trace, []))
        else:
            assert set(matches.get(trace, [])) <= set(plain_matches.get(trace, []))


# Keys that come back after gaps longer than W + A (their records are forgotten), traces drawn from the constraint
# that may break it (a letter replaced or inserted); in order, W = 10.
GAP_CASES = [
    ("A X B | X C", "EVENT SEQ(X x, B b) WHERE [id] WITHIN 10", "AXBC", st.sampled_from(["AXB", "XC"]).map(list)),
    (C1, "EVENT SEQ(A a, K k1, C c) WHERE [id] WITHIN 10", "AKBC", c1_word()),
    ("A B", "EVENT SEQ(A a, C c) WHERE [id] WITHIN 10", "ABC", st.just(["A", "B"])),  # statically unsatisfiable
    (C6, "EVENT SEQ(Q q, B b) WHERE [id] WITHIN 10", "PQAB", c6_word()),
]


@given(st.integers(0, len(GAP_CASES) - 1), st.data(), st.integers(0, 3), st.integers(0, 2),
       st.sampled_from(["basic", "lightweight"]))
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_keys_that_come_back_after_long_gaps_never_lose_a_match_of_a_trace_that_follows_the_constraint(
        case: int, data: st.DataObject, lateness: int, k: int, checker: Literal["basic", "lightweight"]) -> None:
    constraint, text, letters, words = GAP_CASES[case]
    query = parse_query(text)
    traces = []
    for _ in range(data.draw(st.integers(2, 3))):  # another key moves L while one is away
        # A word of the constraint (a copy: st.just hands out one list), or any word of its letters.
        word = list(data.draw(st.one_of(words, st.lists(st.sampled_from(letters), min_size=1, max_size=6))))
        for _ in range(data.draw(st.sampled_from([0, 0, 1, 2]))):  # break it: replace or insert a letter
            at, letter = data.draw(st.integers(0, len(word))), data.draw(st.sampled_from(letters))
            word[at:at + data.draw(st.integers(0, 1))] = [letter]
        traces.append(word[: data.draw(st.integers(1, len(word)))] if data.draw(st.booleans()) else word)
    events, ts = [], 0
    cursors = [0] * len(traces)
    while live := [i for i in range(len(traces)) if cursors[i] < len(traces[i])]:
        key = data.draw(st.sampled_from(live))
        ts += data.draw(st.sampled_from([1, 2, 30]))  # a gap of 30 > W + A forgets every record
        etype = traces[key][cursors[key]]
        cursors[key] += 1
        events.append(SaseEvent(etype, ts, {"id": key}, f"{etype}{ts}"))
    plain = SequenceEngine(query, EngineConfig(k_slack_us=k, allowed_lateness_us=lateness))
    watched = SequenceEngine(query, EngineConfig(k_slack_us=k, allowed_lateness_us=lateness, constraint=constraint,
                                                 constraint_checker=checker))
    plain_out = [o for e in events for o in plain.on_event(e)] + plain.end_of_stream()
    watched_out = [o for e in events for o in watched.on_event(e)] + watched.end_of_stream()
    plain_matches = by_trace(plain_out, {"match"})
    matches = by_trace(watched_out, {"match"})
    terminated = by_trace(watched_out, {"monitor_terminated"})
    tau_c = ConstraintChecker(constraint, query).tau_c
    automaton = ConstraintChecker(constraint, query)
    for key in {e.attrs["id"] for e in events}:
        got, want = sorted(matches.get(key, [])), sorted(plain_matches.get(key, []))
        assert set(got) <= set(want)  # never an extra match
        trace = [e for e in events if e.attrs["id"] == key]
        symbols = automaton.word([e.event_type for e in trace])
        if tau_c.run(symbols) >= 0:  # the trace follows the constraint: nothing lost
            assert got == want
            continue
        # It breaks the constraint at event v: a match can be lost only after a termination (its own or the
        # static one) and only if it has an event before v is checked (ignored or released); v is checked when L
        # passes it (K after it), and from then on the trace is plain.
        v = next(n for n in range(len(symbols)) if tau_c.run(symbols[: n + 1]) < 0)
        plain_from = trace[v].ts + k
        ts_of = {e.event_id: e.ts for e in trace}
        assert {m for m in want if min(ts_of[i] for i in m) >= plain_from} <= set(got)
        if got != want:
            assert key in terminated or None in terminated
    assert watched.stats()["instances"] == 0


# ------------------------------------------------------------------------------------------ the Spark job's core


def test_the_sequence_job_core_writes_verdict_records() -> None:
    import orjson

    from spark_jobs.sequence import SequenceOptions, SequenceStreamCore, constraint_problem, engine_config

    def row(seq: int, ts: int, etype: str, item: int) -> dict[str, Any]:
        return {"kind": "event", "stream": "st", "source_id": "r", "seq": seq, "ref_ts_us": ts, "uncertainty_us": 0,
                "payload": orjson.dumps({"type": etype, "id": item}).decode(), "topic": "t", "partition": 0,
                "offset": seq}

    text = "EVENT SEQ(A a, K k1, K k2, C c) WHERE [id] WITHIN 1 s"
    options = SequenceOptions("unused:9092", text, constraint=C1, early_alerts=True)
    core = SequenceStreamCore("st", parse_query(text), engine_config(options), "type", None)
    rows = [row(n, ts, t, 1) for n, (t, ts) in enumerate(H1)] + [row(10 + n, ts, t, 2) for n, (t, ts) in enumerate(H2)]
    # No promise yet: nothing is checked, every event is processed (the match is emitted when its C comes).
    first = core.on_rows(sorted(rows, key=lambda r: (r["ref_ts_us"], r["seq"])))
    assert [(k, v["record"]) for k, v in first] == [("st|1|r:0|r:1|r:4|r:5", "match")]
    assert core.engine.counters.instances == 6 + 4
    # The watermark makes every event up to 5 final: trace 1 is certain at k2, trace 2 unsatisfiable at b4.
    out = core.on_watermark(5)
    assert [(k, v["record"], v["partition"], v["position"], v["reason"], [e["event_id"] for e in v["events"]])
            for k, v in out] == [
        ("st|1|early_alert|r:1", "early_alert", "1", 2, "satisfiable", ["r:1"]),
        ("st|2|monitor_terminated|r:11", "monitor_terminated", "2", 2, "unsatisfiable", ["r:11"]),
    ]
    assert out[0][1]["job"] == "sequence" and out[0][1]["trace"] == 1 and out[0][1]["emitted_at"] == 9
    # Trace 2 released up to b4; k8 and c9 (above the watermark: a violation could still come before them, issue
    # 25.2) wait, their matches suspended.
    trace2 = core.engine.partition(2)
    assert trace2 is not None and trace2.oldest_ts() == 8 and core.engine.counters.instances == 6 + 3
    later = [row(20, 20, "C", 2), row(21, 21, "C", 2)]
    assert core.on_rows(later) == []
    # Followed without a violation through 21 (C+ ends the workflow): everything of trace 2 goes, nothing came out.
    assert core.on_watermark(100) == [] and core.engine.partition(2) is None
    assert core.engine.stats()["constraint_resumed"] == 0
    assert constraint_problem(parse_query(text), "A+ (K", "lightweight", False) is not None
    assert constraint_problem(parse_query(text), C1, "basic", True) is None


WINDOWED = [
    "EVENT SEQ(A a, K k1, K k2, C c) WHERE [id] WITHIN {w}",
    "EVENT SEQ(!(B b), K k, C c) WHERE [id] WITHIN {w}",
    "EVENT SEQ(A a, K k, !(B b)) WHERE [id] WITHIN {w}",
    "EVENT SEQ(A a, !(K k), B b, C c) WHERE [id] WITHIN {w}",
    "EVENT SEQ(K k, K j, K i, K h) WHERE [id] WITHIN {w}",
]


@given(workloads(), st.sampled_from(WINDOWED), st.integers(5, 120))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_under_a_window_unsatisfiable_never_drops_a_match(workload: Any, text: str, window: int) -> None:
    """Without early alerts the window counts (edge negations bounded by W): a terminated trace has no windowed
    match, every other trace keeps exactly its matches, and no early alert is ever output."""
    case, arrivals, k, checker, _ = workload
    if CASES[case][0] != C1:
        return
    query = parse_query(text.format(w=window))
    plain = SequenceEngine(query, EngineConfig(k_slack_us=k))
    watched = SequenceEngine(query, EngineConfig(k_slack_us=k, constraint=C1, constraint_checker=checker))
    plain_out = [o for e in arrivals for o in plain.on_event(e)] + plain.end_of_stream()
    watched_out = [o for e in arrivals for o in watched.on_event(e)] + watched.end_of_stream()
    plain_matches = by_trace(plain_out, {"match"})
    matches = by_trace(watched_out, {"match"})
    terminated = by_trace(watched_out, {"monitor_terminated"})
    assert not by_trace(watched_out, {"early_alert"})
    for trace in {e.attrs["id"] for e in arrivals}:
        if trace in terminated:
            assert trace not in plain_matches and trace not in matches
        else:
            assert sorted(matches.get(trace, [])) == sorted(plain_matches.get(trace, []))


@pytest.mark.parametrize(("args", "message"), [
    (["--early-alerts"], "Invalid value for '--early-alerts': needs --constraint"),
    (["--constraint", "A+ (K"], "Invalid value for '--constraint'"),
])
def test_the_sequence_cli_refuses_a_bad_constraint_setup_before_spark_starts(
        args: list[str], message: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from spark_jobs import cli

    def no_spark(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("a Spark session was started")

    monkeypatch.setattr(cli, "create_spark_session", no_spark)
    result = CliRunner().invoke(cli.spark_app, ["sequence", "--query",
                                                "EVENT SEQ(A a, K k, C c) WHERE [id] WITHIN 1 hour", *args])
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())
