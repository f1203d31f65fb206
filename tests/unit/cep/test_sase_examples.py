"""The worked examples of Li et al. 2007 (seed 000, Examples 2-6) and Li 2010 (seed 004, Examples 4.9, 4.10)
as exact tests.

Stream of Figure 2(c) / 3 (timestamps from the figures): b1 a3 c5 b6 a7 d10 b11 f12 c13 d15 f16 f17.
Typos in the texts and what we test instead are noted at each test (also in docs/sase.md).
"""

from __future__ import annotations

from cep.sase import EngineConfig, SaseEvent, SaseOutput, SequenceEngine, parse_query

BASE = "b1 a3 c5 b6 a7 d10 b11 f12 c13 d15 f16 f17"


def ev(name: str) -> SaseEvent:
    return SaseEvent(name[0].upper(), int(name[1:]), {}, name)


def names(out: SaseOutput) -> str:
    return " ".join(e.event_id or "" for e in out.events)


def run(engine: SequenceEngine, stream: str) -> list[tuple[str, str, str]]:
    """(arriving event, output kind, output sequence) in output order."""
    out: list[tuple[str, str, str]] = []
    for n in stream.split():
        out.extend((n, o.kind, names(o)) for o in engine.on_event(ev(n)))
    return out


ABD = "EVENT SEQ(A a, B b, D d) WITHIN 10"


def test_figure2_in_order_results() -> None:
    eng = SequenceEngine(parse_query(ABD), EngineConfig(k_slack_us=0))
    assert run(eng, BASE) == [("d10", "match", "a3 b6 d10"), ("d15", "match", "a7 b11 d15")]


def test_example2_incomplete_retrieval_fixed() -> None:
    """a0 and d2 arrive after f17 (delays 17 and 15, so K = 20): all states are active, b1 was kept, and
    <a0 b1 d2> is found when d2 arrives."""
    eng = SequenceEngine(parse_query(ABD), EngineConfig(k_slack_us=20))
    assert run(eng, BASE + " a0 d2") == [
        ("d10", "match", "a3 b6 d10"),
        ("d15", "match", "a7 b11 d15"),
        ("d2", "match", "a0 b1 d2"),
    ]
    assert eng.counters.late_events == 2


def test_example2_aggressive_marks_late_match_as_add() -> None:
    eng = SequenceEngine(parse_query(ABD), EngineConfig(k_slack_us=20, mode="aggressive"))
    assert run(eng, BASE + " a0 d2")[-1] == ("d2", "add", "a0 b1 d2")


def test_example5_sort_semantics_and_rip_reset() -> None:
    """b8 after f17 is inserted between b6 and b11; d10's RIP moves from b6 to b8."""
    eng = SequenceEngine(parse_query(ABD), EngineConfig(k_slack_us=20))
    run(eng, BASE)
    ais = eng.partition()
    assert ais is not None
    d10 = ais.instances(2)[0]
    assert d10.rip is not None and d10.rip.event.event_id == "b6"
    out = run(eng, "b8")
    assert [i.event.event_id for i in ais.instances(1)] == ["b1", "b6", "b8", "b11"]
    assert d10.rip.event.event_id == "b8"
    b8 = ais.instances(1)[2]
    assert b8.rip is not None and b8.rip.event.event_id == "a7"
    # d15 keeps b11 (b8 is not between b11 and d15)
    d15 = ais.instances(2)[1]
    assert d15.rip is not None and d15.rip.event.event_id == "b11"
    assert eng.counters.rip_resets == 1
    # The text lists <a3 b8 d10> and <a3 b8 d15>; with W = 10 the window removes <a3 b8 d15> (15 - 3 >= 10)
    # and the RIP of b8 (a7) also yields <a7 b8 d10> and <a7 b8 d15>, which the text does not list.
    assert sorted(o[2] for o in out) == ["a3 b8 d10", "a7 b8 d10", "a7 b8 d15"]


def test_example5_sequences_before_the_window_filter() -> None:
    """Sequence construction itself (SSC, before WD) builds both sequences the text names."""
    eng = SequenceEngine(parse_query("EVENT SEQ(A a, B b, D d) WITHIN 100"), EngineConfig(k_slack_us=20))
    run(eng, BASE)
    out = {o[2] for o in run(eng, "b8")}
    assert {"a3 b8 d10", "a3 b8 d15"} <= out
    assert out == {"a3 b8 d10", "a3 b8 d15", "a7 b8 d10", "a7 b8 d15"}


def test_example3_misplacement_avoided_for_d2() -> None:
    """d2 goes to the bottom of S3 with RIP b1 (not on top with RIP b8): no <a3 b6 d2>, <a3 b11 d2>."""
    eng = SequenceEngine(parse_query(ABD), EngineConfig(k_slack_us=20))
    run(eng, BASE + " b8")
    assert run(eng, "d2") == []
    ais = eng.partition()
    assert ais is not None
    d2 = ais.instances(2)[0]
    assert d2.event.event_id == "d2" and d2.rip is not None and d2.rip.event.event_id == "b1"


def test_example6_purge_order_w7_k2() -> None:
    """Algorithm 3 with W = 7, K = 2: a3 when c13 arrives (3+7+2 < 13), b6 at f16, d10 at f21."""
    eng = SequenceEngine(parse_query("EVENT SEQ(A a, B b, D d) WITHIN 7"),
                         EngineConfig(k_slack_us=2, record_purges=True, purge_lag=0, allowed_lateness_us=0))
    assert run(eng, BASE + " f21") == []  # 10 - 3 = 7 is not < 7; 15 - 7 = 8 neither
    log = [(clock, f"{t.lower()}{ts}") for clock, t, ts in eng.purge_log]
    named = [x for x in log if x[1] in {"a3", "b6", "d10"}]
    assert named == [(13, "a3"), (16, "b6"), (21, "d10")]
    # every instance, in purge order (last stack first at the same CLOCK: lazy purge along RIP chains)
    assert log == [(11, "b1"), (13, "a3"), (16, "b6"), (17, "a7"), (21, "d10"), (21, "b11")]
    assert eng.counters.instances == 1  # d15
    assert eng.counters.purged_instances == 6


def test_partition_example_k10_only_a7_b11_d15() -> None:
    """AIS partition: with K = 10, a3 and b6 are still kept at d15, but in-order construction skips outdated
    instances, so d15 builds only <a7 b11 d15>.  The text says W = 7, but with W = 7 a7 is itself outdated
    (7 + 7 < 15) and <a7 b11 d15> is outside the window (8 >= 7); the example holds for W = 10 (Figure 2's
    query), which we test.  Without the partition three sequences are built (the text's <a6 b11 d15> is a7)."""
    q = parse_query(ABD)
    for partition, candidates in ((True, 1), (False, 3)):
        eng = SequenceEngine(q, EngineConfig(k_slack_us=10, ais_partition=partition))
        run(eng, BASE.split(" d15", maxsplit=1)[0])
        before = eng.counters.candidates
        assert run(eng, "d15") == [("d15", "match", "a7 b11 d15")]
        assert eng.counters.candidates - before == candidates
        ais = eng.partition()
        assert ais is not None
        assert [i.event.event_id for i in ais.instances(0)] == ["a3", "a7"]  # a3 kept (K = 10)
        assert ais.outdated(0, 15) == 1  # divider: a3 outdated (3 + 10 < 15)
        assert ais.outdated(1, 15) == 1  # b1


NEG = "EVENT SEQ(A a, B b, !(C c), D d) WITHIN 10"


def test_slides_negation_in_order() -> None:
    """SEQ(A, B, !C, D): <a3 b6 d10> holds (c5 is before b6), <a7 b11 d15> is negated by c13."""
    eng = SequenceEngine(parse_query(NEG), EngineConfig(k_slack_us=0))
    assert run(eng, BASE) == [("d10", "match", "a3 b6 d10")]
    assert eng.counters.negated_at_construction == 1


def test_example_4_10_release_at_clock_16() -> None:
    """K = 6: <a3 b6 d10> is held at d10 and released when f16 makes CLOCK 16 (no C below 10 can come).
    Algorithm 10 line 14 writes em.ts + K < CLOCK (release at 17); the text releases at 16, the exact bound."""
    eng = SequenceEngine(parse_query(NEG), EngineConfig(k_slack_us=6))
    out = run(eng, "b1 a3 c5 b6 a7 d10 b11 f12 c13 d15")
    assert out == []
    assert [" ".join(e.event_id or "" for e in h.events) for h in eng.held_matches()] == ["a3 b6 d10"]
    released = eng.on_event(ev("f16"))
    assert [(o.kind, names(o), o.emitted_at) for o in released] == [("match", "a3 b6 d10", 16)]
    assert eng.held_matches() == []


def test_example_4_10_late_c9_filters_held_match() -> None:
    """c9 arrives between d15 and f16 (delay 15 - 9 = 6 = K, accepted): the held <a3 b6 d10> is removed."""
    eng = SequenceEngine(parse_query(NEG), EngineConfig(k_slack_us=6))
    assert run(eng, "b1 a3 c5 b6 a7 d10 b11 f12 c13 d15 c9 f16 f17") == []
    assert eng.counters.invalidated_while_held == 1
    assert eng.end_of_stream() == []


def test_example_4_10_aggressive_retracts() -> None:
    eng = SequenceEngine(parse_query(NEG), EngineConfig(k_slack_us=6, mode="aggressive"))
    assert run(eng, "b1 a3 c5 b6 a7 d10 b11 f12 c13 d15 c9 f16") == [
        ("d10", "match", "a3 b6 d10"),
        ("c9", "retract", "a3 b6 d10"),
    ]


def test_example_4_4_c9_after_f16_is_late() -> None:
    """Example 4.4's order: c9 arrives after f16 (delay 16 - 9 = 7 > K = 6), when <a3 b6 d10> is already released.
    Li's engine (no allowed lateness) cannot use it: too_late.  With an allowed lateness A >= 1 (L - A = 16 - 6 - A
    <= 9) it is a late event: the released match is reported invalidated, caused by c9 (aggressive: retracted)."""
    stream = "b1 a3 c5 b6 a7 d10 b11 f12 c13 d15 f16 c9"
    li = SequenceEngine(parse_query(NEG), EngineConfig(k_slack_us=6, allowed_lateness_us=0))
    assert run(li, stream) == [("f16", "match", "a3 b6 d10"), ("c9", "too_late", "c9")]
    late = SequenceEngine(parse_query(NEG), EngineConfig(k_slack_us=6, allowed_lateness_us=7))
    outs = run(late, stream[: -len(" c9")])
    c9 = late.on_event(ev("c9"))
    assert [(o.kind, names(o), o.cause) for o in c9] == [("invalidated", "a3 b6 d10", ev("c9"))]
    assert outs == [("f16", "match", "a3 b6 d10")]
    just_enough = SequenceEngine(parse_query(NEG), EngineConfig(k_slack_us=6, allowed_lateness_us=1))
    assert run(just_enough, stream)[-1] == ("c9", "invalidated", "a3 b6 d10")  # 9 >= 10 - 1
    aggressive = SequenceEngine(parse_query(NEG), EngineConfig(k_slack_us=6, allowed_lateness_us=7, mode="aggressive"))
    assert run(aggressive, stream) == [("d10", "match", "a3 b6 d10"), ("c9", "retract", "a3 b6 d10")]


def test_example_4_9_lazy_purge_chain() -> None:
    """Optimization 4.4: purging d10 (at f21) follows d10 -> b6 -> a3 (already purged by their own time)."""
    eng = SequenceEngine(parse_query("EVENT SEQ(A a, B b, D d) WITHIN 7"),
                         EngineConfig(k_slack_us=2, record_purges=True, purge_lag=0, allowed_lateness_us=0))
    run(eng, "a3 b6 d10")
    ais = eng.partition()
    assert ais is not None
    d10 = ais.instances(2)[0]
    assert d10.rip is not None and d10.rip.event.event_id == "b6"
    assert d10.rip.rip is not None and d10.rip.rip.event.event_id == "a3"
    eng.advance_clock(21)  # 10 + 7 + 2 < 21: the whole chain goes at once
    assert [f"{t.lower()}{ts}" for _, t, ts in eng.purge_log] == ["d10", "b6", "a3"]
    assert len(ais) == 0
