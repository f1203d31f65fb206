"""A gateway's own clock error enters every event's uncertainty (issue 13 item 6)."""

from __future__ import annotations

import pytest

from gateway.config import ConfigError, build_config
from timesync.clocks import UNKNOWN_ERROR_BOUND_US, EstimateMapping, FixedOffsetMapping, ReferenceErrorMapping
from timesync.refclock import ReferenceClockError, chrony_error_bound_us

# chronyc -c tracking on a host synchronised to a stratum-2 server: system time 0.000012345 s fast, root delay
# 0.004 s, root dispersion 0.0015 s -> 12.345 + 1500 + 2000 = 3512.345 us, rounded up.
TRACKING = ("C0A80001,192.168.0.1,3,1795400000.123456789,0.000012345,-0.000010000,0.000020000,-12.345,0.001,0.050,"
            "0.004000000,0.001500000,64.2,Normal\n")


def test_chrony_bound_is_offset_plus_dispersion_plus_half_the_root_delay() -> None:
    assert chrony_error_bound_us(TRACKING) == 3513
    slow = TRACKING.replace("0.000012345", "-0.000012345")
    assert chrony_error_bound_us(slow) == 3513  # a slow clock is as far off as a fast one


def test_unsynchronised_or_odd_chrony_output_is_an_error_not_a_zero() -> None:
    with pytest.raises(ReferenceClockError, match="not synchronised"):
        chrony_error_bound_us(TRACKING.replace("Normal", "Not synchronised"))
    with pytest.raises(ReferenceClockError, match="unexpected"):
        chrony_error_bound_us("506 Cannot talk to daemon")
    with pytest.raises(ReferenceClockError, match="unexpected"):
        chrony_error_bound_us(TRACKING.replace("0.004000000", "x"))


def test_the_reference_error_is_added_to_known_bounds_and_leaves_unknown_ones_unknown() -> None:
    error_us = [2_000]
    mapping = ReferenceErrorMapping(FixedOffsetMapping({"a": 500}, error_bound_us=30), lambda: error_us[0])
    assert mapping.to_reference("a", 1_000) == (1_500, 2_030)
    error_us[0] = 7
    assert mapping.to_reference("a", 1_000) == (1_500, 37)
    unsynced = ReferenceErrorMapping(EstimateMapping(), lambda: 2_000)
    assert unsynced.to_reference("b", 1_000) == (1_000, UNKNOWN_ERROR_BOUND_US)


def test_reference_clock_error_setting() -> None:
    assert build_config({}).reference_error_us == 0
    assert build_config({"reference_clock_error": "2 ms"}).reference_error_us == 2_000
    assert build_config({"reference_clock_error": "0"}).reference_error_us == 0
    config = build_config({"reference_clock_error": "chrony"})
    assert config.reference_error_from_chrony and config.reference_error_us == 0
    with pytest.raises(ConfigError, match="reference_clock_error"):
        build_config({"reference_clock_error": "soon"})
