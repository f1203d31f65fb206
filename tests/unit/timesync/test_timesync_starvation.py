"""Sans-IO tests: sync samples disturbed by CPU starvation must not buy a skew the error bound does not cover.

Under a busy CPU the SDK's (or the gateway's) event loop stamps t4 (or t2/t3) late. Such a sample is still honest:
the delay widens its round trip, and ``offset +- rtt/2`` still holds the true offset. What must not happen is that
a line through a starved point and a clean one reports the slope between their centres (thousands of ppm on perfect
clocks) with a skew error far below that slope (it was capped at ``max_skew_ppm``).
"""

from __future__ import annotations

import random

from timesync.estimator import ClockEstimate, ClockEstimator, SyncSample

T0_US = 1_800_000_000_000_000
ONE_WAY_US = 50
TURNAROUND_US = 20


def _exchange(at_ref_us: int, client_late_us: int = 0, server_late_us: int = 0) -> SyncSample:
    """One exchange between perfect clocks (true offset 0): the client's loop reads t4 ``client_late_us`` late,
    the server's loop reads t2 (and so t3, and the reply) ``server_late_us`` late."""
    t1 = at_ref_us
    t2 = t1 + ONE_WAY_US + server_late_us
    t3 = t2 + TURNAROUND_US
    t4 = t3 + ONE_WAY_US + client_late_us
    return SyncSample(t1, t2, t3, t4)


def _covers(estimate: ClockEstimate, at_ref_us: int) -> bool:
    """The true offset (0) lies within the estimate's bound at ``at_ref_us``, both as the extrapolated offset and
    as the gateway maps a source timestamp (true reference time == source time on perfect clocks)."""
    bound_us = estimate.error_bound_us(at_ref_us)
    mapped_us = estimate.to_reference_us(at_ref_us)
    return abs(estimate.offset_at_us(at_ref_us)) <= bound_us and abs(mapped_us - at_ref_us) <= bound_us


def test_a_starved_burst_and_a_clean_one_do_not_make_a_2700_ppm_skew() -> None:
    est = ClockEstimator()
    # The initial burst under a busy CPU: the SDK's loop read t4 5.4 ms late on its best sample.
    starved = _exchange(T0_US, client_late_us=5_400)
    assert (starved.rtt_us, starved.offset_exact_us) == (5_500, -2_700.0)
    est.add_sample(starved)
    est.end_burst()
    # A clean burst 1 s later (a re-sync asked by the gateway): offset 0, rtt 100 us.
    clean = _exchange(T0_US + 1_000_000)
    assert (clean.rtt_us, clean.offset_exact_us) == (100, 0.0)
    est.add_sample(clean)
    est.end_burst()
    span_us = clean.ref_midpoint_us - starved.ref_midpoint_us
    assert span_us == 1_000_000
    # The line through the two centres climbs 2700 us in 1 s: 2700 ppm on clocks that do not drift at all. The
    # worst case Eq. 3.14 allows for that slope is (2751 + 51) us / 1 s = 2802 ppm, more than the 500 ppm assumed
    # before any skew is measured: the fit says nothing, and the estimate must not claim it.
    estimate = est.estimate()
    assert estimate is not None
    assert estimate.skew_ppm == 0.0
    assert estimate.skew_error_ppm == est.max_skew_ppm
    assert estimate.offset_us == 0 and estimate.sync_ref_us == clean.ref_midpoint_us
    # rtt/2 + 1 us + 501 ppm x 1.08 s = 592.08, rounded up; the old estimate claimed 593 too, 2916 us off.
    assert estimate.error_bound_us(clean.ref_midpoint_us + 1_080_000) == 593
    for ahead_us in range(0, 30_000_001, 10_000):
        assert _covers(estimate, clean.ref_midpoint_us + ahead_us), ahead_us


def test_a_skew_fit_with_a_clean_baseline_keeps_its_worst_case_error() -> None:
    # Three clean bursts 2 s apart and one starved one in between: the starved point (server loop 4 ms late) weighs
    # next to nothing. The skew error is the worst case the intervals allow (25.5 ppm; the statistical error was 15.75)
    # and stays far below the prior with a clean 4 s baseline: honesty must not cost a usable skew.
    est = ClockEstimator()
    for at_us, late_us in ((0, 0), (2_000_000, 0), (3_000_000, 4_000), (4_000_000, 0)):
        est.add_sample(_exchange(T0_US + at_us, server_late_us=late_us))
        est.end_burst()
    estimate = est.estimate()
    assert estimate is not None
    assert estimate.points_used == 4
    assert abs(estimate.skew_ppm) < 0.1
    assert 25.5 < estimate.skew_error_ppm < 25.52  # 2 x 51 us x 2 s / 8 s² from the clean ends; the starved ~0
    for ahead_us in range(0, 60_000_001, 100_000):
        assert _covers(estimate, estimate.sync_ref_us + ahead_us), ahead_us


def test_the_bound_covers_the_truth_under_random_starvation() -> None:
    # 400 runs of 2..6 bursts of 10 exchanges, 0.3..4 s apart; with probability ``starve`` a leg or the server's
    # turnaround is late by up to 8 ms (either event loop starved). Every estimate after every burst must cover the
    # true offset for 5 s after its sync point.
    checks = misses = 0
    for seed in range(400):
        rng = random.Random(seed)
        starve = rng.choice([0.1, 0.3, 0.6, 0.9])
        est = ClockEstimator()
        at_us = T0_US
        for _burst in range(rng.randint(2, 6)):
            for _ in range(10):
                sample = _exchange(
                    at_us,
                    client_late_us=rng.randint(0, 8_000) if rng.random() < starve else rng.randint(0, 30),
                    server_late_us=rng.randint(0, 8_000) if rng.random() < starve else rng.randint(0, 30),
                )
                assert est.add_sample(sample)
                at_us = sample.t4_us + 10
            est.end_burst()
            estimate = est.estimate()
            assert estimate is not None
            for ahead_us in (0, 100_000, 500_000, 1_000_000, 2_000_000, 5_000_000):
                checks += 1
                misses += not _covers(estimate, estimate.sync_ref_us + ahead_us)
            at_us += rng.randint(300_000, 4_000_000)
    assert checks > 5_000
    assert misses == 0
