"""reorder.bounds: a setting out of its bounds is a ValueError naming it; the first one given is reported."""

from __future__ import annotations

import pytest

from reorder.bounds import check_at_least, check_fraction


@pytest.mark.parametrize("value", [0.0, 1.0, -0.5, 1.5])
def test_a_fraction_must_lie_strictly_between_0_and_1(value: float) -> None:
    with pytest.raises(ValueError, match=r"^q must be in \(0, 1\)$"):
        check_fraction("q", value)


def test_a_fraction_inside_passes() -> None:
    check_fraction("q", 0.9999)


def test_the_first_value_below_the_minimum_is_the_error_in_the_order_given() -> None:
    check_at_least(0, a=0, b=5)
    with pytest.raises(ValueError, match=r"^b must be >= 1$"):
        check_at_least(1, a=1, b=0, c=-1)
