"""Uncertainty-aware patterns: Pseudocode 3.1 boundaries, any-n rule, matcher, no false negatives."""

from __future__ import annotations

import gc
import itertools
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cep.patterns import (
    Confidence,
    Element,
    PatternMatch,
    PatternSpec,
    UncertainPatternMatcher,
    classify,
    parse_duration_us,
)

C, U = Confidence.CONFIRMED, Confidence.UNCERTAIN
BIG = 10**9


def pair(gap: int, ta: int, within: int = BIG) -> Confidence | None:
    """Thesis mode, n = 2: e1 at 0, e2 at ``gap``; both intervals have full width T_a."""
    return classify([0, gap], [ta, ta], within)


@pytest.mark.parametrize(
    ("gap", "expected"),
    [
        (101, C),  # e1 -> e2, gap > T_a: Confirmed
        (100, U),  # gap == T_a: the thesis' "<=" makes it Uncertain (intervals touch)
        (1, U),
        (0, U),  # same reference time
        (-1, U),  # e2 -> e1 within T_a: Uncertain (Query 5.9, second part)
        (-100, U),  # e1.ts - e2.ts == T_a: still Uncertain ("<=")
        (-101, None),  # e2 -> e1 beyond T_a: Pattern Not Detected, nothing emitted
    ],
)
def test_pseudocode_3_1_boundaries(gap: int, expected: Confidence | None) -> None:
    assert pair(gap, 100) == expected


def test_odd_ta_stays_exact() -> None:
    assert pair(101, 101) == U
    assert pair(102, 101) == C
    assert pair(-101, 101) == U
    assert pair(-102, 101) == None  # noqa: E711


def test_per_event_widths() -> None:
    # u1 = 30, u2 = 20: the order is certain beyond 50 apart.
    assert classify([0, 51], [60, 40], BIG) == C
    assert classify([0, 50], [60, 40], BIG) == U
    assert classify([0, -50], [60, 40], BIG) == U
    assert classify([0, -51], [60, 40], BIG) == None  # noqa: E711
    assert classify([0, 0], [0, 0], BIG) == U  # exact clocks, same instant: not strictly ordered
    assert classify([0, 1], [0, 0], BIG) == C


def test_three_elements() -> None:
    # T_a = 100 (u = 50).  0, 50, 200: the first two overlap -> Uncertain; 0, 101, 202 -> Confirmed.
    assert classify([0, 50, 200], [100] * 3, BIG) == U
    assert classify([0, 101, 202], [100] * 3, BIG) == C
    # A middle event far before the first: no order can put it between.
    assert classify([0, -200, 300], [100] * 3, BIG) is None
    # e3 observed before e2 but within T_a: possible.
    assert classify([0, 300, 250], [100] * 3, BIG) == U


def test_within_under_uncertainty() -> None:
    # T_a = 100, W = 1000.  Confirmed needs the widest span (ts2 - ts1 + T_a) <= W; possible needs the narrowest.
    assert pair(900, 100, 1000) == C
    assert pair(901, 100, 1000) == U
    assert pair(1000, 100, 1000) == U
    assert pair(1100, 100, 1000) == U  # true gap can be 1100 - 100 = 1000 <= W
    assert pair(1101, 100, 1000) is None


def test_durations() -> None:
    assert parse_duration_us("2 s") == 2_000_000
    assert parse_duration_us("44ms") == 44_000
    assert parse_duration_us("1.5 min") == 90_000_000
    assert parse_duration_us("7 us") == 7
    with pytest.raises(ValueError, match="duration"):
        parse_duration_us("3 parsecs")


# ------------------------------------------------------------------------------------------------- spec


GOAL = "SEQ(kick: kind == 'kick', goal: kind == 'goal') PARTITION BY team WITHIN 2 s"


def test_spec_parse_and_text_round_trip() -> None:
    spec = PatternSpec.parse(GOAL)
    assert [e.name for e in spec.elements] == ["kick", "goal"]
    assert (spec.partition_by, spec.within_us, spec.mode, spec.emit) == ("team", 2_000_000, "thesis", "eager")
    assert PatternSpec.parse(spec.to_text()) == spec
    assert spec.partition_key({"team": "A"}) == "A"
    other = PatternSpec.parse(
        "seq(x > 1, y IN ('a', 'b,c'), NOT (z = 3)) within 500 ms mode per_event max_uncertainty 20 ms emit watermark"
    )
    assert [e.name for e in other.elements] == ["e1", "e2", "e3"]
    assert (other.mode, other.max_uncertainty_us, other.emit, other.partition_by) == (
        "per_event",
        20_000,
        "watermark",
        None,
    )
    assert other.elements[1].matches({"y": "b,c"})
    assert PatternSpec.parse(other.to_text()) == other


@pytest.mark.parametrize(
    "bad",
    [
        "SEQ(kind == 'kick')",  # no WITHIN
        "PATTERN(a == 1) WITHIN 1 s",
        "SEQ(a == 1 WITHIN 1 s",
        "SEQ(a == 1,) WITHIN 1 s",
        "SEQ(a: x == 1, a: x == 2) WITHIN 1 s",
        "SEQ(a == 1) WITHIN 1 s BANANAS",
    ],
)
def test_spec_errors(bad: str) -> None:
    with pytest.raises(ValueError):
        PatternSpec.parse(bad)


def test_builder_with_python_callable() -> None:
    spec = PatternSpec.seq(
        Element("a", lambda p: p.get("v", 0) > 1), Element.parse("b", "v < 0"), within_us=1000, mode="per_event"
    )
    with pytest.raises(ValueError, match="callable"):
        spec.to_text()
    m = UncertainPatternMatcher(spec)
    m.on_event(0, 0, {"v": 5}, {"id": 1})
    with pytest.raises(ValueError, match="spec="):
        UncertainPatternMatcher.restore(m.snapshot())
    again = UncertainPatternMatcher.restore(m.snapshot(), spec=spec)
    assert [x.confidence for x in again.on_event(10, 0, {"v": -1}, {"id": 2})] == [C]


# ------------------------------------------------------------------------------------------------- matcher


def ids(matches: list[PatternMatch]) -> list[tuple[tuple[Any, ...], str]]:
    return [(tuple(e["id"] for e in m.events), str(m.confidence)) for m in matches]


def test_matcher_query_5_9_both_orders() -> None:
    m = UncertainPatternMatcher(PatternSpec.parse(GOAL), ta_us=44_000)
    # goal observed before the kick, 30 ms apart (< T_a): only Uncertain (reversed branch of Query 5.9).
    assert m.on_event(1_000_000, 0, {"kind": "goal"}, {"id": "g1"}) == []
    got = m.on_event(1_030_000, 0, {"kind": "kick"}, {"id": "k1"})
    assert ids(got) == [(("k1", "g1"), "Uncertain")]
    assert got[0].gaps_us == (-30_000,)
    assert got[0].tolerances_us == (44_000,)
    assert got[0].in_observed_order is False
    # A goal 44 ms after the kick: exactly T_a -> Uncertain; 45 ms -> Confirmed.
    assert ids(m.on_event(1_074_000, 0, {"kind": "goal"}, {"id": "g2"})) == [(("k1", "g2"), "Uncertain")]
    assert ids(m.on_event(1_075_000, 0, {"kind": "goal"}, {"id": "g3"})) == [(("k1", "g3"), "Confirmed")]
    # A goal 3 s later is outside WITHIN.
    assert m.on_event(4_100_000, 0, {"kind": "goal"}, {"id": "g4"}) == []
    d = got[0].to_dict()
    assert d["confidence"] == "Uncertain"
    assert d["events"] == [{"id": "k1"}, {"id": "g1"}]


def test_thesis_ta_applies_to_events_added_after_the_update() -> None:
    m = UncertainPatternMatcher(PatternSpec.parse(GOAL), ta_us=0)
    m.on_event(0, 0, {"kind": "kick"}, {"id": 1})
    m.set_ta_us(200)
    # kick width 0, goal width 200: tolerance (0 + 200) / 2 = 100.
    got = m.on_event(100, 0, {"kind": "goal"}, {"id": 2})
    assert ids(got) == [((1, 2), "Uncertain")]
    assert ids(m.on_event(101, 0, {"kind": "goal"}, {"id": 3})) == [((1, 3), "Confirmed")]


def test_one_event_fills_one_position() -> None:
    # Both elements accept every event: each event sits in both buckets, but never twice in one combination.
    spec = PatternSpec.parse("SEQ(a: v > 0, b: v > 0) WITHIN 1 s MODE per_event")
    m = UncertainPatternMatcher(spec)
    assert m.on_event(0, 0, {"v": 1}, {"id": 1}) == []
    # Exact clocks: (1, 2) is Confirmed; (2, 1) is impossible.
    assert ids(m.on_event(10, 0, {"v": 1}, {"id": 2})) == [((1, 2), "Confirmed")]


def test_watermark_expires_state() -> None:
    spec = PatternSpec.parse("SEQ(a: k == 'a', b: k == 'b') WITHIN 100 us MODE per_event MAX_UNCERTAINTY 10 us")
    m = UncertainPatternMatcher(spec)
    m.on_event(0, 5, {"k": "a"}, {"id": 1})
    m.on_event(50, 5, {"k": "b"}, {"id": 2})
    m.on_event(40, 5, {"k": "b"}, {"id": 3})
    # The a at 0 (true time <= 5) can meet a future event (true time >= wm - 10) only while wm - 10 - 5 <= 100.
    m.on_watermark(115)
    assert (m.buffered, m.retained) == (3, 0)
    m.on_watermark(116)
    assert (m.buffered, m.retained) == (3, 1)  # past the on-time horizon, kept for late events
    m.on_watermark(10_000)
    assert (m.buffered, m.retained) == (3, 3)
    assert m.counters.expired == 3
    assert m.on_watermark(9_000) == []  # a watermark never goes back
    # Forgotten once a late event within the allowed lateness (ts >= wm - 1 h, u <= 10) cannot reach it either:
    # the a at 0 ends at 5; such an event starts at wm - 1 h - 10, so 5 >= wm - 1 h - 10 - 100 keeps it.
    hour = 3_600_000_000
    assert m.next_timer_us() == hour + 116
    m.on_watermark(hour + 115)
    assert m.buffered == 3
    m.on_watermark(hour + 116)
    assert (m.buffered, m.counters.forgotten) == (2, 1)
    m.on_watermark(10 * hour)
    assert m.is_idle() and m.counters.forgotten == 3


def test_without_allowed_lateness_expired_state_is_dropped() -> None:
    spec = PatternSpec.parse("SEQ(a: k == 'a', b: k == 'b') WITHIN 100 us MODE per_event MAX_UNCERTAINTY 10 us")
    m = UncertainPatternMatcher(spec, allowed_lateness_us=0)
    m.on_event(0, 5, {"k": "a"}, {"id": 1})
    m.on_watermark(116)
    assert (m.buffered, m.counters.expired, m.counters.forgotten) == (0, 1, 1)
    assert m.on_event(115, 0, {"k": "b"}, {"id": 2}) == []
    assert (m.last_lateness, m.counters.too_late) == ("too_late", 1)
    assert m.buffered == 0  # a too-late event is not buffered either


def test_late_event_completes_matches_with_retained_candidates() -> None:
    """Hand-computed: W = 100, exact clocks.  The a at 0 leaves the on-time horizon at wm 101 (0 < 2*101 - 0 -
    200); a late b at 60 still meets it, its match comes at once, flagged; a b at 40 behind wm - 500 is too late."""
    spec = PatternSpec.parse("SEQ(a: k == 'a', b: k == 'b') WITHIN 100 us MODE per_event MAX_UNCERTAINTY 0 us "
                             "EMIT watermark")
    m = UncertainPatternMatcher(spec, allowed_lateness_us=500)
    assert m.on_event(0, 0, {"k": "a"}, {"id": 1}) == []
    assert m.on_watermark(101) == []
    assert (m.retained, m.lateness(101), m.lateness(100), m.lateness(-399), m.lateness(-400)) == (
        1, "on_time", "late", "late", "too_late")
    got = m.on_event(60, 0, {"k": "b"}, {"id": 2})
    assert m.last_lateness == "late"
    assert [(ids([x]), x.late, x.late_element) for x in got] == [([((1, 2), "Confirmed")], True, "b")]
    assert got[0].to_dict()["late"] is True and got[0].to_dict()["late_element"] == "b"
    assert m.held == 0  # returned at once even in EMIT watermark mode
    # An on-time b (ts >= 101) is 101 or more after the a: outside W, whatever is retained.
    assert m.on_event(101, 0, {"k": "b"}, {"id": 3}) == []
    assert (m.last_lateness, m.counters.late_events) == ("on_time", 1)
    assert m.on_watermark(600) == []  # forget horizon 2*600 - 200 - 1000 = 0: the a ends at 0, still kept
    assert m.lateness(100) == "late" and m.lateness(99) == "too_late"
    assert ids(m.on_event(100, 0, {"k": "b"}, {"id": 4})) == [((1, 4), "Confirmed")]  # gap 100 = W
    assert m.on_event(99, 0, {"k": "b"}, {"id": 5}) == []
    assert (m.counters.too_late, m.counters.late_events, m.counters.late_matches) == (1, 3, 2)
    assert m.on_watermark(601) == []
    assert m.counters.forgotten == 1 and m.buffered == 3  # the a at 0 forgotten; b 2, b 3 and b 4 remain


def test_retained_candidates_never_meet_on_time_events() -> None:
    """An on-time event above MAX_UNCERTAINTY could geometrically reach an expired candidate; the on-time path must
    behave exactly as before (the partner is gone for it), so retained state is searched by late events only."""
    spec = PatternSpec.parse("SEQ(a: k == 'a', b: k == 'b') WITHIN 100 us MODE per_event MAX_UNCERTAINTY 0 us")
    m = UncertainPatternMatcher(spec)
    m.on_event(0, 0, {"k": "a"}, {"id": 1})
    m.on_watermark(101)
    assert m.retained == 1
    assert m.on_event(150, 60, {"k": "b"}, {"id": 2}) == []  # [90, 210] would fit with a at 0 (90 - 0 <= 100)
    assert m.counters.over_bound == 1
    # A late event is inserted where it belongs: past the horizon it goes to the retained set.
    m.on_event(0, 0, {"k": "a"}, {"id": 3})
    assert m.retained == 2 and m.buffered == 3


def test_emit_watermark_release_order() -> None:
    spec = PatternSpec.parse("SEQ(a: k == 'a', b: k == 'b') WITHIN 100 us MODE per_event EMIT watermark")
    m = UncertainPatternMatcher(spec)
    assert m.on_event(0, 0, {"k": "a"}, {"id": 1}) == []
    assert m.on_event(50, 0, {"k": "b"}, {"id": 2}) == []
    assert m.on_event(40, 0, {"k": "b"}, {"id": 3}) == []  # arrives out of order
    assert m.on_watermark(40) == []  # a match is held until all its members are below the watermark
    assert ids(m.on_watermark(41)) == [((1, 3), "Confirmed")]
    assert m.on_watermark(50) == []
    assert ids(m.on_watermark(51)) == [((1, 2), "Confirmed")]


def test_caps_are_counted() -> None:
    spec = PatternSpec(
        (Element.parse("a", "k == 'a'"), Element.parse("b", "k == 'b'")),
        10**9,
        mode="per_event",
        max_candidates=3,
        max_matches_per_event=2,
    )
    m = UncertainPatternMatcher(spec)
    for i in range(5):
        m.on_event(i, 0, {"k": "a"}, {"id": i})
    assert m.counters.candidates_dropped == 2
    got = m.on_event(100, 0, {"k": "b"}, {"id": "b"})
    assert len(got) == 2
    assert m.counters.matches_truncated == 1


def test_late_and_over_bound_events_are_counted() -> None:
    spec = PatternSpec.parse("SEQ(a: k == 'a') WITHIN 1 s MODE per_event MAX_UNCERTAINTY 10 us")
    m = UncertainPatternMatcher(spec)
    m.on_watermark(1000)
    assert ids(m.on_event(500, 50, {"k": "a"}, {"id": 1})) == [((1,), "Confirmed")]
    assert (m.counters.late_events, m.counters.over_bound) == (1, 1)


def test_snapshot_round_trip() -> None:
    spec = PatternSpec.parse(GOAL)
    m = UncertainPatternMatcher(spec, ta_us=100)
    m.on_event(0, 0, {"kind": "kick"}, {"id": 1, "nested": {"x": [1, 2]}})
    m.on_event(1, 0, {"kind": "kick", "also": "goal"}, {"id": 2})
    blob = m.snapshot()
    again = UncertainPatternMatcher.restore(blob)
    assert again.snapshot() == blob
    assert ids(again.on_event(500, 0, {"kind": "goal"}, {"id": 3})) == ids(
        m.on_event(500, 0, {"kind": "goal"}, {"id": 3})
    )


# ------------------------------------------------------------------------------------------------- properties


@st.composite
def true_sequences(draw: st.DrawFn) -> tuple[list[int], list[int], list[int], int]:
    """True times t1 < ... < tn inside W, uncertainties u_i, observed ts_i = t_i + d_i with |d_i| <= u_i."""
    n = draw(st.integers(1, 5))
    within = draw(st.integers(0, 5000))
    start = draw(st.integers(-(10**6), 10**6))
    steps = draw(st.lists(st.integers(1, 2000), min_size=n - 1, max_size=n - 1))
    true = [start]
    for s in steps:
        true.append(true[-1] + s)
    within = max(within, true[-1] - true[0])
    us = draw(st.lists(st.integers(0, 3000), min_size=n, max_size=n))
    observed = [t + draw(st.integers(-u, u)) for t, u in zip(true, us, strict=True)]
    return true, observed, us, within


@settings(max_examples=500)
@given(case=true_sequences())
def test_no_false_negative(case: tuple[list[int], list[int], list[int], int]) -> None:
    _true, observed, us, within = case
    assert classify(observed, [2 * u for u in us], within) in (C, U)


@settings(max_examples=300)
@given(case=true_sequences(), ta=st.integers(0, 3000))
def test_no_false_negative_thesis_mode(case: tuple[list[int], list[int], list[int], int], ta: int) -> None:
    true, _observed, _us, within = case
    # Thesis mode: every |observed - true| <= T_a / 2, i.e. |2 d| <= T_a.
    d_max = ta // 2
    observed = [t + ((-1) ** i) * d_max for i, t in enumerate(true)]
    assert classify(observed, [ta] * len(true), within) in (C, U)


@settings(max_examples=300)
@given(
    observed=st.lists(st.integers(-5000, 5000), min_size=1, max_size=4),
    data=st.data(),
    within=st.integers(0, 8000),
)
def test_confirmed_is_sound(observed: list[int], data: st.DataObject, within: int) -> None:
    """Confirmed: every true-time choice inside the intervals is strictly ordered and inside W."""
    us = data.draw(st.lists(st.integers(0, 2000), min_size=len(observed), max_size=len(observed)))
    if classify(observed, [2 * u for u in us], within) is not C:
        return
    for _ in range(20):
        true = [t + data.draw(st.integers(-u, u)) for t, u in zip(observed, us, strict=True)]
        assert all(a < b for a, b in itertools.pairwise(true))
        assert true[-1] - true[0] <= within


def brute_force(events: list[tuple[int, int, str]], spec: PatternSpec) -> set[tuple[tuple[int, ...], str]]:
    out = set()
    n = len(spec.elements)
    for combo in itertools.permutations(range(len(events)), n):
        if not all(spec.elements[p].matches({"k": events[i][2]}) for p, i in enumerate(combo)):
            continue
        conf = classify([events[i][0] for i in combo], [2 * events[i][1] for i in combo], spec.within_us)
        if conf is not None:
            out.add((combo, str(conf)))
    return out


@settings(max_examples=200, deadline=None)
@given(
    raw=st.lists(st.tuples(st.integers(0, 3000), st.integers(0, 100), st.sampled_from("abc")), max_size=12),
    n=st.integers(1, 3),
    within=st.integers(0, 800),
    jitter=st.integers(0, 100),
)
def test_matcher_equals_brute_force_with_watermarks(
    raw: list[tuple[int, int, str]], n: int, within: int, jitter: int
) -> None:
    """Skip-till-any-match over every permutation; expiry never loses a match (the stream is disordered by up to
    ``jitter`` and the watermark trails by that much)."""
    spec = PatternSpec(
        tuple(Element.parse(x, f"k == '{x}'") for x in "abc"[:n]),
        within,
        mode="per_event",
        max_uncertainty_us=100,
    )
    events = sorted(raw, key=lambda e: e[0])
    # Disorder: swap neighbours that are within ``jitter`` of each other.
    arrival = list(range(len(events)))
    for i in range(0, len(arrival) - 1, 2):
        if events[arrival[i + 1]][0] - events[arrival[i]][0] <= jitter:
            arrival[i], arrival[i + 1] = arrival[i + 1], arrival[i]
    m = UncertainPatternMatcher(spec)
    got: set[tuple[tuple[int, ...], str]] = set()
    for idx in arrival:
        ts, u, k = events[idx]
        for match in m.on_event(ts, u, {"k": k}, {"id": idx}):
            key = (tuple(e["id"] for e in match.events), str(match.confidence))
            assert key not in got
            got.add(key)
        m.on_watermark(ts - jitter)
    assert got == brute_force(events, spec)
    assert m.counters.matches == len(got)


@settings(max_examples=200, deadline=None)
@given(case=true_sequences(), mode=st.sampled_from(["thesis", "per_event"]), noise=st.lists(st.integers(0, 9000)))
def test_matcher_reports_the_true_sequence(
    case: tuple[list[int], list[int], list[int], int], mode: str, noise: list[int]
) -> None:
    """End to end: events stamped within their bound of the true time, fed in reference-time order (the gateway's
    order) among unrelated events, with a trailing watermark: the true sequence is reported."""
    true, observed, us, within = case
    n = len(true)
    ta = 2 * max(us)  # thesis mode: T_a / 2 bounds every event's error
    spec = PatternSpec(
        tuple(Element.parse(f"e{i}", f"k == {i}") for i in range(n)),
        within,
        mode=mode,  # type: ignore[arg-type]
        max_uncertainty_us=max(us),
    )
    m = UncertainPatternMatcher(spec, ta_us=ta)
    stream = [(ts, u, i) for i, (ts, u) in enumerate(zip(observed, us, strict=True))]
    stream += [(t, 0, -1) for t in noise]
    stream.sort(key=lambda e: e[0])
    reported = set()
    for ts, u, k in stream:
        for match in m.on_event(ts, u, {"k": k}, {"k": k}):
            reported.add(tuple(e["k"] for e in match.events))
        m.on_watermark(ts)
    assert tuple(range(n)) in reported


@settings(max_examples=300, deadline=None)
@given(
    raw=st.lists(
        st.tuples(st.integers(0, 3000), st.integers(0, 100), st.sampled_from("abc"), st.integers(0, 1500)),
        max_size=12,
    ),
    n=st.integers(1, 3),
    within=st.integers(0, 800),
    lag=st.integers(0, 100),
    allowed=st.integers(0, 1500),
    emit=st.sampled_from(["eager", "watermark"]),
    cut=st.floats(0, 1),
    ta=st.one_of(st.none(), st.integers(0, 200)),
)
def test_late_events_within_allowed_lateness_match_exactly(
    raw: list[tuple[int, int, str, int]],
    n: int,
    within: int,
    lag: int,
    allowed: int,
    emit: str,
    cut: float,
    ta: int | None,
) -> None:
    """Events arrive after random delays while the watermark trails the largest timestamp by ``lag``, so some are
    late and some too late.  The union of everything emitted equals brute force over the events that were not too
    late; a match is flagged late exactly when its last-arriving member was late (and names that member's element);
    too-late events are reported exactly.  A snapshot/restore at a random point changes nothing.  ``ta``: thesis
    mode with that T_a for every event, else per-event uncertainties."""
    spec = PatternSpec(
        tuple(Element.parse(x, f"k == '{x}'") for x in "abc"[:n]),
        within,
        mode="per_event" if ta is None else "thesis",
        max_uncertainty_us=100,
        emit=emit,  # type: ignore[arg-type]
    )

    def width2(i: int) -> int:
        return 2 * raw[i][1] if ta is None else ta

    order = sorted(range(len(raw)), key=lambda i: (raw[i][0] + raw[i][3], i))
    # Ground truth of each arrival's lateness, from the watermark the matcher was given before it.
    lateness: dict[int, str] = {}
    wm: int | None = None
    for idx in order:
        ts = raw[idx][0]
        lateness[idx] = ("on_time" if wm is None or ts >= wm else "late" if ts >= wm - allowed else "too_late")
        wm = ts - lag if wm is None else max(wm, ts - lag)
    kept = [i for i in order if lateness[i] != "too_late"]
    arrival_pos = {idx: p for p, idx in enumerate(order)}
    expected: dict[tuple[tuple[int, ...], str], str | None] = {}
    for combo in itertools.permutations(kept, n):
        if any(raw[i][2] != spec.elements[p].name for p, i in enumerate(combo)):
            continue
        conf = classify([raw[i][0] for i in combo], [width2(i) for i in combo], within)
        if conf is None:
            continue
        last = max(range(n), key=lambda p: arrival_pos[combo[p]])
        expected[(combo, str(conf))] = spec.elements[last].name if lateness[combo[last]] == "late" else None

    m = UncertainPatternMatcher(spec, ta_us=ta or 0, allowed_lateness_us=allowed)
    got: dict[tuple[tuple[int, ...], str], str | None] = {}

    def collect(matches: list[PatternMatch]) -> None:
        for match in matches:
            key = (tuple(e["id"] for e in match.events), str(match.confidence))
            assert key not in got
            assert match.late == (match.late_element is not None)
            got[key] = match.late_element

    split = int(cut * len(order))
    for pos, idx in enumerate(order):
        if pos == split:
            m = UncertainPatternMatcher.restore(m.snapshot())
        ts, u, k, _ = raw[idx]
        collect(m.on_event(ts, u, {"k": k}, {"id": idx}))
        assert m.last_lateness == lateness[idx]
        collect(m.on_watermark(ts - lag))
    collect(m.on_watermark(10**9))
    assert got == expected
    assert m.counters.too_late == len(order) - len(kept)
    assert m.counters.late_matches == sum(1 for v in expected.values() if v is not None)


def test_version_1_snapshot_restores() -> None:
    """A snapshot written before the allowed lateness (version 1: nine counters, no retained set) restores."""
    spec = PatternSpec.parse("SEQ(a: k == 'a', b: k == 'b') WITHIN 100 us MODE per_event MAX_UNCERTAINTY 0 us")
    m = UncertainPatternMatcher(spec)
    m.on_event(0, 0, {"k": "a"}, {"id": 1})
    state = msgpack.unpackb(m.snapshot(), raw=False)
    state["v"] = 1
    del state["retained"], state["allowed_lateness_us"]
    state["counters"] = state["counters"][:9]
    old = UncertainPatternMatcher.restore(msgpack.packb(state, use_bin_type=True))
    assert (old.allowed_lateness_us, old.retained, old.counters.events) == (3_600_000_000, 0, 1)
    assert ids(old.on_event(50, 0, {"k": "b"}, {"id": 2})) == [((1, 2), "Confirmed")]


def test_every_match_past_the_per_event_cap_is_counted_exactly() -> None:
    # Issue 25 item 3: 1,200 `a` then one `b` complete 1,200 matches; the default cap reports 1,000 and the other
    # 200 must be counted (per event and in total), not lost behind a single "truncated once".
    spec = PatternSpec.parse("SEQ(a: k == 'a', b: k == 'b') WITHIN 1 h MODE per_event")
    assert spec.max_matches_per_event == 1_000
    m = UncertainPatternMatcher(spec)
    for i in range(1_200):
        assert m.on_event(i, 0, {"k": "a"}, {"id": i}) == []
        assert m.last_truncated == 0
    got = m.on_event(5_000, 0, {"k": "b"}, {"id": "b"})
    assert len(got) == 1_000
    assert m.last_truncated == 200
    assert (m.counters.matches, m.counters.matches_truncated) == (1_000, 200)
    # A second `b` truncates as many again; the counter adds up, the per-event figure does not carry over.
    assert len(m.on_event(5_001, 0, {"k": "b"}, {"id": "b2"})) == 1_000
    assert (m.last_truncated, m.counters.matches_truncated) == (200, 400)
    assert UncertainPatternMatcher.restore(m.snapshot()).counters.matches_truncated == 400


def test_candidates_dropped_by_the_cap_are_said_per_event() -> None:
    spec = PatternSpec(
        (Element.parse("a", "k == 'a'"), Element.parse("b", "k == 'b'")), 10**9, mode="per_event", max_candidates=3)
    m = UncertainPatternMatcher(spec)
    dropped = []
    for i in range(5):
        m.on_event(i, 0, {"k": "a"}, {"id": i})
        dropped.append(m.last_candidates_dropped)
    assert dropped == [0, 0, 0, 1, 1]
    assert m.counters.candidates_dropped == 2


def test_matching_leaves_no_garbage_cycles() -> None:
    """The pattern job runs a group with the cyclic collector off and collects after it: an event must not leave
    cycles behind (the search's self-referencing closure left one per event that took an element)."""
    spec = PatternSpec.parse("SEQ(a: k == 'a', b: k == 'b') WITHIN 10 ms MODE per_event MAX_UNCERTAINTY 1 ms")
    matcher = UncertainPatternMatcher(spec)
    gc.collect()
    gc.disable()
    try:
        found = [matcher.on_event(i * 100, 50, {"k": "ab"[i % 2]}, {"i": i}) for i in range(200)]
        matcher.on_watermark(30_000)
        unreachable = gc.collect()
    finally:
        gc.enable()
    assert sum(map(len, found)) > 0  # the search ran
    assert unreachable == 0
