"""The note's worked examples (intervals-and-constraints.md 1.8) as exact tests: Li 2010 Examples 5.4/5.5, the
relation cases, IO3's real-time +/- outputs with the corrected endpoint, K-ISlack purge, interval abstraction."""

from __future__ import annotations

import json

import pytest

from cep.intervals import (
    Interval,
    IntervalBegin,
    IntervalEngine,
    IntervalEngineConfig,
    IntervalError,
    IntervalOutput,
    allen_relations,
    holds,
    parse_iseq,
    reference_keys,
)
from cep.intervals.engine import IndexingProfile
from cep.intervals.events import Item
from cep.intervals.pairing import EndpointPairer
from cep.intervals.points import PointToIntervalOperator
from cep.intervals.query import Constraint
from cep.intervals.relations import OPEN_RELATION_STARTS_BEFORE, EndpointRef, phl_counts


def iv(name: str) -> Interval:
    """``"b3|6"`` -> Interval("B", 3, 6, id "b3")."""
    head, te = name.split("|")
    return Interval(head[0].upper(), int(head[1:]), int(te), event_id=head)


def names(out: list[IntervalOutput]) -> list[tuple[str, list[str]]]:
    return [(o.kind, [str(m) for m in o.members]) for o in out]


def ids(engine: IntervalEngine) -> dict[str, list[str]]:
    return {a: [uid for uid, _ts, _te in entries] for a, entries in engine.buffer_contents().items()}


# -- T1: Li Example 5.4, basic ISEQ -----------------------------------------------------------------------------
EX54 = "EVENT ISEQ[A^- < B^+ < C^+ < D^+](A, B, C, D; 30)"
EX54_STREAM = ["b3|6", "d6|10", "b9|11", "c4|12", "a7|14", "d9|15", "a8|16", "e20|35"]
EX54_RESULTS = [["a7|14", "b9|11", "c4|12", "d9|15"], ["a8|16", "b9|11", "c4|12", "d9|15"]]


def test_example_5_4_query_is_a_ts_before_b_te_before_c_te_before_d_te() -> None:
    q = parse_iseq(EX54)
    assert [str(c) for c in q.constraints] == ["A.ts < B.te", "B.te < C.te", "C.te < D.te"]
    assert q.window_us == 30


@pytest.mark.parametrize("indexing", ["naive", "ais"])
def test_example_5_4_two_results_at_d9_and_a8(indexing: IndexingProfile) -> None:
    engine = IntervalEngine(parse_iseq(EX54), IntervalEngineConfig(indexing=indexing))
    per_item = {name: names(engine.on_item(iv(name))) for name in EX54_STREAM}
    assert per_item["d9|15"] == [("match", EX54_RESULTS[0])]
    assert per_item["a8|16"] == [("match", EX54_RESULTS[1])]
    assert sum(len(v) for v in per_item.values()) == 2


def test_example_5_4_basic_indexing_steps() -> None:
    engine = IntervalEngine(parse_iseq(EX54), IntervalEngineConfig(indexing="ais"))
    assert [ep.endpoint for ep in engine.indexed_path] == ["te", "te", "te"]
    engine.on_item(iv("b3|6"))
    assert ids(engine)["B"] == ["b3"]  # B's only restriction is on A.ts: no te > te drop
    engine.on_item(iv("d6|10"))
    assert ids(engine)["D"] == []  # dropped on the fly: D.te > C.te and no C buffered
    assert engine.counters.dropped_on_arrival == 1
    for name in ("b9|11", "c4|12", "a7|14"):
        assert engine.on_item(iv(name)) == []
    assert ids(engine) == {"A": ["a7"], "B": ["b3", "b9"], "C": ["c4"], "D": []}


def test_example_5_4_purge_at_e20_removes_b3_and_c4() -> None:
    engine = IntervalEngine(parse_iseq(EX54), IntervalEngineConfig(indexing="naive"))
    for name in EX54_STREAM[:-1]:
        engine.on_item(iv(name))
    assert "b3" in ids(engine)["B"] and "c4" in ids(engine)["C"]
    engine.on_item(iv("e20|35"))  # not a query type, but it moves CLOCK to 35: 3 + 30 < 35, 4 + 30 < 35
    after = ids(engine)
    assert "b3" not in after["B"] and after["C"] == []
    assert after["A"] == ["a7", "a8"] and after["B"] == ["b9"] and "d9" in after["D"]


def test_example_5_4_derived_cascading_purge_of_d9() -> None:
    """DER: with C empty, D (which needs a C ending before it) has no possible partner left."""
    engine = IntervalEngine(parse_iseq(EX54), IntervalEngineConfig(indexing="ais"))
    for name in EX54_STREAM:
        engine.on_item(iv(name))
    assert ids(engine) == {"A": ["a7", "a8"], "B": ["b9"], "C": [], "D": []}
    assert engine.counters.cascade_purged == 1


def test_example_5_4_reference_agrees() -> None:
    keys = reference_keys(parse_iseq(EX54), [iv(n) for n in EX54_STREAM])
    assert [[f"{t.lower()}{s}|{e}" for t, s, e, _ in k] for k in keys] == EX54_RESULTS


# -- T2: Li Example 5.5, interval begin punctuation -----------------------------------------------------------
def ex55_stream() -> list[Item]:
    # IBPs only for A (the only start endpoint on the indexed path), merged by time (IBP at ts, interval at te).
    return [iv("b3|6"), IntervalBegin("A", 7, "a7"), IntervalBegin("A", 8, "a8"), iv("d6|10"), iv("b9|11"),
            iv("c4|12"), iv("a7|14"), iv("d9|15"), iv("a8|16"), iv("e20|35")]


def test_example_5_5_ibp_drops_b3_on_arrival_and_keeps_b9() -> None:
    engine = IntervalEngine(parse_iseq(EX54), IntervalEngineConfig(indexing="ibp", punctuated_types=frozenset("A")))
    assert [str(ep) for ep in engine.indexed_path] == ["A.ts", "B.te", "C.te", "D.te"]
    stream = ex55_stream()
    engine.on_item(stream[0])
    assert ids(engine)["B"] == []  # b3|6: no A IBP seen and B.te > A.ts is required
    engine.on_item(stream[1])
    engine.on_item(stream[2])
    assert engine.buffer_contents()["A"] == [("a7", 7, None), ("a8", 8, None)]  # unfilled IBP entries
    engine.on_item(stream[3])
    engine.on_item(stream[4])
    assert ids(engine)["B"] == ["b9"] and ids(engine)["D"] == []
    assert engine.counters.dropped_on_arrival == 2


def test_example_5_5_same_two_results_dfs_skips_the_unfilled_a8() -> None:
    engine = IntervalEngine(parse_iseq(EX54), IntervalEngineConfig(indexing="ibp", punctuated_types=frozenset("A")))
    per_item = [names(engine.on_item(item)) for item in ex55_stream()]
    assert per_item[7] == [("match", EX54_RESULTS[0])]  # d9|15: a8 only has its IBP, skipped
    assert per_item[8] == [("match", EX54_RESULTS[1])]  # a8|16 fills its entry and triggers
    assert sum(map(len, per_item)) == 2


# -- T3: Allen relations and TList ---------------------------------------------------------------------------
@pytest.mark.parametrize(("x", "y", "relation"), [
    ((1, 3), (5, 7), "before"),
    ((1, 5), (3, 7), "overlaps"),  # Table 5.1's printed "before" (x.ts < y.ts) would wrongly say before
    ((3, 7), (7, 9), "meets"),
    ((2, 9), (4, 6), "contains"),
    ((4, 9), (4, 6), "started-by"),
    ((5, 7), (1, 3), "after"),
    ((4, 6), (4, 9), "starts"),
    ((4, 6), (2, 9), "during"),
    ((6, 9), (4, 9), "finishes"),
    ((4, 9), (6, 9), "finished-by"),
    ((4, 9), (4, 9), "equal"),
    ((7, 9), (3, 7), "met-by"),
    ((3, 7), (1, 5), "overlapped-by"),
])
def test_allen_relation_cases(x: tuple[int, int], y: tuple[int, int], relation: str) -> None:
    assert allen_relations(x, y) == {relation}


def test_before_is_allen_before_not_starts_before() -> None:
    assert not holds("before", (1, 5), (3, 7))
    assert holds("before", (1, 3), (4, 7)) and not holds("before", (1, 4), (4, 7))


def test_point_events_can_have_several_labels() -> None:
    assert allen_relations((5, 5), (5, 8)) == {"meets", "starts"}


def test_open_relation_ts_before_ts_is_five_allen_relations() -> None:
    cases = [((a, b), (c, d)) for a in range(4) for b in range(a + 1, 5) for c in range(4) for d in range(c + 1, 5)]
    for x, y in cases:
        assert (x[0] < y[0]) == bool(allen_relations(x, y) & OPEN_RELATION_STARTS_BEFORE)


def test_example_5_3_tlist() -> None:
    q = parse_iseq("EVENT ISEQ[A overlaps B AND B overlaps C](A, B, C; 100)")
    assert [str(c) for c in q.constraints] == [
        "A.ts < B.ts", "B.ts < A.te", "A.te < B.te", "B.ts < C.ts", "C.ts < B.te", "B.te < C.te"]
    a, b = Interval("A", 1, 5, event_id="a"), Interval("B", 3, 8, event_id="b")
    assert len(reference_keys(q, [a, b, Interval("C", 6, 10, event_id="c")])) == 1
    assert reference_keys(q, [a, b, Interval("C", 2, 10, event_id="c")]) == []  # fails B.ts < C.ts
    assert reference_keys(q, [a, b, Interval("C", 9, 12, event_id="c")]) == []  # fails C.ts < B.te


def test_contradictory_tlist_is_rejected_and_inference_is_transitive() -> None:
    with pytest.raises(IntervalError):
        parse_iseq("EVENT ISEQ[A.te < B.ts AND B.te < A.ts](A, B; 10)")
    q = parse_iseq("EVENT ISEQ[A.te < B.ts AND B.te <= C.ts](A, B, C; 10)")
    assert q.closure.relation(EndpointRef("A", "ts"), EndpointRef("C", "te")) == "<"
    assert q.closure.relation(EndpointRef("B", "ts"), EndpointRef("C", "ts")) == "<="


def test_tlist_syntax_mirrors_and_chains() -> None:
    q = parse_iseq("EVENT ISEQ[b.te > a.ts AND a.te >= c.te AND c.ts = b.ts](A a, B b, C c; 5 ms)")
    assert q.constraints == (
        Constraint(EndpointRef("a", "ts"), "<", EndpointRef("b", "te")),
        Constraint(EndpointRef("c", "te"), "<=", EndpointRef("a", "te")),
        Constraint(EndpointRef("c", "ts"), "=", EndpointRef("b", "ts")))
    assert q.window_us == 5000


@pytest.mark.parametrize(("intervals", "expected"), [
    ([(1, 3), (2, 5), (4, 6)], [0, 0, 0, 1, 0]),  # A.s < B.s < A.e < C.s < B.e < C.e
    ([(1, 4), (2, 5), (3, 6)], [0, 0, 0, 2, 0]),  # A.s < B.s < C.s < A.e < B.e < C.e
    ([(1, 3), (2, 5), (3, 6)], [0, 0, 1, 1, 0]),  # A.s < B.s < A.e = C.s < B.e < C.e
])
def test_io3_count_vectors(intervals: list[tuple[int, int]], expected: list[int]) -> None:
    a, b, c = intervals
    assert phl_counts([a], b) == [0, 0, 0, 1, 0]
    assert phl_counts([a, b], c) == expected


# -- T4: IO3 section 4.1, real-time mode ------------------------------------------------------------------------
IO3_QUERY = ("EVENT ISEQ[a overlaps b AND b.te < c.ts AND d.ts < c.ts AND b.te < d.te]"
             "(A a, B b, !D d, C c; 10)")


def io3_engine(mode: str) -> tuple[IntervalEngine, EndpointPairer]:
    config = IntervalEngineConfig(k_slack_us=10, mode=mode, punctuated_types=frozenset("D"))  # type: ignore[arg-type]
    return IntervalEngine(parse_iseq(IO3_QUERY), config), EndpointPairer()


def endpoints(engine: IntervalEngine, pairer: EndpointPairer, script: str) -> list[tuple[str, list[str]]]:
    """``"OS_a(3) OE_a(7)"``: feed IO3 endpoints (the event id is the type letter plus the start time group)."""
    out: list[IntervalOutput] = []
    for token in script.split():
        kind, rest = token.split("_")
        letter, t = rest[0], int(rest[2:-1])
        event_id = f"{letter}{token_group(token)}"
        items = (pairer.start(letter.upper(), event_id, t) if kind == "OS"
                 else pairer.end(letter.upper(), event_id, t))
        for item in items:
            out += engine.on_item(item)
    return names(out)


def token_group(token: str) -> int:
    return 1 if int(token.split("(")[1][:-1]) < 13 else 2


def test_io3_late_positive_endpoint_emits_plus() -> None:
    engine, pairer = io3_engine("aggressive")
    assert endpoints(engine, pairer, "OS_a(3) OE_a(7) OE_b(9) OS_c(11) OE_c(12)") == []
    assert endpoints(engine, pairer, "OS_b(6)") == [("add", ["a3|7", "b6|9", "c11|12"])]


def test_io3_late_negative_endpoint_retracts_with_os_d_not_os_a() -> None:
    engine, pairer = io3_engine("aggressive")
    endpoints(engine, pairer, "OS_a(3) OE_a(7) OE_b(9) OS_c(11) OE_c(12) OS_b(6)")
    assert endpoints(engine, pairer, "OS_a(13) OS_b(16) OE_a(17) OE_b(20) OS_c(22) OE_c(22)") == [
        ("match", ["a13|17", "b16|20", "c22|22"])]
    # The printed OS_a(15) is OS_d(15): a D still open at 20 lies in the gap (OE_b, OS_c) = (20, 22).
    assert endpoints(engine, pairer, "OS_d(15)") == [("retract", ["a13|17", "b16|20", "c22|22"])]
    # DEC beyond IO3: D ends at 18, before the gap: the result is valid again.
    assert endpoints(engine, pairer, "OE_d(18)") == [("add", ["a13|17", "b16|20", "c22|22"])]


def test_io3_negative_that_stays_in_the_gap_stays_retracted() -> None:
    engine, pairer = io3_engine("aggressive")
    endpoints(engine, pairer, "OS_a(13) OS_b(16) OE_a(17) OE_b(20) OS_c(22) OE_c(22) OS_d(15)")
    assert endpoints(engine, pairer, "OE_d(21)") == []
    assert engine.finish() == []


def test_io3_conservative_mode_emits_only_permanently_valid_results() -> None:
    engine, pairer = io3_engine("conservative")
    script = ("OS_a(3) OE_a(7) OE_b(9) OS_c(11) OE_c(12) OS_b(6) "
              "OS_a(13) OS_b(16) OE_a(17) OE_b(20) OS_c(22) OE_c(22) OS_d(15) OE_d(18)")
    per_token = {token: endpoints(engine, pairer, token) for token in script.split()}
    # Result 1 is held until no D can still begin before c starts at 11: CLOCK - K = 22 - 10 = 12 > 11.
    assert {t: o for t, o in per_token.items() if o} == {"OS_c(22)": [("match", ["a3|7", "b6|9", "c11|12"])]}
    assert names(engine.advance_clock(31)) == []  # 31 - 10 = 21: a D beginning at 21 < c.ts can still come
    assert names(engine.advance_clock(32)) == [("match", ["a13|17", "b16|20", "c22|22"])]  # D at 18 missed the gap
    assert engine.pending_count == 0


# -- a negating interval purged while the result it negates is still pending (issue 16 review, B1) ----------------
NEG_NONSTRICT = "EVENT ISEQ[a.te <= d.te AND d.ts <= c.ts AND a.te < c.ts](A a, !D d, C c; 20)"
PROFILES: list[IndexingProfile] = ["naive", "ais", "ibp"]


def begin(name: str) -> IntervalBegin:
    """``"d8"`` -> the IBP of the D interval that starts at 8."""
    return IntervalBegin(name[0].upper(), int(name[1:]), name)


@pytest.mark.parametrize("mode", ["conservative", "aggressive"])
@pytest.mark.parametrize("indexing", PROFILES)
def test_purged_negating_interval_does_not_revive_the_result_it_negated(indexing: IndexingProfile,
                                                                         mode: str) -> None:
    """d4|4 negates <a0, c4>; the open d8 keeps the result pending (d8 starts before c.te = 9) until CLOCK 28,
    when the window purge drops d4 (4 + 20 + 0 < 28).  The result must stay dead, not be released at d8's end."""
    stream: list[Item] = [iv("a0|0"), begin("d4"), iv("d4|4"), begin("d8"), iv("c4|9"), iv("d8|28")]
    query = parse_iseq(NEG_NONSTRICT)
    assert reference_keys(query, [i for i in stream if isinstance(i, Interval)]) == []
    engine = IntervalEngine(query, IntervalEngineConfig(k_slack_us=0, mode=mode,  # type: ignore[arg-type]
                                                        indexing=indexing, punctuated_types=frozenset("D")))
    assert [names(engine.on_item(item)) for item in stream] == [[]] * len(stream)
    assert engine.finish() == []
    assert engine.counters.negated_results == 1 and engine.pending_count == 0


@pytest.mark.parametrize("indexing", PROFILES)
def test_late_negating_interval_retracts_once_and_its_purge_re_adds_nothing(indexing: IndexingProfile) -> None:
    """K = 10: <a0, c4> goes out at c4|9, the late d4 retracts it; d4 is purged at CLOCK 35 (4 + 20 + 10 < 35)
    while the open d8 still holds the result; d8|40 misses the gap (8 > c.ts): no re-add."""
    stream: list[Item] = [iv("a0|0"), iv("c4|9"), begin("d4"), iv("d4|4"), begin("d8"), iv("x35|35"), iv("d8|40")]
    query = parse_iseq(NEG_NONSTRICT)
    assert reference_keys(query, [i for i in stream if isinstance(i, Interval)]) == []
    expected = {"aggressive": [[], [("match", ["a0|0", "c4|9"])], [("retract", ["a0|0", "c4|9"])], [], [], [], []],
                "conservative": [[]] * len(stream)}
    for mode, per_item in expected.items():
        engine = IntervalEngine(query, IntervalEngineConfig(k_slack_us=10, mode=mode,  # type: ignore[arg-type]
                                                            indexing=indexing, punctuated_types=frozenset("D")))
        assert [names(engine.on_item(item)) for item in stream] == per_item, mode
        assert engine.finish() == []


@pytest.mark.parametrize("mode", ["conservative", "aggressive"])
@pytest.mark.parametrize("indexing", PROFILES)
def test_clock_jump_purges_the_negation_before_the_release_and_the_result_stays_dead(indexing: IndexingProfile,
                                                                                     mode: str) -> None:
    """No IBPs: with K = 10 <a0, c2> waits for CLOCK - K >= c.ts = 2; the next item jumps CLOCK to 100, whose
    window purge (1 + 20 + 10 < 100) drops d1 before the release check runs."""
    query = parse_iseq("EVENT ISEQ[a.te < d.ts AND d.te < c.ts AND a.te < c.ts](A a, !D d, C c; 20)")
    stream = [iv("a0|0"), iv("d1|1"), iv("c2|3")]
    assert reference_keys(query, stream) == []
    engine = IntervalEngine(query, IntervalEngineConfig(k_slack_us=10, mode=mode,  # type: ignore[arg-type]
                                                        indexing=indexing))
    assert engine.feed(stream) == []
    assert engine.on_item(iv("x100|100")) == [] and engine.advance_clock(200) == [] and engine.finish() == []


@pytest.mark.parametrize("mode", ["conservative", "aggressive"])
def test_snapshot_at_every_cut_of_the_purge_case_restores_exactly(mode: str) -> None:
    stream: list[Item] = [iv("a0|0"), iv("c4|9"), begin("d4"), iv("d4|4"), begin("d8"), iv("x35|35"), iv("d8|40")]
    query = parse_iseq(NEG_NONSTRICT)
    config = IntervalEngineConfig(k_slack_us=10, mode=mode, indexing="ibp",  # type: ignore[arg-type]
                                  punctuated_types=frozenset("D"))
    whole = IntervalEngine(query, config)
    expected = whole.feed(stream) + whole.finish()
    for cut in range(len(stream) + 1):
        first = IntervalEngine(query, config)
        out = first.feed(stream[:cut])
        second = IntervalEngine(query, config)
        second.import_state(json.loads(json.dumps(first.export_state())))
        assert second.export_state() == first.export_state()
        out += second.feed(stream[cut:]) + second.finish()
        assert out == expected, cut
        assert second.counters == whole.counters, cut


@pytest.mark.parametrize("mode", ["conservative", "aggressive"])
def test_snapshot_of_the_pre_fix_engine_with_a_negated_pending_result_drops_it_on_import(mode: str) -> None:
    """The engine before the fix kept <a0, c4> pending after c4|9 although the buffered d4|4 hits it; restoring such
    a snapshot must not let d4's purge at CLOCK 28 release it."""
    query = parse_iseq(NEG_NONSTRICT)
    config = IntervalEngineConfig(mode=mode, indexing="naive", punctuated_types=frozenset("D"))  # type: ignore[arg-type]
    first = IntervalEngine(query, config)
    first.feed([iv("a0|0"), begin("d4"), iv("d4|4"), begin("d8"), iv("c4|9")])
    state = json.loads(json.dumps(first.export_state()))
    assert state["pending"] == [] and state["counters"]["negated_results"] == 1
    state["pending"] = [{"binding": {"a": state["buffers"]["a"][0], "c": state["buffers"]["c"][0]}, "emitted": False}]
    state["counters"]["negated_results"] = 0  # as the old engine would have written it
    second = IntervalEngine(query, config)
    second.import_state(state)
    assert second.pending_count == 0 and second.export_state() == first.export_state()
    assert second.on_item(iv("d8|28")) == [] and second.finish() == []


@pytest.mark.parametrize("indexing", PROFILES)
def test_negating_interval_is_judged_on_its_own_attributes_not_its_begins(indexing: IndexingProfile) -> None:
    """EndpointPairer merges the end's attributes into the interval: the IBP of d2 has no x, the interval has x = 1
    (= a.x), so d2|5 negates <a0, c3>.  An IBP is not trusted for x (issue 25.1): while d2 is open its x is
    unknown and it counts as hitting, so aggressive mode does not emit <a0, c3> either."""
    query = parse_iseq("EVENT ISEQ[a.te < c.ts AND a.te < d.te AND d.ts < c.ts](A a, !D d, C c; 30) WHERE d.x = a.x")
    a0, c3, d2 = (Interval("A", 0, 1, {"x": 1}, "a0"), Interval("C", 3, 4, event_id="c3"),
                  Interval("D", 2, 5, {"x": 1}, "d2"))
    assert reference_keys(query, [a0, c3, d2]) == []
    stream: list[Item] = [a0, begin("d2"), c3, d2]
    expected: dict[str, list[list[tuple[str, list[str]]]]] = {"conservative": [[], [], [], []],
                "aggressive": [[], [], [], []]}
    for mode, per_item in expected.items():
        engine = IntervalEngine(query, IntervalEngineConfig(mode=mode, indexing=indexing,  # type: ignore[arg-type]
                                                            punctuated_types=frozenset("D")))
        assert [names(engine.on_item(item)) for item in stream] == per_item, mode
        assert engine.finish() == []


def test_on_interval_and_on_begin_refuse_the_other_item_kind_before_touching_state() -> None:
    engine = IntervalEngine(parse_iseq(NEG_NONSTRICT), IntervalEngineConfig(punctuated_types=frozenset("D")))
    with pytest.raises(IntervalError, match="on_interval takes an Interval, got IntervalBegin"):
        engine.on_interval(begin("d4"))  # type: ignore[arg-type]
    with pytest.raises(IntervalError, match="on_begin takes an IntervalBegin, got Interval"):
        engine.on_begin(iv("d4|4"))  # type: ignore[arg-type]
    assert engine.counters.items == 0 and engine.clock_us is None
    assert names(engine.on_item(begin("d4"))) == [] and engine.buffer_contents()["d"] == [("d4", 4, None)]


# -- T6 / T7: K-ISlack purge ------------------------------------------------------------------------------------
@pytest.mark.parametrize(("k", "kept_at", "purged_at"), [(2, 15, 16), (0, 13, 14)])
def test_k_islack_purge_boundary(k: int, kept_at: int, purged_at: int) -> None:
    engine = IntervalEngine(parse_iseq("EVENT ISEQ[X.te < Y.ts](X, Y; 10)"), IntervalEngineConfig(k_slack_us=k))
    engine.on_item(Interval("X", 3, 7, event_id="x"))
    engine.advance_clock(kept_at)
    assert ids(engine)["X"] == ["x"]
    engine.advance_clock(purged_at)
    assert ids(engine)["X"] == []


def test_example_4_9_k_slack_purge_with_points() -> None:
    query = parse_iseq("EVENT ISEQ[A.te < B.ts AND B.te < D.ts](A, B, D; 7)")
    engine = IntervalEngine(query, IntervalEngineConfig(k_slack_us=2, indexing="naive"))
    for name in ("a3|3", "b6|6", "d10|10"):
        engine.on_item(iv(name))
    engine.on_item(iv("c13|13"))
    assert ids(engine) == {"A": [], "B": ["b6"], "D": ["d10"]}  # 3 + 7 + 2 = 12 < 13
    engine.on_item(iv("d15|15"))
    assert ids(engine)["B"] == ["b6"]  # 15 < 15 is false
    engine.on_item(iv("f16|16"))
    assert ids(engine)["B"] == [] and "d10" in ids(engine)["D"]
    engine.on_item(iv("f17|17"))
    assert "d10" in ids(engine)["D"]
    engine.on_item(iv("f21|21"))
    assert "d10" not in ids(engine)["D"]


def test_item_behind_clock_minus_k_is_too_late_and_not_joined() -> None:
    engine = IntervalEngine(parse_iseq("EVENT ISEQ[A.te < B.ts](A, B; 10)"), IntervalEngineConfig(k_slack_us=2))
    engine.on_item(iv("b8|9"))
    out = engine.on_item(iv("a1|6"))  # 6 < 9 - 2
    assert [o.kind for o in out] == ["too_late"] and out[0].cause == iv("a1|6")
    assert ids(engine)["A"] == []


# -- T9: Ch.4 sort semantics with points (DER output set) -------------------------------------------------------
def test_example_4_7_late_b8_builds_the_three_derived_sequences() -> None:
    query = parse_iseq("EVENT ISEQ[A.te < B.ts AND B.te < D.ts](A, B, D; 10)")
    for mode in ("conservative", "aggressive"):
        engine = IntervalEngine(query, IntervalEngineConfig(k_slack_us=7, mode=mode))
        out = engine.feed([iv(n) for n in ("a3|3", "b6|6", "a7|7", "d10|10", "b11|11", "d15|15")])
        assert names(out) == [("match", ["a3|3", "b6|6", "d10|10"]), ("match", ["a7|7", "b11|11", "d15|15"])]
        late = names(engine.on_item(iv("b8|8")))
        kind = "add" if mode == "aggressive" else "match"
        assert sorted(late) == [(kind, ["a3|3", "b8|8", "d10|10"]), (kind, ["a7|7", "b8|8", "d10|10"]),
                                (kind, ["a7|7", "b8|8", "d15|15"])]


# -- T8: interval abstraction (Li 5.4.1) ------------------------------------------------------------------------
def test_temperature_readings_become_meeting_level_intervals() -> None:
    op = PointToIntervalOperator("t1")
    items: list[Item] = []
    for i, value in enumerate((55, 70, 95, 80, 110, 120, 90, 60, 30)):
        items += op.on_reading(i * 2_000_000, value)
    s = 1_000_000
    assert [i for i in items if isinstance(i, Interval)] == [
        Interval("MEDIUM", 0, 8 * s, {"source": "t1"}, "t1:0"),
        Interval("HIGH", 8 * s, 12 * s, {"source": "t1"}, "t1:1"),
        Interval("MEDIUM", 12 * s, 16 * s, {"source": "t1"}, "t1:2")]
    assert [(b.event_type, b.start_ts_us) for b in items if isinstance(b, IntervalBegin)] == [
        ("MEDIUM", 0), ("HIGH", 8 * s), ("MEDIUM", 12 * s), ("LOW", 16 * s)]
    assert op.open_level == ("LOW", 16 * s)
    assert holds("meets", (0, 8 * s), (8 * s, 12 * s))


def test_levels_feed_an_iseq_query_high_contains_a_stay() -> None:
    op = PointToIntervalOperator("t1")
    items: list[Item] = []
    for t, value in ((0, 55), (8, 110), (12, 90)):
        items += op.on_reading(t, value)
    query = parse_iseq("EVENT ISEQ[HIGH contains STAY](HIGH, STAY; 100)")
    engine = IntervalEngine(query, IntervalEngineConfig(indexing="ibp", punctuated_types=frozenset({"HIGH"})))
    out = engine.feed([*items[:3], Interval("STAY", 9, 11, event_id="s"), *items[3:]])
    assert names(out) == [("match", ["high8|12", "stay9|11"])]
