"""LOW/MIDDLE/HIGH slot assignment (thesis 003, Sec. 3.2.3.1), hand-computed with w = 1000 us, s = 100 us."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cep.windows import (
    WindowSlot,
    WindowType,
    assign_sliding,
    assign_tumbling,
    final_release_time_us,
    release_time_us,
    sliding_starts,
    tumbling_start,
)

L, M, H = WindowType.LOW, WindowType.MIDDLE, WindowType.HIGH


def labels(slots: tuple[WindowSlot, ...] | list[WindowSlot]) -> list[tuple[str, int, int, int]]:
    return [(str(s.window_type), s.nominal_start_us, s.start_us, s.end_us) for s in slots]


@pytest.mark.parametrize(
    ("ts", "expected"),
    [
        # x = t: LOW of t (it sits in [t - s, t - s + w)), MIDDLE of t, HIGH of the previous window.
        (1000, [("LOW", 1000, 900, 1900), ("MIDDLE", 1000, 1000, 2000), ("HIGH", 0, 100, 1100)]),
        # x = t - s exactly: first instant of LOW(t), still MIDDLE and HIGH of the previous window.
        (900, [("LOW", 1000, 900, 1900), ("MIDDLE", 0, 0, 1000), ("HIGH", 0, 100, 1100)]),
        # x = t - s - 1: last instant of LOW of the previous window.
        (899, [("LOW", 0, -100, 900), ("MIDDLE", 0, 0, 1000), ("HIGH", 0, 100, 1100)]),
        # x = t - s + w - 1: last instant of LOW(t); x = t - s + w: LOW moves on.
        (1899, [("LOW", 1000, 900, 1900), ("MIDDLE", 1000, 1000, 2000), ("HIGH", 1000, 1100, 2100)]),
        (1900, [("LOW", 2000, 1900, 2900), ("MIDDLE", 1000, 1000, 2000), ("HIGH", 1000, 1100, 2100)]),
        # x = t + w - 1: last instant of MIDDLE(t).
        (1999, [("LOW", 2000, 1900, 2900), ("MIDDLE", 1000, 1000, 2000), ("HIGH", 1000, 1100, 2100)]),
        # x = t + s: first instant of HIGH(t); one earlier still HIGH of the previous window.
        (1100, [("LOW", 1000, 900, 1900), ("MIDDLE", 1000, 1000, 2000), ("HIGH", 1000, 1100, 2100)]),
        (1099, [("LOW", 1000, 900, 1900), ("MIDDLE", 1000, 1000, 2000), ("HIGH", 0, 100, 1100)]),
        # x = t + s + w - 1: last instant of HIGH(t).
        (2099, [("LOW", 2000, 1900, 2900), ("MIDDLE", 2000, 2000, 3000), ("HIGH", 1000, 1100, 2100)]),
        # Before the origin: floor division keeps the grid.
        (-1, [("LOW", 0, -100, 900), ("MIDDLE", -1000, -1000, 0), ("HIGH", -1000, -900, 100)]),
    ],
)
def test_tumbling_hand_computed(ts: int, expected: list[tuple[str, int, int, int]]) -> None:
    assert labels(assign_tumbling(ts, 1000, 100)) == expected


def test_zero_shift_gives_three_identical_windows() -> None:
    low, mid, high = assign_tumbling(1234, 1000, 0)
    assert (low.nominal_start_us, low.start_us) == (mid.nominal_start_us, mid.start_us) == (1000, 1000)
    assert high.start_us == 1000


def test_origin() -> None:
    assert labels(assign_tumbling(1000, 1000, 100, origin_us=250)) == [
        ("LOW", 250, 150, 1150),
        ("MIDDLE", 250, 250, 1250),
        ("HIGH", 250, 350, 1350),
    ]
    assert tumbling_start(249, 1000, 250) == -750


def test_sliding_hand_computed() -> None:
    # w = 1000, slide = 500, s = 100, x = 1000: MIDDLE windows starting 500 and 1000; LOW probes 1100 (500, 1000);
    # HIGH probes 900 (0, 500).
    assert labels(assign_sliding(1000, 1000, 500, 100)) == [
        ("LOW", 500, 400, 1400),
        ("LOW", 1000, 900, 1900),
        ("MIDDLE", 500, 500, 1500),
        ("MIDDLE", 1000, 1000, 2000),
        ("HIGH", 0, 100, 1100),
        ("HIGH", 500, 600, 1600),
    ]
    assert sliding_starts(999, 1000, 500) == [0, 500]
    assert sliding_starts(1000, 1000, 500) == [500, 1000]
    assert sliding_starts(1000, 1000, 300, origin_us=100) == [100, 400, 700, 1000]


def test_release_times() -> None:
    assert release_time_us(L, 1000, 1000, 100) == 1900
    assert release_time_us(M, 1000, 1000, 100) == 2000
    assert release_time_us(H, 1000, 1000, 100) == 2100
    assert final_release_time_us(1000, 1000, 100) == 2100


def test_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="width"):
        assign_tumbling(0, 0, 1)
    with pytest.raises(ValueError, match="shift"):
        assign_tumbling(0, 10, -1)
    with pytest.raises(ValueError, match="slide"):
        assign_sliding(0, 10, 0, 1)


@given(
    ts=st.integers(-(10**9), 10**9),
    width=st.integers(1, 10**6),
    shift=st.integers(0, 10**6),
    origin=st.integers(-(10**6), 10**6),
)
def test_tumbling_slots_contain_the_event(ts: int, width: int, shift: int, origin: int) -> None:
    for slot, offset in zip(assign_tumbling(ts, width, shift, origin), (-shift, 0, shift), strict=True):
        assert slot.start_us <= ts < slot.end_us
        assert slot.start_us == slot.nominal_start_us + offset
        assert (slot.nominal_start_us - origin) % width == 0


@given(
    ts=st.integers(-(10**6), 10**6),
    width=st.integers(1, 2000),
    slide=st.integers(1, 2000),
    shift=st.integers(0, 2000),
)
def test_sliding_matches_brute_force(ts: int, width: int, slide: int, shift: int) -> None:
    got = labels(assign_sliding(ts, width, slide, shift))
    expected = []
    for wt, offset in ((L, -shift), (M, 0), (H, shift)):
        k0 = (ts - offset - width) // slide - 1
        for k in range(k0, k0 + width // slide + 4):
            t = k * slide
            if t + offset <= ts < t + offset + width:
                expected.append((str(wt), t, t + offset, t + offset + width))
    assert got == expected
