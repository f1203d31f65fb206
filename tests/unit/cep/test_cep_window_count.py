"""TumblingWindowCounter: release by watermark, corrections within allowed lateness, too-late events, snapshots."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cep.window_count import TooLate, TumblingWindowCounter, WindowCount

W = 1000


def test_release_corrections_and_too_late_by_hand() -> None:
    counter = TumblingWindowCounter(W, allowed_lateness_us=2000)
    assert counter.add_many([100, 900, 1500, 3200]) == []
    assert counter.next_release_us() == 1000
    assert counter.advance(999) == []
    assert counter.advance(2000) == [WindowCount(0, 1000, 2, 0), WindowCount(1000, 2000, 1, 0)]
    # Two late events for [0, 1000) and one for the empty [2000, 3000), never emitted: one record each.
    assert counter.add(50) is None
    assert counter.add(999) is None
    assert counter.next_release_us() == 2000  # corrections wait: any advance emits them
    assert counter.add_many([1999]) == []
    assert counter.advance(2500) == [WindowCount(0, 1000, 4, 1), WindowCount(1000, 2000, 2, 1)]
    assert counter.add(2100) is None  # [2000, 3000) is still open at W = 2500
    assert counter.advance(2500) == []  # corrections come out once
    assert counter.retained_windows == 2
    # [0, 1000) ends at 1000: correctable while W < 1000 + 2000.
    counter.advance(2999)
    assert counter.add(0) is None
    assert counter.advance(3000) == [WindowCount(0, 1000, 5, 2), WindowCount(2000, 3000, 1, 0)]
    assert counter.retained_windows == 2  # [0, 1000) forgotten at 3000; [1000, 2000) and [2000, 3000) kept
    assert counter.add(1) == TooLate(1, 0, "too_late")
    assert counter.add(2500) is None  # lands in [2000, 3000) (released at 3000): a correction
    assert counter.add(1200) is None  # [1000, 2000) ends at 2000: correctable until W = 4000
    assert counter.advance(3000) == [WindowCount(1000, 2000, 3, 2), WindowCount(2000, 3000, 2, 1)]
    assert (counter.events, counter.late_events, counter.corrections, counter.too_late) == (12, 6, 5, 1)
    assert counter.add(-5) == TooLate(-5, -1000)  # before the origin: floor division, window [-1000, 0)
    assert counter.advance(6000) == [WindowCount(3000, 4000, 1, 0)]  # the event at 3200
    assert counter.add(3999) == TooLate(3999, 3000)  # 4000 + 2000 <= W: past allowed lateness at once
    # [4000, 5000) had no event when W passed it, so it was never emitted: a late event gives it revision 0.
    assert counter.add(4500) is None
    assert counter.is_empty() is False
    assert counter.advance(6000) == [WindowCount(4000, 5000, 1, 0)]
    assert counter.advance(7000) == []
    assert (counter.is_empty(), counter.retained_windows, counter.next_release_us()) == (True, 0, None)


def test_without_allowed_lateness_every_late_event_is_too_late() -> None:
    counter = TumblingWindowCounter(W, origin_us=250, allowed_lateness_us=0)
    counter.add_many([250, 1249, 1250])
    assert counter.advance(1250) == [WindowCount(250, 1250, 2)]
    assert counter.add_many([300, 1300, 249]) == [TooLate(300, 250), TooLate(249, -750)]
    assert counter.flush() == [WindowCount(1250, 2250, 2)]
    assert counter.flush() == []
    assert counter.is_empty()


def test_arguments_and_snapshot_versions_are_checked() -> None:
    with pytest.raises(ValueError, match="width_us"):
        TumblingWindowCounter(0)
    with pytest.raises(ValueError, match="allowed_lateness_us"):
        TumblingWindowCounter(W, allowed_lateness_us=-1)
    with pytest.raises(ValueError, match="version"):
        TumblingWindowCounter.restore(msgpack.packb({"v": 99}))
    assert TooLate(5, 0).to_dict() == {"ts_us": 5, "window_start_us": 0, "reason": "too_late"}
    assert WindowCount(0, W, 3, 1).to_dict() == {"window_start_us": 0, "window_end_us": W, "count": 3, "revision": 1}


# ---------------------------------------------------------------- against a brute-force reference

Op = tuple[bool, int]  # (True, ts): an event; (False, watermark): an advance
Output = tuple[str, object]  # ("late", TooLate) or ("advance", list[WindowCount])
ORIGIN = -300
LATENESSES = (0, 700, 2_500, 100_000)


def _relative_to_the_newest(ops: list[Op]) -> list[Op]:
    """Ops are generated relative to the newest event so far: an event's ts as an offset from it (a negative one
    is out of order), an advance as the watermark's lag behind it (even lags snap to the grid of the windows, and
    so of every lateness here, so boundaries get hit).  The stream moves forward, with events both in front of the
    watermark and behind it, by less or more than the allowed lateness."""
    newest = 0
    out: list[Op] = []
    for is_event, x in ops:
        if is_event:
            ts = newest + x
            newest = max(newest, ts)
            out.append((True, ts))
        else:
            wm = newest - x
            out.append((False, wm if x % 2 else ORIGIN + (wm - ORIGIN) // 100 * 100))
    return out


event_op = st.tuples(st.just(True), st.integers(-4_000, 800))
advance_op = st.tuples(st.just(False), st.integers(-300, 2_000))
# Three events per advance on average.
ops_strategy = st.lists(st.one_of(event_op, event_op, event_op, advance_op), min_size=15, max_size=100).map(
    _relative_to_the_newest
)


def run_ops(lateness: int, ops: list[Op], split: int | None = None, batched: bool = False) -> list[Output]:
    """Every output in call order; ``split``: snapshot and restore before that op; ``batched``: each run of
    events goes through one add_many."""
    counter = TumblingWindowCounter(W, origin_us=ORIGIN, allowed_lateness_us=lateness)
    out: list[Output] = []
    run: list[int] = []
    for i, (is_event, x) in enumerate(ops):
        if i == split:
            blob = counter.snapshot()
            counter = TumblingWindowCounter.restore(blob)
            assert counter.snapshot() == blob  # every field round-trips
        if is_event and batched:
            run.append(x)
            continue
        if run:
            out.extend(("late", late) for late in counter.add_many(run))
            run = []
        if is_event:
            got = counter.add(x)
            if got is not None:
                out.append(("late", got))
        else:
            out.append(("advance", counter.advance(x)))
            assert counter.retained_windows <= lateness // W + 1  # bounded by allowed lateness
    out.extend(("late", late) for late in counter.add_many(run))
    out.append(("advance", counter.flush()))
    assert counter.is_empty() == (lateness == 0 or not ops)  # flushed: only correctable windows stay
    return out


@settings(max_examples=400, deadline=None)
@given(ops=ops_strategy, lateness=st.sampled_from(LATENESSES), split_at=st.floats(0, 1))
def test_corrections_converge_to_a_brute_force_count(ops: list[Op], lateness: int, split_at: float) -> None:
    outputs = run_ops(lateness, ops)
    assert run_ops(lateness, ops, split=int(split_at * len(ops))) == outputs  # snapshot/restore is transparent
    assert run_ops(lateness, ops, batched=True) == outputs  # add_many is add

    # The reference: an event is too late iff its window's end + allowed lateness <= the watermark at its arrival;
    # every other event counts in its window, and after each advance every window the watermark has passed shows
    # everything counted so far, in exactly one new record per changed window.
    advances = iter(item for kind, item in outputs if kind == "advance")
    wm: int | None = None
    accepted: dict[int, int] = {}
    expected_late: list[TooLate] = []
    latest: dict[int, WindowCount] = {}
    for is_event, x in [*ops, (False, None)]:
        if is_event and x is not None:
            start = ORIGIN + (x - ORIGIN) // W * W
            if wm is not None and start + W + lateness <= wm:
                expected_late.append(TooLate(x, start))
            else:
                accepted[start] = accepted.get(start, 0) + 1
            continue
        # flush() (x None) moves the watermark past every window.
        target = max([*accepted, wm or 0]) + W if x is None else x
        wm = target if wm is None else max(wm, target)
        released = next(advances)
        assert isinstance(released, list)
        starts = [r.window_start_us for r in released]
        assert starts == sorted(set(starts))  # start order, one record per window
        for r in released:
            assert r.window_end_us == r.window_start_us + W <= wm  # never released early
            assert r.revision == (latest[r.window_start_us].revision + 1 if r.window_start_us in latest else 0)
            latest[r.window_start_us] = r
        assert {s: r.count for s, r in latest.items()} == {s: n for s, n in accepted.items() if s + W <= wm}
    assert [item for kind, item in outputs if kind == "late"] == expected_late
    assert {s: r.count for s, r in latest.items()} == accepted  # after flush: the final truth of every window
