"""ThreeWindowAggregator: release rules, FinalResult averaging, late events, snapshots (w = 1000 us)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cep.three_window import FinalResult, LateEvent, ThreeWindowAggregator, WindowResult, combine_final
from cep.windows import WindowType, assign_sliding

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


# ---------------------------------------------------------------- corrections (late data within allowed lateness)


def test_late_events_correct_a_released_start_once_per_advance_until_allowed_lateness() -> None:
    agg = thesis(allowed_lateness_us=2000)  # s = 100: every slot of t closes at t + 1100
    agg.add(500, 1.0, 0)  # LOW 0, MIDDLE 0, HIGH 0
    first = agg.advance(1100)
    assert [(r.count, r.revision) for r in first] == [(1, 0), (1, 0), (1, 0), (1, 0)]
    assert agg.add(700, 5.0, 0) == []  # behind the watermark: LOW 0, MIDDLE 0, HIGH 0 corrected
    assert agg.add(950, 3.0, 0) == []  # LOW probe 1050 -> LOW 1000 (open); MIDDLE 0 and HIGH 0 corrected
    out = agg.advance(1100)  # same watermark: only the two coalesced corrections come out
    low = WindowResult(L, 0, -100, 900, 2, 6.0, 1.0, 5.0, 3.0, 2, 100, revision=1)
    mid = WindowResult(M, 0, 0, 1000, 3, 9.0, 1.0, 5.0, 3.0, 3, 100, revision=1)
    high = WindowResult(H, 0, 100, 1100, 3, 9.0, 1.0, 5.0, 3.0, 3, 100, revision=1)
    final = combine_final(0, 1000, {L: low, M: mid, H: high}, revision=1)
    assert out == [low, mid, high, final]
    assert (final.window_counts, final.revision, final.to_dict()["revision"]) == ((2, 3, 3), 1, 1)
    assert (agg.corrected_slots, agg.corrections) == (5, 3)
    assert agg.next_release_us() == 2100  # LOW 1000
    assert agg.add(600, 2.0, 0) == []  # MIDDLE 0 and HIGH 0 again (LOW probe 700 -> LOW 0 again too)
    assert agg.next_release_us() == 1100  # a correction waits: any advance emits it
    out = agg.advance(1200)
    assert [
        (str(r.window_type), r.nominal_start_us, r.count, r.revision) for r in out if isinstance(r, WindowResult)
    ] == [
        ("LOW", 0, 3, 2),
        ("MIDDLE", 0, 4, 2),
        ("HIGH", 0, 4, 2),
    ]
    assert [(f.window_counts, f.revision) for f in finals(out)] == [((3, 4, 4), 2)]
    assert agg.advance(1200) == []  # corrections come out once
    # Close time 1100 + lateness 2000: still correctable at W = 3099, too late from W = 3100.
    assert windows(agg.advance(3099)) == [("LOW", 1000, 1), ("MIDDLE", 1000, 0), ("HIGH", 1000, 0)]
    late = agg.add(1, None, 0)  # LOW 0 and MIDDLE 0 corrected; HIGH probe -99 -> HIGH -1000, closed at 100: too late
    assert [(e.window_type, e.nominal_start_us, e.reason) for e in late] == [(H, -1000, "too_late")]
    out = agg.advance(3100)
    assert [(type(r).__name__, r.nominal_start_us, r.count, r.revision) for r in out] == [
        ("WindowResult", 0, 4, 3),
        ("WindowResult", 0, 5, 3),
        ("FinalResult", 0, (4 + 5 + 4) / 3, 3),
    ]
    assert agg.retained_starts == 1  # 0 is forgotten at W = 3100 (0 + 1100 + 2000 <= W); 1000 is kept
    late = agg.add(2, 4.0, 0)
    assert [(e.window_type, e.nominal_start_us, e.reason) for e in late] == [
        (L, 0, "too_late"),
        (M, 0, "too_late"),
        (H, -1000, "too_late"),
    ]
    assert (agg.late_events, agg.late_slots, agg.events) == (2, 4, 6)


def test_a_late_event_in_a_start_released_empty_is_its_first_release() -> None:
    agg = thesis(allowed_lateness_us=10_000)
    agg.add(500, 1.0, 0)
    assert [r.nominal_start_us for r in agg.advance(5100)] == [0, 0, 0, 0]  # 1000 .. 3000 untouched: no output
    assert agg.add(2500, 7.0, 0) == []  # LOW 2000, MIDDLE 2000, HIGH 2000: released empty, still correctable
    out = agg.advance(5100)
    low = WindowResult(L, 2000, 1900, 2900, 1, 7.0, 7.0, 7.0, 7.0, 1, 100)
    mid = WindowResult(M, 2000, 2000, 3000, 1, 7.0, 7.0, 7.0, 7.0, 1, 100)
    high = WindowResult(H, 2000, 2100, 3100, 1, 7.0, 7.0, 7.0, 7.0, 1, 100)
    assert out == [low, mid, high, combine_final(2000, 1000, {L: low, M: mid, H: high})]
    assert agg.add(2990, None, 0) == []  # LOW probe 3090 -> LOW 3000: its MIDDLE and HIGH come out empty with it
    assert windows(agg.advance(5100)) == [("MIDDLE", 2000, 2), ("HIGH", 2000, 2), ("LOW", 3000, 1),
                                          ("MIDDLE", 3000, 0), ("HIGH", 3000, 0)]  # fmt: skip


def test_emit_early_correction_before_the_final_is_in_the_first_final() -> None:
    agg = thesis(emit_early=True)
    agg.add(100, 1.0, 0)
    assert windows(agg.advance(950)) == [("LOW", 0, 1)]  # LOW 0 closes at 900
    agg.add(10, 2.0, 0)  # LOW probe 110 -> LOW 0, released: corrected; MIDDLE 0, HIGH -1000 open
    out = agg.advance(1100)
    assert [
        (str(r.window_type), r.nominal_start_us, r.count, r.revision) for r in out if isinstance(r, WindowResult)
    ] == [
        ("LOW", -1000, 0, 0),
        ("MIDDLE", -1000, 0, 0),
        ("HIGH", -1000, 1, 0),
        ("LOW", 0, 2, 1),
        ("MIDDLE", 0, 2, 0),
        ("HIGH", 0, 1, 0),
    ]
    assert [(f.nominal_start_us, f.window_counts, f.revision) for f in finals(out)] == [
        (-1000, (0, 0, 1), 0),
        (0, (2, 2, 1), 0),
    ]


def test_restore_of_a_version_1_snapshot_keeps_its_pending_slots_correctable() -> None:
    import msgpack

    # thesis(emit_early=True) fed feed_example, advanced to 100 and 950, as the version 1 code stored it.
    v1 = {
        "v": 1, "width_us": 1000, "slide_us": None, "emit_early": True, "shift_mode": "thesis",
        "max_shift_us": 0, "origin_us": 0, "ta_us": 200, "watermark_us": 950,
        "open": [["MIDDLE", 0, 2, 2, 3.0, 1.0, 2.0, 100], ["LOW", 1000, 2, 2, 5.0, 2.0, 3.0, 100],
                 ["HIGH", 0, 2, 2, 5.0, 2.0, 3.0, 100], ["MIDDLE", 1000, 2, 1, 3.0, 3.0, 3.0, 100],
                 ["LOW", 2000, 1, 0, 0.0, None, None, 100], ["HIGH", 1000, 1, 0, 0.0, None, None, 100]],
        "frontier": [50, -50, -150],
        "pending": [[0, [["LOW", 0, -100, 900, 1, 1.0, 1.0, 1.0, 1.0, 1, 100]]]],
        "outbox": [],
        "counters": [4, 0, 0],
    }  # fmt: skip
    fresh = thesis(emit_early=True)
    feed_example(fresh)
    fresh.advance(100)
    fresh.advance(950)
    assert ThreeWindowAggregator.restore(msgpack.packb(v1)).advance(5000) == fresh.advance(5000)
    restored = ThreeWindowAggregator.restore(msgpack.packb(v1))
    assert restored.events == 4
    # LOW 0 (pending in version 1) is corrected; the start -1000 was finalized before: not in the blob, too late.
    late = restored.add(-50, 8.0, 0)
    assert [(e.window_type, e.nominal_start_us, e.reason) for e in late] == [
        (M, -1000, "too_late"),
        (H, -1000, "too_late"),
    ]
    assert restored.advance(950) == [WindowResult(L, 0, -100, 900, 2, 9.0, 1.0, 8.0, 4.5, 2, 100, revision=1)]
    out = restored.advance(1100)
    assert windows(out) == [("MIDDLE", 0, 2), ("HIGH", 0, 2)]
    assert [(f.window_counts, f.revision) for f in finals(out)] == [((2, 2, 2), 0)]


# ---------------------------------------------------------------- corrections against a brute-force reference

Op = tuple[int, float | None, int] | int  # an event (ts, value, uncertainty) or an advance(watermark)
Batch = list[WindowResult | FinalResult] | list[LateEvent]

event_op = st.tuples(
    st.integers(-4_000, 800),
    st.one_of(st.none(), st.floats(-1e6, 1e6, allow_nan=False)),
    st.integers(0, 600),  # above max_shift_us = 400 too: slots released before the event's shift was seen
)


def _relative_to_the_newest(ops: list[Op]) -> list[Op]:
    """Ops are generated relative to the newest event so far: an event's ts as an offset from it (a negative one
    is out of order), an advance as the watermark's lag behind it.  The stream moves forward, with events both
    in front of the watermark and behind it (late), by less or more than the allowed lateness."""
    newest = 0
    out: list[Op] = []
    for op in ops:
        if isinstance(op, int):
            # Even lags snap to a multiple of 50 us, like every width, shift and lateness here: boundaries get hit.
            out.append(newest - op if op % 2 else (newest - op) // 50 * 50)
        else:
            ts = newest + op[0]
            newest = max(newest, ts)
            out.append((ts, op[1], op[2]))
    return out


# Three events per advance on average.
ops_strategy = st.lists(
    st.one_of(event_op, event_op, event_op, st.integers(-300, 2_000)), min_size=15, max_size=80
).map(_relative_to_the_newest)


def run_ops(make: Callable[[], ThreeWindowAggregator], ops: list[Op], split: int | None = None) -> list[Batch]:
    """Every call's output in call order; ``split``: snapshot and restore before that op."""
    agg = make()
    batches: list[Batch] = []
    for i, op in enumerate(ops):
        if i == split:
            blob = agg.snapshot()
            agg = ThreeWindowAggregator.restore(blob)
            assert agg.snapshot() == blob  # every field round-trips
        if isinstance(op, int):
            batches.append(agg.advance(op))
            step = agg.slide_us or agg.width_us
            assert agg.retained_starts <= agg.allowed_lateness_us // step + 1  # bounded by allowed lateness
        else:
            batches.append(agg.add(*op))
    batches.append(agg.flush())
    return batches


def brute_force(
    agg: ThreeWindowAggregator, ops: list[Op]
) -> tuple[list[LateEvent], dict[tuple[WindowType, int], WindowResult]]:
    """The too-late slots (close time + allowed lateness <= the watermark at the event's arrival) and every slot's
    aggregate over all the other events, in arrival order, recomputed from scratch (revisions left at 0)."""
    w, lateness = agg.width_us, agg.allowed_lateness_us
    thesis_mode = agg.shift_mode == "thesis"
    s = (agg.ta_us + 1) // 2
    own_offset = {L: -s, M: 0, H: s} if thesis_mode else {L: 0, M: 0, H: agg.max_shift_us}
    close_offset = own_offset if agg.emit_early else dict.fromkeys((L, M, H), own_offset[H])
    wm: int | None = None
    too_late: list[LateEvent] = []
    members: dict[tuple[WindowType, int], list[tuple[float | None, int]]] = {}
    for op in ops:
        if isinstance(op, int):
            wm = op if wm is None else max(wm, op)
            continue
        ts, value, unc = op
        shift = s if thesis_mode else unc
        for slot in assign_sliding(ts, w, agg.slide_us or w, shift):
            k, t = slot.window_type, slot.nominal_start_us
            if wm is not None and t + w + close_offset[k] + lateness <= wm:
                too_late.append(LateEvent(ts, value, unc, shift, k, t, "too_late"))
            else:
                members.setdefault((k, t), []).append((value, shift))
    truth = {}
    for (k, t), got in members.items():
        values = [v for v, _ in got if v is not None]
        total = 0.0
        for v in values:
            total += v  # the aggregator's own summation order: arrival
        shift = max(sh for _, sh in got)
        start = t + {L: -shift, M: 0, H: shift}[k]
        avg = total / len(values) if values else None
        low, high = (min(values), max(values)) if values else (None, None)
        truth[k, t] = WindowResult(k, t, start, start + w, len(got), total, low, high, avg, len(values), shift)
    return too_late, truth


@settings(max_examples=300, deadline=None)
@given(
    ops=ops_strategy,
    emit_early=st.booleans(),
    mode=st.sampled_from(["thesis", "per_event"]),
    slide=st.sampled_from([None, 500]),
    lateness=st.sampled_from([0, 700, 2_500, 100_000]),
    split_at=st.floats(0, 1),
)
def test_corrections_converge_to_a_brute_force_recomputation(
    ops: list[Op], emit_early: bool, mode: str, slide: int | None, lateness: int, split_at: float
) -> None:
    def make() -> ThreeWindowAggregator:
        return ThreeWindowAggregator(
            1000,
            slide_us=slide,
            emit_early=emit_early,
            shift_mode=mode,  # type: ignore[arg-type]
            max_shift_us=400,
            ta_us=300,
            allowed_lateness_us=lateness,
        )

    batches = run_ops(make, ops)
    assert run_ops(make, ops, split=int(split_at * len(ops))) == batches  # snapshot/restore is transparent
    expected_late, truth = brute_force(make(), ops)
    assert [e for b in batches for e in b if isinstance(e, LateEvent)] == expected_late

    empty_shift = 150 if mode == "thesis" else 400
    latest: dict[tuple[WindowType, int], WindowResult] = {}
    final_revisions: dict[int, int] = {}
    last_final: dict[int, FinalResult] = {}
    for batch in batches:
        keys = [(r.window_type, r.nominal_start_us) for r in batch if isinstance(r, WindowResult)]
        assert len(keys) == len(set(keys))  # late events between two advances: one correction per slot
        for r in batch:
            if isinstance(r, WindowResult):
                key = (r.window_type, r.nominal_start_us)
                assert r.revision == (latest[key].revision + 1 if key in latest else 0)  # 0, 1, 2, ... no gaps
                latest[key] = r
            elif isinstance(r, FinalResult):
                t = r.nominal_start_us
                assert r.revision == final_revisions.get(t, -1) + 1
                final_revisions[t] = r.revision
                last_final[t] = r
                # Recomputed from the latest three slot results, whichever batch they came out in.
                assert r == combine_final(t, 1000, {k: latest[k, t] for k in (L, M, H)}, r.revision)
    # Every slot an accepted event fell in came out, and its last revision is the brute-force aggregate.
    assert truth.keys() <= latest.keys()
    for key, last in latest.items():
        k, t = key
        expected = truth.get(key)
        if expected is None:  # released empty; no accepted event ever landed in it
            start = t + {L: -empty_shift, M: 0, H: empty_shift}[k]
            expected = WindowResult(k, t, start, start + 1000, 0, 0.0, None, None, None, 0, empty_shift)
        assert last == replace(expected, revision=last.revision)
    # Every start with a window has a final after flush(), the last one over the final truth of its three slots.
    assert final_revisions.keys() == {t for _k, t in latest}
    for t, final in last_final.items():
        assert final == combine_final(t, 1000, {k: latest[k, t] for k in (L, M, H)}, final.revision)
