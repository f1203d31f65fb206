"""Sans-IO tests of the estimator with virtual time: Eq. 3.12-3.16, min filter, bound, skew."""

from __future__ import annotations

import random

import pytest

from timesync.estimator import ClockEstimate, ClockEstimator, SyncSample
from timesync.store import SourceInfoStore, UnknownSourceError


class VirtualLink:
    """A source clock with known offset/skew against a virtual reference timeline.

    ``true offset(t_ref) = offset0_us + skew_ppm * 1e-6 * (t_ref - 0)``; so the source reads
    ``t_source = t_ref - offset(t_ref)``.
    """

    def __init__(self, offset0_us: float, skew_ppm: float, rng: random.Random) -> None:
        self.offset0_us = offset0_us
        self.skew_ppm = skew_ppm
        self.rng = rng

    def true_offset_us(self, t_ref_us: float) -> float:
        return self.offset0_us + self.skew_ppm * 1e-6 * t_ref_us

    def source_us(self, t_ref_us: float) -> int:
        return round(t_ref_us - self.true_offset_us(t_ref_us))

    def exchange(self, t_ref_us: float, up_us: float, down_us: float, turn_us: float = 20.0) -> SyncSample:
        t1 = self.source_us(t_ref_us)
        t2 = round(t_ref_us + up_us)
        t3 = round(t_ref_us + up_us + turn_us)
        t4 = self.source_us(t_ref_us + up_us + turn_us + down_us)
        return SyncSample(t1, t2, t3, t4)


def test_equations_3_12_and_3_13_exact() -> None:
    s = SyncSample(t1_us=1_000, t2_us=6_100, t3_us=6_150, t4_us=1_350)
    assert s.rtt_us == (1_350 - 1_000) - (6_150 - 6_100) == 300
    assert s.offset_exact_us == ((6_100 - 1_000) + (6_150 - 1_350)) / 2 == 4_950.0
    assert s.offset_us == 4_950
    lo, hi = s.bounds_us()
    assert (lo, hi) == (4_800.0, 5_100.0)  # Eq. 3.14


def test_offset_half_microsecond_floors() -> None:
    s = SyncSample(0, 10, 11, 0)
    assert s.offset_exact_us == 10.5
    assert s.offset_us == 10
    neg = SyncSample(0, -10, -9, 0)
    assert neg.offset_exact_us == -9.5
    assert neg.offset_us == -10


def test_empty_estimator_has_no_estimate() -> None:
    assert ClockEstimator().estimate() is None


def test_min_filter_picks_lowest_delay_sample() -> None:
    est = ClockEstimator(burst_size=8)
    link = VirtualLink(offset0_us=50_000, skew_ppm=0.0, rng=random.Random(1))
    delays = [(900, 100), (400, 400), (60, 40), (700, 300), (1_000, 50), (300, 300), (250, 250), (500, 20)]
    for i, (up, down) in enumerate(delays):
        est.add_sample(link.exchange(i * 10_000, up, down))
    e = est.estimate()
    assert e is not None
    assert e.rtt_us == 100
    # Best sample's asymmetry is (60 - 40) / 2 = 10 us.
    assert abs(e.offset_us - 50_000) <= 11
    assert e.sample_count == 8


@pytest.mark.parametrize("seed", range(5))
def test_asymmetric_delays_stay_inside_eq_3_14(seed: int) -> None:
    rng = random.Random(seed)
    true_offset = rng.uniform(-3.6e9, 3.6e9)
    link = VirtualLink(true_offset, 0.0, rng)
    est = ClockEstimator()
    for i in range(10):
        up = rng.uniform(10, 5_000)
        down = rng.uniform(10, 5_000) * rng.choice([0.01, 1, 20])
        s = link.exchange(i * 50_000.0, up, down)
        lo, hi = s.bounds_us()
        assert lo - 1 <= true_offset <= hi + 1
        est.add_sample(s)
    e = est.estimate()
    assert e is not None
    assert abs(e.offset_us - true_offset) <= e.error_bound_us(e.sync_ref_us)


def test_to_reference_and_bound_growth() -> None:
    e = ClockEstimate(
        offset_us=1_000,
        skew_ppm=10.0,
        rtt_us=200,
        sync_ref_us=10_000_000,
        sample_count=8,
        root_error_us=101.0,
        skew_error_ppm=2.0,
        dispersion_ppm=1.0,
    )
    # At the sync instant the offset applies unchanged.
    assert e.to_reference_us(10_000_000 - 1_000) == 10_000_000
    # One second later the offset grew by 10 ppm * 1 s = 10 us.
    assert e.to_reference_us(11_000_000 - 1_000) == 11_000_010
    assert e.error_bound_us(10_000_000) == 101
    assert e.error_bound_us(12_000_000) == 101 + 6  # (1 + 2) ppm * 2 s
    assert e.error_bound_us(8_000_000) == 107
    assert e.to_source_us(e.to_reference_us(123_456_789)) == 123_456_789


def _run_bursts(
    link: VirtualLink,
    rng: random.Random,
    est: ClockEstimator,
    *,
    interval_us: int,
    bursts: int,
    jitter_us: float,
    per_burst: int = 10,
) -> list[tuple[ClockEstimate, float]]:
    out = []
    for b in range(bursts):
        t0 = b * interval_us
        for k in range(per_burst):
            up = 30 + rng.expovariate(1 / jitter_us)
            down = 30 + rng.expovariate(1 / jitter_us)
            est.add_sample(link.exchange(t0 + k * 20_000, up, down))
        est.end_burst()
        e = est.estimate()
        assert e is not None
        out.append((e, t0 + per_burst * 20_000))
    return out


@pytest.mark.parametrize("seed", range(6))
def test_skew_estimate_converges(seed: int) -> None:
    rng = random.Random(1000 + seed)
    skew = rng.uniform(-200, 200)
    link = VirtualLink(rng.uniform(-1e6, 1e6), skew, rng)
    est = ClockEstimator()
    results = _run_bursts(link, rng, est, interval_us=5_000_000, bursts=13, jitter_us=50)
    final, _ = results[-1]
    # 60 s of syncing every 5 s with ~50 us jitter: within 1 ppm.
    assert abs(final.skew_ppm - skew) < 1.0
    assert final.skew_error_ppm < 5.0
    assert abs(final.skew_ppm - skew) <= final.skew_error_ppm
    # The estimate and its bound hold while extrapolating 30 s ahead.
    for ahead_s in (0, 5, 30):
        t = final.sync_ref_us + ahead_s * 1_000_000
        err = final.offset_at_us(t) - link.true_offset_us(t)
        assert abs(err) <= final.error_bound_us(t)


def test_bound_coverage_randomized() -> None:
    rng = random.Random(42)
    misses = 0
    checks = 0
    for _ in range(20):
        skew = rng.uniform(-200, 200)
        link = VirtualLink(rng.uniform(-3.6e9, 3.6e9), skew, rng)
        est = ClockEstimator()
        results = _run_bursts(link, rng, est, interval_us=4_000_000, bursts=8, jitter_us=300)
        for e, t_end in results:
            for ahead_us in (0, 1_000_000, 3_999_999):
                t = t_end + ahead_us
                checks += 1
                if abs(e.offset_at_us(t) - link.true_offset_us(t)) > e.error_bound_us(t):
                    misses += 1
    assert misses / checks <= 0.001


def test_single_burst_has_no_skew_and_wide_growth() -> None:
    est = ClockEstimator(max_skew_ppm=500.0)
    est.add_sample(SyncSample(0, 100, 110, 30))
    e = est.estimate()
    assert e is not None
    assert e.skew_ppm == 0.0
    assert e.skew_error_ppm == 500.0
    assert e.error_bound_us(e.sync_ref_us + 1_000_000) >= 500


def test_burst_gap_closes_burst() -> None:
    est = ClockEstimator(burst_gap_us=1_000_000)
    est.add_sample(SyncSample(0, 0, 0, 10))
    est.add_sample(SyncSample(5_000_000, 5_000_000, 5_000_000, 5_000_040))
    assert est.burst_count == 2
    assert len(est.points()) == 2


def test_bad_samples_are_rejected() -> None:
    est = ClockEstimator()
    assert not est.add_sample(SyncSample(0, 100, 50, 10))  # t3 < t2
    assert not est.add_sample(SyncSample(10, 0, 0, 0))  # t4 < t1
    assert est.rejected_count == 2
    assert est.estimate() is None


def test_frequency_step_is_followed() -> None:
    rng = random.Random(7)
    link = VirtualLink(0.0, 50.0, rng)
    est = ClockEstimator()
    _run_bursts(link, rng, est, interval_us=2_000_000, bursts=30, jitter_us=5)
    # The source's frequency changes: old points no longer fit the line.
    t_switch = 30 * 2_000_000
    off_at_switch = link.true_offset_us(t_switch)
    link2 = VirtualLink(off_at_switch + 20.0 * 1e-6 * t_switch * -1, 20.0, rng)
    for b in range(30, 60):
        t0 = b * 2_000_000
        for k in range(8):
            est.add_sample(link2.exchange(t0 + k * 20_000, 30 + rng.expovariate(0.2), 30 + rng.expovariate(0.2)))
        est.end_burst()
    e = est.estimate()
    assert e is not None
    assert abs(e.skew_ppm - 20.0) < 2.0


def test_store_reads_and_t_a() -> None:
    store = SourceInfoStore()
    seen: list[str] = []
    unsubscribe = store.add_listener(lambda info: seen.append(info.source_id))
    a = ClockEstimate(offset_us=5, skew_ppm=0.0, rtt_us=300, sync_ref_us=0, sample_count=8)
    b = ClockEstimate(offset_us=-7, skew_ppm=1.0, rtt_us=900, sync_ref_us=0, sample_count=8)
    store.update("a", a, last_sync_us=100)
    store.update("b", b, last_sync_us=200)
    unsubscribe()
    store.update("c", a, last_sync_us=300)
    assert seen == ["a", "b"]
    assert store.max_rtt_us(["a", "b"]) == 900  # Eq. 3.16
    assert store.max_rtt_us(["a"]) == 300
    assert store.max_rtt_us(["zzz"], default_us=42) == 42
    assert store.max_rtt_us() == 900
    assert store.last_sync_us("b") == 200
    assert store.estimate("a") is a
    assert store.to_reference_us("a", 1_000) == 1_005
    assert "a" in store and len(store) == 3
    assert store.source_ids() == ["a", "b", "c"]
    with pytest.raises(UnknownSourceError):
        store.to_reference_us("nope", 0)
    store.remove("c")
    assert store.get("c") is None


def test_two_bursts_give_a_skew_with_worst_case_error() -> None:
    est = ClockEstimator()
    est.add_sample(SyncSample(0, 1_000, 1_010, 110))  # offset 950, rtt 100
    est.end_burst()
    # 10 s later the offset grew by 100 us: 10 ppm.
    est.add_sample(SyncSample(10_000_000, 10_001_100, 10_001_110, 10_000_110))
    est.end_burst()
    e = est.estimate()
    assert e is not None
    assert e.skew_ppm == pytest.approx(10.0, rel=1e-4)
    # Worst case over 10 s with two 100 us round trips: (51 + 51) us / 10 s = 10.2 ppm.
    assert e.skew_error_ppm == pytest.approx(10.2, rel=1e-4)
    assert e.points_used == 2


def test_simulated_clock_sign_convention() -> None:
    from timesync.clocks import SimulatedClock, for_time_sync, system_time_us

    sim = SimulatedClock(ahead_us=1_000, skew_ppm=100.0, origin_us=0)
    assert sim.at(0) == 1_000
    assert sim.at(10_000_000) == 10_000_000 + 1_000 + 1_000  # 100 ppm of 10 s
    stamped = for_time_sync(sim)
    assert stamped.from_realtime_ns(10_000_000_000) == 10_000_000 + 1_000 + 1_000  # type: ignore[attr-defined]
    assert abs(system_time_us() - sim()) > 0
    assert for_time_sync(system_time_us).from_realtime_ns(5_999) == 5  # type: ignore[attr-defined]


def _burst(est: ClockEstimator, src: VirtualLink, t_ref_us: float, n: int = 6) -> None:
    for k in range(n):
        est.add_sample(src.exchange(t_ref_us + k * 10_000, 200.0, 200.0))
    est.end_burst()


def test_a_clock_step_restarts_the_regression_instead_of_becoming_skew() -> None:
    rng = random.Random(5)
    src = VirtualLink(0.0, 20.0, rng)
    est = ClockEstimator()
    t = 1_800_000_000_000_000.0
    for b in range(5):
        _burst(est, src, t + b * 1_000_000)
    assert est.step_count == 0
    src.offset0_us -= 3_600_000_000  # the source clock jumps an hour ahead: the offset drops by an hour
    _burst(est, src, t + 5 * 1_000_000)
    estimate = est.estimate()
    assert estimate is not None
    assert est.step_count == 1
    assert abs(estimate.skew_ppm) < 1e-6  # one point after the step: no skew claimed
    assert abs(estimate.offset_us - src.true_offset_us(t + 5 * 1_000_000)) < 1_000
    assert estimate.skew_error_ppm == est.max_skew_ppm
    # A 500 ppm drift is no step.
    drifting = ClockEstimator()
    fast = VirtualLink(0.0, 500.0, rng)
    for b in range(8):
        _burst(drifting, fast, t + b * 2_000_000)
    drift_estimate = drifting.estimate()
    assert drifting.step_count == 0
    assert drift_estimate is not None and abs(drift_estimate.skew_ppm - 500.0) < 5


def test_one_fresh_sample_that_disagrees_with_the_estimate_beyond_its_bound_is_a_step_at_once() -> None:
    # Issue 25 item 9: a step moves the offset of the first low-RTT sample after it; a delay does not. The estimator
    # restarts from that sample, without waiting for its burst to end or mixing it with the samples before the step.
    rng = random.Random(9)
    src = VirtualLink(0.0, 0.0, rng)
    est = ClockEstimator()
    t = 1_800_000_000_000_000.0
    for b in range(3):
        _burst(est, src, t + b * 1_000_000)
    est.add_sample(src.exchange(t + 3_000_000, 200.0, 200.0))  # the re-sync burst opens before the step
    src.offset0_us += 2_000_000  # the source clock steps back 2 s: the offset grows by 2 s
    est.add_sample(src.exchange(t + 3_020_000, 300.0, 300.0))
    assert est.step_count == 1
    estimate = est.estimate()
    assert estimate is not None
    assert abs(estimate.offset_us - src.true_offset_us(t + 3_020_000)) <= estimate.root_error_us
    assert estimate.sync_ref_us == round(t + 3_020_000 + 300 + 10)  # that sample, not the lower-RTT one before
    # A sample delayed 1.9 s on one leg (a queue, a paused reader) is no step: its own RTT covers the asymmetry.
    est.add_sample(src.exchange(t + 3_040_000, 1_900_000.0, 100.0))
    est.end_burst()
    assert est.step_count == 1


# -- the minimum filter sees the whole burst (Eq. 3.14: minimum over ALL requests) ----------------------------------

# Hand-computed samples of a 10-request burst, the source ~250 ms behind the reference.
# Best: up 30 us, turnaround 20 us, down 20 us -> rtt = (70 - 20) = 50, offset = (250_030 + 249_980) / 2 = 250_005.
_BEST = SyncSample(t1_us=1_000_000, t2_us=1_250_030, t3_us=1_250_050, t4_us=1_000_070)


def _slow(k: int) -> SyncSample:
    """Request k of the burst (20 ms apart): up 600, turnaround 20, down 300 -> rtt 900, offset 250_150."""
    t1 = 1_000_000 + k * 20_000
    return SyncSample(t1_us=t1, t2_us=t1 + 250_600, t3_us=t1 + 250_620, t4_us=t1 + 920)


def _burst_with_best_at(index: int, n: int = 10) -> list[SyncSample]:
    samples = [_slow(k) for k in range(n)]
    samples[index] = SyncSample(
        _BEST.t1_us + index * 20_000, _BEST.t2_us + index * 20_000, _BEST.t3_us + index * 20_000,
        _BEST.t4_us + index * 20_000,
    )
    return samples


def test_hand_computed_burst_samples() -> None:
    assert (_BEST.rtt_us, _BEST.offset_exact_us) == (50, 250_005.0)
    assert (_slow(3).rtt_us, _slow(3).offset_exact_us) == (900, 250_150.0)


@pytest.mark.parametrize("index", [0, 1])
@pytest.mark.parametrize("close", [False, True])
def test_min_filter_uses_early_best_sample_of_a_10_request_burst(index: int, close: bool) -> None:
    est = ClockEstimator()
    burst = _burst_with_best_at(index)
    for s in burst:
        assert est.add_sample(s)
    if close:
        est.end_burst()
    e = est.estimate()
    assert e is not None
    assert e.rtt_us == 50
    assert e.offset_us == 250_005
    best = burst[index]
    assert e.sync_ref_us == (best.t2_us + best.t3_us) // 2
    assert e.root_error_us == 50 / 2 + 0 + 1  # Eq. 3.14 of the selected sample, + precision
    assert e.sample_count == 10 and e.burst_count == 1


def test_burst_size_is_the_most_samples_one_burst_holds() -> None:
    # A burst is closed once it holds burst_size samples; the next sample opens a new one. Inside a burst
    # every sample counts, however early it came.
    est = ClockEstimator(burst_size=3)
    for i, rtt in enumerate([10, 500, 400, 300]):
        est.add_sample(SyncSample(i * 1000, i * 1000, i * 1000, i * 1000 + rtt))
    assert est.burst_count == 2
    assert [p.rtt_us for p in est.points()] == [10, 300]
    assert est.open_burst_samples == 1


def test_default_burst_cap_holds_a_thesis_burst_and_is_documented() -> None:
    from timesync.estimator import DEFAULT_BURST_SIZE

    assert DEFAULT_BURST_SIZE == 64
    assert ClockEstimator().burst_size == DEFAULT_BURST_SIZE
    with pytest.raises(ValueError):
        ClockEstimator(burst_size=0)


def test_a_burst_that_never_ends_is_cut_and_state_stays_bounded() -> None:
    # A hostile (or buggy) client sends samples 1 ms apart and never ends its burst: no gap, no end-of-burst.
    est = ClockEstimator()
    n = 10_000
    for i in range(n):
        t = i * 1_000
        assert est.add_sample(SyncSample(t, t + 7, t + 8, t + 100 + (i * 37) % 400))
        assert est.open_burst_samples <= est.burst_size
    assert est.sample_count == n
    assert est.burst_count == -(-n // est.burst_size)  # a new filtered point every burst_size samples
    assert len(est.points()) <= est.max_points + 1  # history is a bounded deque, plus the open burst
    e = est.estimate()
    assert e is not None and e.rtt_us >= 100
