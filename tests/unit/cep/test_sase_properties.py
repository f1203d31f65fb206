"""Property tests: for any arrival order whose delays stay within K, the engine's results equal the brute-force
reference evaluator's results on the sorted stream (conservative: exactly, and never an invalid match;
aggressive: matches plus compensations net to the same set; snapshot/restore mid-stream changes nothing)."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cep.sase import EngineConfig, SaseEvent, SaseOutput, SequenceEngine, parse_query, reference_matches

QUERIES = [
    "EVENT SEQ(A a, B b, C c) WITHIN 10",
    "EVENT SEQ(A a, B b) WHERE a.id = b.id AND a.v < b.v WITHIN 8",
    "EVENT SEQ(A a, A b, B c) WITHIN 6",
    "EVENT SEQ(A a, B b, D d) WHERE b.v >= 1 AND a.v != d.v WITHIN 10",
    "EVENT SEQ(A a, !(C c), B b) WHERE a.id = c.id AND c.id = b.id WITHIN 8",
    "EVENT SEQ(!(C c), A a, B b) WITHIN 8",
    "EVENT SEQ(A a, B b, !(C c)) WITHIN 8",
    "EVENT SEQ(A a, !(C c), B b) WHERE c.v > 2 AND c.id = a.id WITHIN 8",
    "EVENT SEQ(A a, !(C c), B b, !(D d), C e) WHERE [id] WITHIN 12",
    "EVENT SEQ(A a) WITHIN 5",
]

Key = tuple[tuple[str, int, str | None], ...]


@st.composite
def streams(draw: st.DrawFn) -> tuple[list[SaseEvent], int]:
    """Events with random types/timestamps/attributes, and an arrival order with delays <= K."""
    k = draw(st.integers(0, 15))
    n = draw(st.integers(0, 28))
    items = []
    for i in range(n):
        etype = draw(st.sampled_from("AABBCDX"))
        ts = draw(st.integers(0, 40))
        attrs = {"id": draw(st.integers(0, 2)), "v": draw(st.integers(0, 4))}
        delay = draw(st.integers(0, k))
        items.append((ts + delay, i, SaseEvent(etype, ts, attrs, f"e{i}")))
    items.sort(key=lambda x: (x[0], x[1]))
    return [e for _, _, e in items], k


def key(events: tuple[SaseEvent, ...]) -> Key:
    return tuple((e.event_type, e.ts, e.event_id) for e in events)


def run(engine: SequenceEngine, arrivals: list[SaseEvent]) -> list[SaseOutput]:
    out: list[SaseOutput] = []
    for e in arrivals:
        out.extend(engine.on_event(e))
    out.extend(engine.end_of_stream())
    return out


SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("text", QUERIES)
@SETTINGS
@given(data=streams())
def test_conservative_equals_reference(text: str, data: tuple[list[SaseEvent], int]) -> None:
    arrivals, k = data
    q = parse_query(text)
    expected = {key(m) for m in reference_matches(q, arrivals)}
    eng = SequenceEngine(q, EngineConfig(k_slack_us=k))
    out = []
    for e in arrivals:
        for o in eng.on_event(e):
            assert o.kind == "match"
            assert key(o.events) in expected, "conservative output must be permanently valid"
            out.append(key(o.events))
    out.extend(key(o.events) for o in eng.end_of_stream())
    assert len(out) == len(set(out)), "no duplicates"
    assert set(out) == expected
    assert eng.counters.too_late == 0
    assert eng.counters.held == 0 and eng.counters.instances == 0 and eng.counters.negation_events == 0


@pytest.mark.parametrize("text", QUERIES)
@SETTINGS
@given(data=streams())
def test_aggressive_nets_to_reference(text: str, data: tuple[list[SaseEvent], int]) -> None:
    arrivals, k = data
    q = parse_query(text)
    expected = Counter(key(m) for m in reference_matches(q, arrivals))
    eng = SequenceEngine(q, EngineConfig(k_slack_us=k, mode="aggressive"))
    net: Counter[Key] = Counter()
    for o in run(eng, arrivals):
        if o.kind == "retract":
            assert net[key(o.events)] == 1, "only an emitted match can be retracted"
            net[key(o.events)] -= 1
        else:
            net[key(o.events)] += 1
    assert +net == expected


@pytest.mark.parametrize("text", QUERIES[:2] + QUERIES[4:5] + QUERIES[8:9])
@SETTINGS
@given(data=streams())
def test_optimisations_do_not_change_results(text: str, data: tuple[list[SaseEvent], int]) -> None:
    arrivals, k = data
    q = parse_query(text)
    results = []
    for clock in (True, False):
        for partition in (True, False):
            eng = SequenceEngine(q, EngineConfig(k_slack_us=k, ais_clock=clock, ais_partition=partition))
            results.append(sorted(key(o.events) for o in run(eng, arrivals)))
    assert all(r == results[0] for r in results)


@pytest.mark.parametrize("text", QUERIES[:1] + QUERIES[4:5] + QUERIES[6:7])
@SETTINGS
@given(data=streams())
def test_punctuations_instead_of_k(text: str, data: tuple[list[SaseEvent], int]) -> None:
    """No K at all: after each arrival a punctuation promises the smallest timestamp still to come."""
    arrivals, _ = data
    q = parse_query(text)
    expected = {key(m) for m in reference_matches(q, arrivals)}
    eng = SequenceEngine(q, EngineConfig(k_slack_us=None))
    out = []
    for i, e in enumerate(arrivals):
        out.extend(eng.on_event(e))
        rest = [x.ts for x in arrivals[i + 1 :]]
        if rest:
            out.extend(eng.on_punctuation(min(rest)))
    out.extend(eng.end_of_stream())
    assert {key(o.events) for o in out} == expected
    assert all(key(o.events) in expected for o in out)
    assert eng.counters.instances == 0


@pytest.mark.parametrize("text", QUERIES[4:5] + QUERIES[6:7] + QUERIES[1:2])
@pytest.mark.parametrize("mode", ["conservative", "aggressive"])
@SETTINGS
@given(data=streams(), cut=st.floats(0, 1))
def test_snapshot_restore_mid_stream(text: str, mode: str, data: tuple[list[SaseEvent], int], cut: float) -> None:
    arrivals, k = data
    q = parse_query(text)
    cfg = EngineConfig(k_slack_us=k, mode=mode)  # type: ignore[arg-type]
    whole = [o.to_dict() for o in run(SequenceEngine(q, cfg), arrivals)]
    at = int(cut * len(arrivals))
    first = SequenceEngine(q, cfg)
    out = []
    for e in arrivals[:at]:
        out.extend(first.on_event(e))
    blob = first.snapshot()
    second = SequenceEngine.restore(q, cfg, blob)
    assert second.snapshot() == blob
    assert second.stats() == first.stats()
    out.extend(run(second, arrivals[at:]))
    assert [o.to_dict() for o in out] == whole


@st.composite
def unbounded_streams(draw: st.DrawFn) -> tuple[list[SaseEvent], int]:
    """Like ``streams`` but some delays exceed K, so the engine must drop events."""
    k = draw(st.integers(0, 8))
    n = draw(st.integers(0, 28))
    items = []
    for i in range(n):
        ts = draw(st.integers(0, 40))
        attrs = {"id": draw(st.integers(0, 2)), "v": draw(st.integers(0, 4))}
        delay = draw(st.integers(0, 3 * k + 3))
        items.append((ts + delay, i, SaseEvent(draw(st.sampled_from("AABBCDX")), ts, attrs, f"e{i}")))
    items.sort(key=lambda x: (x[0], x[1]))
    return [e for _, _, e in items], k


@pytest.mark.parametrize("text", QUERIES[:1] + QUERIES[4:7])
@SETTINGS
@given(data=unbounded_streams())
def test_events_beyond_k_are_dropped_and_the_rest_stays_exact(text: str, data: tuple[list[SaseEvent], int]) -> None:
    """Without allowed lateness, delays beyond K break the promise: those events are not processed (a too_late
    output each), and the output is exactly the reference result of the events that were accepted, never a
    partial or invalid match."""
    arrivals, k = data
    q = parse_query(text)
    eng = SequenceEngine(q, EngineConfig(k_slack_us=k, allowed_lateness_us=0))
    accepted: list[SaseEvent] = []
    out: list[Key] = []
    for e in arrivals:
        outs = eng.on_event(e)
        if [o.kind for o in outs] == ["too_late"]:
            assert outs[0].events == (e,) and outs[0].reason == "beyond_allowed_lateness"
        else:
            accepted.append(e)
            out.extend(key(o.events) for o in outs)
    out.extend(key(o.events) for o in eng.end_of_stream())
    assert eng.counters.too_late == len(arrivals) - len(accepted)
    assert sorted(out) == sorted(key(m) for m in reference_matches(q, accepted))


@pytest.mark.parametrize("text", [QUERIES[0], QUERIES[2], "EVENT SEQ(A a, B b, C c, D d) WITHIN 12"])
@SETTINGS
@given(data=streams())
def test_rip_invariant_after_every_event(text: str, data: tuple[list[SaseEvent], int]) -> None:
    """Stacks stay sorted and every RIP is the topmost instance of the previous stack with a smaller
    timestamp (None when there is none left), through late insertions, RIP repairs and purges."""
    arrivals, k = data
    eng = SequenceEngine(parse_query(text), EngineConfig(k_slack_us=k, purge_lag=0))
    for e in arrivals:
        eng.on_event(e)
        ais = eng.partition()
        if ais is None:
            continue
        for pos in range(ais.length):
            stack = ais.instances(pos)
            assert [i.ts for i in stack] == sorted(i.ts for i in stack)
            if pos == 0:
                continue
            prev = ais.instances(pos - 1)
            for inst in stack:
                below = [p for p in prev if p.ts < inst.ts]
                assert inst.rip is (below[-1] if below else None)


# ---------------------------------------------------------------- late events within the allowed lateness

LATE_QUERIES = [QUERIES[0], QUERIES[1], QUERIES[4], QUERIES[5], QUERIES[6], QUERIES[7], QUERIES[8]]


@st.composite
def late_streams(draw: st.DrawFn) -> tuple[list[SaseEvent], int, int]:
    """Delays far beyond K: events behind L within the allowed lateness A (late) and beyond it (too late)."""
    k = draw(st.integers(0, 6))
    allowed = draw(st.integers(0, 20))
    n = draw(st.integers(0, 24))
    items = []
    for i in range(n):
        ts = draw(st.integers(0, 40))
        attrs = {"id": draw(st.integers(0, 2)), "v": draw(st.integers(0, 4))}
        delay = draw(st.integers(0, k + 30))
        items.append((ts + delay, i, SaseEvent(draw(st.sampled_from("AABBCDX")), ts, attrs, f"e{i}")))
    items.sort(key=lambda x: (x[0], x[1]))
    return [e for _, _, e in items], k, allowed


def lateness(arrivals: list[SaseEvent], k: int, allowed: int) -> list[str]:
    """Each arrival against L = CLOCK - K before it (CLOCK: the largest timestamp seen; late events never move
    it, being below L)."""
    out = []
    clock: int | None = None
    for e in arrivals:
        low = None if clock is None else clock - k
        out.append("on_time" if low is None or e.ts >= low else "late" if e.ts >= low - allowed else "too_late")
        clock = e.ts if clock is None else max(clock, e.ts)
    return out


def final_at(text: str, match: tuple[SaseEvent, ...]) -> int:
    """The largest upper end of the match's negation ranges (docs/sase.md), written from the query's elements:
    once L reaches it, no on-time event can negate the match."""
    q = parse_query(text)
    his = []
    positives_before = 0
    for el in q.elements:
        if not el.negated:
            positives_before += 1
        else:
            his.append(match[positives_before].ts if positives_before < len(match) else match[0].ts + q.window)
    return max(his, default=-(10**9))


def completed_late(match: tuple[SaseEvent, ...], arrivals: list[SaseEvent], late: list[str]) -> bool:
    """Whether the member that arrived last (the one whose arrival constructs the match) was late."""
    last = max(arrivals.index(e) for e in match)
    return late[last] == "late"


@pytest.mark.parametrize("text", LATE_QUERIES)
@pytest.mark.parametrize("driver", ["k_slack", "punctuation"])
@SETTINGS
@given(data=late_streams(), cut=st.floats(0, 1))
def test_conservative_late_events_against_brute_force(
    text: str, driver: str, data: tuple[list[SaseEvent], int, int], cut: float
) -> None:
    """Union of match and late_match minus invalidated = the reference over all events not too late; a match is
    late_match exactly when its last member arrived late; invalidated = what was released (final against L over the
    events seen so far) but is not in the reference, each with a late negation event that negates it; too_late
    exactly for the events behind L - A.  A snapshot/restore at a random point changes nothing.  ``driver``: L from
    K-slack, or (as the Spark job drives it) from a punctuation after each event at the largest timestamp seen
    minus K, which gives the same L before each event."""
    arrivals, k, allowed = data
    q = parse_query(text)
    late = lateness(arrivals, k, allowed)
    kept = [e for e, lt in zip(arrivals, late, strict=True) if lt != "too_late"]
    final = {key(m) for m in reference_matches(q, kept)}
    expected_emitted: dict[Key, bool] = {key(m): completed_late(m, arrivals, late) for m in reference_matches(q, kept)}
    prefix: list[SaseEvent] = []
    for e in kept:
        prefix.append(e)
        low = max(x.ts for x in prefix) - k
        for m in reference_matches(q, prefix):
            if final_at(text, m) <= low:
                expected_emitted.setdefault(key(m), completed_late(m, arrivals, late))

    punctuated = driver == "punctuation"
    cfg = EngineConfig(k_slack_us=None if punctuated else k, allowed_lateness_us=allowed)
    eng = SequenceEngine(q, cfg)
    emitted: dict[Key, bool] = {}
    invalidated: set[Key] = set()
    too_late: list[SaseEvent] = []

    def collect(outs: list[SaseOutput]) -> None:
        for o in outs:
            if o.kind == "too_late":
                assert len(o.events) == 1 and o.reason == "beyond_allowed_lateness"
                too_late.append(o.events[0])
            elif o.kind == "invalidated":
                assert key(o.events) in emitted and key(o.events) not in invalidated
                assert o.cause is not None and late[arrivals.index(o.cause)] == "late"
                assert key(o.events) not in {key(m) for m in reference_matches(q, [*o.events, o.cause])}
                invalidated.add(key(o.events))
            else:
                assert o.kind in ("match", "late_match")
                assert key(o.events) not in emitted, "each match once"
                emitted[key(o.events)] = o.kind == "late_match"

    split = int(cut * len(arrivals))
    seen = -(10**9)
    for i, e in enumerate(arrivals):
        if i == split:
            eng = SequenceEngine.restore(q, cfg, eng.snapshot())
        collect(eng.on_event(e))
        seen = max(seen, e.ts)
        if punctuated:
            collect(eng.on_punctuation(seen - k))
    collect(eng.end_of_stream())
    assert emitted == expected_emitted
    assert invalidated == set(expected_emitted) - final
    assert too_late == [e for e, lt in zip(arrivals, late, strict=True) if lt == "too_late"]
    assert eng.counters.too_late == len(too_late)
    assert eng.counters.behind_watermark == late.count("late")
    assert eng.is_idle() and eng.counters.released_retained == 0


@pytest.mark.parametrize("text", LATE_QUERIES)
@SETTINGS
@given(data=late_streams())
def test_aggressive_late_events_net_to_reference(text: str, data: tuple[list[SaseEvent], int, int]) -> None:
    """Aggressive mode: match/add minus retract nets to the reference over the events not too late; a match that a
    late event completes is an add; every retract names a negation event that negates the match."""
    arrivals, k, allowed = data
    q = parse_query(text)
    late = lateness(arrivals, k, allowed)
    kept = [e for e, lt in zip(arrivals, late, strict=True) if lt != "too_late"]
    expected = Counter(key(m) for m in reference_matches(q, kept))
    eng = SequenceEngine(q, EngineConfig(k_slack_us=k, mode="aggressive", allowed_lateness_us=allowed))
    net: Counter[Key] = Counter()
    too_late: list[SaseEvent] = []
    for o in run(eng, arrivals):
        if o.kind == "too_late":
            too_late.extend(o.events)
        elif o.kind == "retract":
            assert net[key(o.events)] == 1, "only an emitted match can be retracted"
            assert o.cause is not None
            assert key(o.events) not in {key(m) for m in reference_matches(q, [*o.events, o.cause])}
            net[key(o.events)] -= 1
        else:
            assert o.kind in ("match", "add")
            if completed_late(o.events, arrivals, late):
                assert o.kind == "add"
            net[key(o.events)] += 1
    assert +net == expected
    assert too_late == [e for e, lt in zip(arrivals, late, strict=True) if lt == "too_late"]
