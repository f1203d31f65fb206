"""ThreeWindowAggregator: release rules, FinalResult averaging, late events, snapshots (w = 1000 us)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cep.three_window import FinalResult, LateEvent, ThreeWindowAggregator, WindowResult, combine_final
from cep.windows import WindowType

L, M, H = WindowType.LOW, WindowType.MIDDLE, WindowType.HIGH


def windows(out: list[WindowResult | FinalResult]) -> list[tuple[str, int, int]]:
    return [(str(r.window_type), r.nominal_start_us, r.count) for r in out if isinstance(r, WindowResult)]


def finals(out: list[WindowResult | FinalResult]) -> list[FinalResult]:
    return [r for r in out if isinstance(r, FinalResult)]


def thesis(**kw: object) -> ThreeWindowAggregator:
    return ThreeWindowAggregator(1000, shift_mode="thesis", ta_us=200, **kw)  # type: ignore[arg-type]


def feed_example(agg: ThreeWindowAggregator) -> None:
    # s = 100.  50 -> LOW 0, MIDDLE 0, HIGH -1000; 950 -> LOW 1000, MIDDLE 0, HIGH 0;
    # 1050 -> LOW 1000, MIDDLE 1000, HIGH 0; 1950 (no value) -> LOW 2000, MIDDLE 1000, HIGH 1000.
    for ts, v in ((50, 1.0), (950, 2.0), (1050, 3.0), (1950, None)):
        assert agg.add(ts, v, 0) == []


def test_thesis_mode_releases_all_three_together_at_t_plus_s_plus_w() -> None:
    agg = thesis()
    feed_example(agg)
    # Nominal start -1000 completes at -1000 + 100 + 1000 = 100.
    assert windows(agg.advance(99)) == []
    out = agg.advance(100)
    assert windows(out) == [("LOW", -1000, 0), ("MIDDLE", -1000, 0), ("HIGH", -1000, 1)]
    assert agg.advance(1099) == []
    out = agg.advance(1100)
    assert windows(out) == [("LOW", 0, 1), ("MIDDLE", 0, 2), ("HIGH", 0, 2)]
    low, mid, high = (r for r in out if isinstance(r, WindowResult))
    assert (low.start_us, low.end_us, mid.start_us, high.start_us, high.end_us) == (-100, 900, 0, 100, 1100)
    assert (low.avg, mid.avg, high.avg) == (1.0, 1.5, 2.5)
    (final,) = finals(out)
    assert final.window_counts == (1, 2, 2)
    assert final.count == pytest.approx(5 / 3)
    assert final.sum == pytest.approx((1 + 3 + 5) / 3)
    assert final.avg == pytest.approx((1.0 + 1.5 + 2.5) / 3)
    assert final.min == pytest.approx((1 + 1 + 2) / 3)
    assert final.max == pytest.approx((1 + 2 + 3) / 3)
    assert (final.nominal_start_us, final.end_us) == (0, 1000)
    # Nominal start 1000: the value-less event is counted but not aggregated.
    out = agg.advance(2100)
    high = next(r for r in out if isinstance(r, WindowResult) and r.window_type is H)
    assert (high.count, high.value_count, high.avg, high.min) == (1, 0, None, None)
    (final,) = finals(out)
    assert final.types_with_values == 2
    assert final.avg == pytest.approx((2.5 + 3.0) / 2)


def test_emit_early_releases_each_type_at_its_own_end() -> None:
    agg = thesis(emit_early=True)
    feed_example(agg)
    agg.advance(100)  # nominal -1000 done
    assert windows(agg.advance(899)) == []
    assert windows(agg.advance(900)) == [("LOW", 0, 1)]  # t - s + w
    assert windows(agg.advance(999)) == []
    assert windows(agg.advance(1000)) == [("MIDDLE", 0, 2)]  # t + w
    out = agg.advance(1100)  # t + s + w
    assert windows(out) == [("HIGH", 0, 2)]
    assert finals(out)[0].window_counts == (1, 2, 2)


def test_per_event_mode_waits_for_the_shift_bound() -> None:
    agg = ThreeWindowAggregator(1000, emit_early=True, max_shift_us=300)
    agg.add(500, 1.0, 50)  # s = 50: LOW 0 ([-50, 950)), MIDDLE 0, HIGH 0 ([50, 1050))
    agg.add(990, 2.0, 20)  # s = 20: LOW 1000, MIDDLE 0, HIGH 0
    # LOW and MIDDLE close at t + w (an event with s = 0 could still land in LOW 0 until then).
    assert windows(agg.advance(999)) == []
    assert windows(agg.advance(1000)) == [("LOW", 0, 1), ("MIDDLE", 0, 2)]
    # HIGH waits for t + w + max_shift.
    assert windows(agg.advance(1299)) == []
    out = agg.advance(1300)
    assert windows(out) == [("HIGH", 0, 2)]
    high = next(r for r in out if isinstance(r, WindowResult))
    assert (high.shift_us, high.start_us, high.end_us) == (50, 50, 1050)  # placed with the largest member shift


def test_per_event_mode_needs_a_bound() -> None:
    with pytest.raises(ValueError, match="max_shift_us"):
        ThreeWindowAggregator(1000)


def test_without_allowed_lateness_every_late_slot_is_returned_and_counted_never_dropped_silently() -> None:
    agg = thesis(allowed_lateness_us=0)
    agg.add(500, 1.0, 0)
    agg.advance(1100)
    late = agg.add(700, 5.0, 0)
    assert [(e.window_type, e.nominal_start_us, e.reason) for e in late] == [
        (L, 0, "too_late"),
        (M, 0, "too_late"),
        (H, 0, "too_late"),
    ]
    assert (agg.late_events, agg.late_slots, agg.events, agg.corrected_slots) == (1, 3, 2, 0)
    assert late[0].to_dict()["window_type"] == "LOW"
    assert agg.advance(1200) == []  # nothing to correct
    assert agg.retained_starts == 0  # lateness 0: nothing is kept once released


def test_partly_late_event_still_enters_its_open_slots() -> None:
    agg = thesis(emit_early=True, allowed_lateness_us=0)
    agg.add(100, 1.0, 0)
    agg.advance(950)  # LOW of 0 released (900); MIDDLE (1000) and HIGH (1100) still open
    late = agg.add(920, 2.0, 0)  # LOW probe 1020 -> LOW 1000 (open); MIDDLE 0 open; HIGH 0 open
    assert late == []
    late = agg.add(940, 4.0, 0)
    assert late == []
    late = agg.add(-50, 8.0, 0)  # LOW probe 50 -> LOW 0 released; MIDDLE -1000 released; HIGH -1000 released
    assert {e.window_type for e in late} == {L, M, H}
    out = agg.advance(1100)
    assert windows(out) == [("MIDDLE", 0, 3), ("HIGH", 0, 3)]


def test_shift_beyond_bound_past_allowed_lateness_is_too_late() -> None:
    agg = ThreeWindowAggregator(1000, emit_early=True, max_shift_us=100, allowed_lateness_us=0)
    agg.add(100, 1.0, 0)
    agg.advance(1100)  # everything of 0 released, HIGH included (0 + 1000 + 100)
    late = agg.add(1150, 1.0, 200)  # not behind the watermark, but s = 200 > bound: HIGH probe 950 -> HIGH 0
    assert [(e.window_type, e.nominal_start_us, e.reason) for e in late] == [(H, 0, "too_late")]


def test_shift_beyond_bound_within_allowed_lateness_corrects_the_slot() -> None:
    agg = ThreeWindowAggregator(1000, emit_early=True, max_shift_us=100)
    agg.add(100, 1.0, 0)
    agg.advance(1100)
    assert agg.add(1150, 3.0, 200) == []  # HIGH probe 950 -> HIGH 0 (released): corrected
    out = agg.advance(1100)
    # The corrected HIGH window is placed with its largest member shift, 200: [200, 1200).
    assert out == [
        WindowResult(H, 0, 200, 1200, 2, 4.0, 1.0, 3.0, 2.0, 2, 200, revision=1),
        combine_final(
            0,
            1000,
            {
                L: WindowResult(L, 0, 0, 1000, 1, 1.0, 1.0, 1.0, 1.0, 1, 0),
                M: WindowResult(M, 0, 0, 1000, 1, 1.0, 1.0, 1.0, 1.0, 1, 0),
                H: WindowResult(H, 0, 200, 1200, 2, 4.0, 1.0, 3.0, 2.0, 2, 200),
            },
            revision=1,
        ),
    ]


def test_type_released_empty_before_any_event_gets_an_empty_result() -> None:
    agg = thesis(emit_early=True)
    agg.add(-500, 1.0, 0)  # keeps the stream going in the previous window
    agg.advance(950)  # LOW of 0 closes at 900, nobody was in it
    assert agg.add(960, 2.0, 0) == []  # MIDDLE 0, HIGH 0, LOW 1000
    out = agg.advance(1100)
    assert windows(out) == [("LOW", 0, 0), ("MIDDLE", 0, 1), ("HIGH", 0, 1)]
    assert finals(out)[0].window_counts == (0, 1, 1)


def test_thesis_shift_rounds_up_and_follows_ta() -> None:
    agg = ThreeWindowAggregator(1000, shift_mode="thesis")
    assert agg.thesis_shift_us == 0
    agg.set_ta_us(201)
    assert agg.thesis_shift_us == 101
    with pytest.raises(ValueError, match="T_a"):
        agg.set_ta_us(-1)


def test_sliding_counts_each_event_in_every_window() -> None:
    agg = ThreeWindowAggregator(1000, slide_us=500, shift_mode="thesis", ta_us=200)
    agg.add(1000, 1.0, 0)
    out = agg.flush()
    assert windows(out) == [
        ("LOW", 0, 0),
        ("MIDDLE", 0, 0),
        ("HIGH", 0, 1),
        ("LOW", 500, 1),
        ("MIDDLE", 500, 1),
        ("HIGH", 500, 1),
        ("LOW", 1000, 1),
        ("MIDDLE", 1000, 1),
        ("HIGH", 1000, 0),
    ]
    assert len(finals(out)) == 3


def test_combine_final_with_missing_types() -> None:
    only_mid = WindowResult(M, 0, 0, 1000, 4, 8.0, 1.0, 3.0, 2.0, 4, 0)
    final = combine_final(0, 1000, {M: only_mid})
    assert (final.count, final.sum, final.avg, final.min, final.max) == (4 / 3, 8 / 3, 2.0, 1.0, 3.0)
    assert final.to_dict()["window_counts"] == [0, 4, 0]
    assert combine_final(0, 1000, {}).avg is None


def _stream(seed_events: list[tuple[int, float | None, int]]) -> list[tuple[int, float | None, int]]:
    return sorted(seed_events, key=lambda e: e[0])


events_strategy = st.lists(
    st.tuples(
        st.integers(0, 20_000),
        st.one_of(st.none(), st.floats(-1e6, 1e6, allow_nan=False)),
        st.integers(0, 400),
    ),
    max_size=60,
).map(_stream)


def run(
    agg: ThreeWindowAggregator, events: list[tuple[int, float | None, int]], split: int | None = None
) -> list[WindowResult | FinalResult | LateEvent]:
    out: list[WindowResult | FinalResult | LateEvent] = []
    for i, (ts, v, u) in enumerate(events):
        if split is not None and i == split:
            agg = ThreeWindowAggregator.restore(agg.snapshot())
        out.extend(agg.add(ts, v, u))
        if i % 5 == 4:
            out.extend(agg.advance(ts - 300))  # watermark trails the stream
    out.extend(agg.flush())
    return out


@settings(max_examples=150, deadline=None)
@given(events=events_strategy, emit_early=st.booleans(), mode=st.sampled_from(["thesis", "per_event"]))
def test_every_event_lands_once_per_type_and_snapshot_is_transparent(
    events: list[tuple[int, float | None, int]], emit_early: bool, mode: str
) -> None:
    def make() -> ThreeWindowAggregator:
        return ThreeWindowAggregator(
            1000,
            emit_early=emit_early,
            shift_mode=mode,  # type: ignore[arg-type]
            max_shift_us=400,
            ta_us=300,
        )

    out = run(make(), events)
    assert run(make(), events, split=len(events) // 2) == out
    late = [r for r in out if isinstance(r, LateEvent)]
    assert late == []  # the watermark trails by 300 >= every shift the per-type rules wait for
    for wt in (L, M, H):
        assert sum(r.count for r in out if isinstance(r, WindowResult) and r.window_type is wt) == len(events)
    keys = [(r.window_type, r.nominal_start_us) for r in out if isinstance(r, WindowResult)]
    assert len(keys) == len(set(keys))  # every slot released once
    assert len(keys) == 3 * len([r for r in out if isinstance(r, FinalResult)])  # each final sees three windows


@settings(max_examples=50, deadline=None)
@given(events=events_strategy)
def test_add_many_equals_add(events: list[tuple[int, float | None, int]]) -> None:
    a = ThreeWindowAggregator(700, max_shift_us=400)
    b = ThreeWindowAggregator(700, max_shift_us=400)
    for ts, v, u in events:
        a.add(ts, v, u)
    b.add_many([e[0] for e in events], [e[1] for e in events], [e[2] for e in events])
    assert a.snapshot() == b.snapshot()


def test_zero_shift_equals_a_plain_tumbling_window() -> None:
    agg = ThreeWindowAggregator(1000, shift_mode="thesis")
    for ts in (0, 10, 999, 1000, 2500):
        agg.add(ts, float(ts), 0)
    out = finals(agg.flush())
    assert [(f.nominal_start_us, f.count, f.sum) for f in out] == [(0, 3, 1009.0), (1000, 1, 1000.0), (2000, 1, 2500.0)]


def test_snapshot_round_trip_is_exact() -> None:
    agg = thesis(emit_early=True)
    feed_example(agg)
    agg.advance(950)
    blob = agg.snapshot()
    again = ThreeWindowAggregator.restore(blob)
    assert again.snapshot() == blob
    assert again.advance(5000) == agg.advance(5000)
    with pytest.raises(ValueError, match="version"):
        import msgpack

        ThreeWindowAggregator.restore(msgpack.packb({"v": 99}))
