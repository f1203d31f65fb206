"""benchmarks/harness/stats.py: both percentile definitions on hand-computed samples."""

from __future__ import annotations

import math

import pytest

from benchmarks.harness.stats import percentile, percentile_nearest

FOUR = [7.0, 1.0, 5.0, 3.0]  # sorted: 1, 3, 5, 7


@pytest.mark.parametrize(("q", "expected"), [
    (0.0, 1.0),    # index floor(0 * 4) = 0
    (0.25, 3.0),   # floor(1.0) = 1
    (0.5, 5.0),    # floor(2.0) = 2: the upper of the two middle samples
    (0.74, 5.0),   # floor(2.96) = 2
    (0.99, 7.0),   # floor(3.96) = 3
    (1.0, 7.0),    # floor(4.0) = 4, clamped to the last index 3
])
def test_percentile_takes_the_sample_at_floor_q_n(q: float, expected: float) -> None:
    assert percentile(FOUR, q) == expected


@pytest.mark.parametrize(("percent", "expected"), [
    (0, 1.0),      # position 0
    (10, 1.0),     # 0.3 rounds to 0
    (50, 5.0),     # 1.5 rounds to 2 (a tie: the even index)
    (90, 7.0),     # 2.7 rounds to 3
    (100, 7.0),    # 3
])
def test_percentile_nearest_takes_the_sample_nearest_to_percent_of_n_minus_1(percent: float,
                                                                               expected: float) -> None:
    assert percentile_nearest(FOUR, percent) == expected


def test_percentile_nearest_breaks_ties_to_the_even_index() -> None:
    assert percentile_nearest([20.0, 10.0], 50) == 10.0  # position 0.5: index 0
    six = [6.0, 5.0, 4.0, 3.0, 2.0, 1.0]
    assert percentile_nearest(six, 30) == 3.0  # position 1.5: index 2
    assert percentile_nearest(six, 50) == 3.0  # position 2.5: index 2


def test_the_two_definitions_differ_at_p99_of_a_hundred() -> None:
    hundred = [float(v) for v in range(100, 0, -1)]  # 1 .. 100
    assert percentile(hundred, 0.99) == 100.0  # index floor(99.0) = 99
    assert percentile_nearest(hundred, 99) == 99.0  # position 98.01: index 98


def test_ints_come_back_as_floats_and_no_samples_as_nan() -> None:
    assert percentile([3, 1, 2], 0.5) == 2.0 and isinstance(percentile([3, 1, 2], 0.5), float)
    assert isinstance(percentile_nearest([3, 1, 2], 50), float)
    assert math.isnan(percentile([], 0.5))
    assert math.isnan(percentile_nearest([], 50))
    assert percentile([42.0], 0.99) == 42.0 and percentile_nearest([42.0], 99) == 42.0
