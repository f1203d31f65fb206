"""Per-source clock estimation: NTP on-wire arithmetic, minimum filter, skew regression, error bound.

Sign convention (the only place it is defined; everything in ``timesync`` follows it)::

    t_ref = t_source + offset_us

``offset_us`` is what must be *added* to a timestamp read on the source's clock to obtain the
timestamp on the reference (gateway) clock.  ``skew_ppm`` is the rate at which that offset
changes, measured on the reference timeline: ``d(offset_us) / d(t_ref_us) * 1e6``.  A positive
skew means the source clock runs slow compared with the reference.

The module is pure: no I/O, no clock reads.  Every timestamp is an ``int`` of microseconds.

Algorithm
---------
* Each exchange gives a :class:`SyncSample` (t1, t4 on the source clock; t2, t3 on the
  reference clock).  Its round trip is thesis Eq. 3.12 and its offset Eq. 3.13.
* Samples arrive in bursts.  Within the current burst the *minimum filter* (thesis section
  3.2.2, Eq. 3.14) keeps the sample with the lowest round trip among *all* samples of the burst,
  however early in the burst it came.  Only that running minimum is kept (O(1) memory per
  source).  A burst ends on :meth:`ClockEstimator.end_burst` (the client's end-of-burst report),
  on a gap of more than ``burst_gap_us`` between samples, or once it holds ``burst_size``
  samples (default 64): a client that never ends its burst still gets a fresh filtered point
  every ``burst_size`` samples instead of one stale minimum forever.
* A sample whose offset lies further from the current estimate than its error bound, the sample's own rtt/2 and
  ``STEP_THRESHOLD_US`` together allow shows a clock step at once: the history and the open burst are dropped and
  the estimate starts over from that sample (``step_count``). A network or queueing delay cannot do that: it
  widens the round trip, and the interval ``offset +- rtt/2`` still holds the true offset.
* Each burst contributes one filtered point ``(t_ref, offset, rtt)`` to a history of at most
  ``max_points`` points.  A weighted least-squares line through the history gives the offset at
  the newest point (intercept) and the skew (slope), in the spirit of chrony's sourcestats.c:
  weights fall with a point's excess round trip over the best one, and a runs test on the
  residual signs discards old points when the line no longer fits them (frequency changed).
* The error bound at a reference time ``t`` is::

      rtt_sel / 2 + |offset - offset_sel|                  (Eq. 3.14 of the selected sample,
                                                             widened to contain the estimate)
      + (dispersion_ppm + skew_error_ppm) * |t - t_sync|   (growth since the sync)

  where ``skew_error_ppm`` is ``max_skew_ppm`` until a skew has been estimated.  A fitted skew's error is at
  least the worst case the points' Eq. 3.14 intervals allow (``sum |c_i| * (rtt_i/2 + precision)``, ``c_i`` the
  slope's weight of point i).  When that error reaches ``max_skew_ppm`` (a short baseline, or points widened by a
  starved event loop) the fit is not used: skew 0, error ``max_skew_ppm``, as after one burst.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from dataclasses import dataclass, field

__all__ = [
    "DEFAULT_BURST_SIZE",
    "DEFAULT_DISPERSION_PPM",
    "DEFAULT_MAX_POINTS",
    "DEFAULT_MAX_SKEW_PPM",
    "ClockEstimate",
    "ClockEstimator",
    "FilteredPoint",
    "SyncSample",
]

#: Most samples one burst may hold: the minimum filter covers every sample up to here, then the burst is closed
#: and the next sample opens a new one.  Well above the thesis' 10 requests per burst (Sample Code 4.1) and the
#: server's default rate limit (64/s); the filter keeps only the running minimum, so this bounds staleness, not
#: memory.
DEFAULT_BURST_SIZE = 64
#: Regression history, as chrony's MAX_SAMPLES (64).
DEFAULT_MAX_POINTS = 64
#: Frequency error assumed before a skew has been measured; chrony's default ``maxdrift`` is 500 ppm.
DEFAULT_MAX_SKEW_PPM = 500.0
#: Extra bound growth for frequency wander that the regression cannot model (RFC 5905 uses 15 ppm).
DEFAULT_DISPERSION_PPM = 1.0
#: Resolution of the timestamps in the computation; also the floor of every round trip.
DEFAULT_PRECISION_US = 1
#: Samples this far apart on the reference clock belong to different bursts.
DEFAULT_BURST_GAP_US = 5_000_000
#: Regression needs this many points spanning at least this long before it reports a skew.
MIN_REGRESSION_POINTS = 2
MIN_REGRESSION_SPAN_US = 1_000_000
#: The runs test needs enough residuals to say anything.
MIN_RUNS_TEST_POINTS = 6
#: Coverage factor for the slope's standard error (~99.9 % two-sided for a normal variable).
SKEW_COVERAGE_SIGMAS = 3.3
#: A new burst whose offset lies this far outside what the current estimate allows (its error bound, which already
#: covers ``max_skew_ppm`` of drift, plus the burst's own rtt/2) means the source clock was stepped, not that it
#: drifted: the history before the step is dropped.  128 ms is ntpd's step threshold.
STEP_THRESHOLD_US = 128_000
#: A fitted skew beyond this is not a drifting oscillator (quartz: tens of ppm; the SDK refuses to simulate more than
#: 1000 ppm) but a line across a clock step.
MAX_PLAUSIBLE_SKEW_PPM = 5_000.0

_US_PER_PPM_S = 1e-6  # 1 ppm over 1 us of elapsed time is 1e-6 us


@dataclass(frozen=True, slots=True)
class SyncSample:
    """One request/reply exchange.

    ``t1_us`` (request sent) and ``t4_us`` (reply received) are read on the source clock;
    ``t2_us`` (request received) and ``t3_us`` (reply sent) on the reference clock.
    """

    t1_us: int
    t2_us: int
    t3_us: int
    t4_us: int

    @property
    def rtt_us(self) -> int:
        """Round trip ``T_i = (t4 - t1) - (t3 - t2)`` (thesis Eq. 3.12); negative values are possible."""
        return (self.t4_us - self.t1_us) - (self.t3_us - self.t2_us)

    @property
    def offset_exact_us(self) -> float:
        """Offset ``t_i^d = ((t2 - t1) + (t3 - t4)) / 2`` (thesis Eq. 3.13) without rounding."""
        return ((self.t2_us - self.t1_us) + (self.t3_us - self.t4_us)) / 2

    @property
    def offset_us(self) -> int:
        """Eq. 3.13 in whole microseconds (floor of the half-microsecond when the sum is odd)."""
        return ((self.t2_us - self.t1_us) + (self.t3_us - self.t4_us)) // 2

    @property
    def ref_midpoint_us(self) -> int:
        """When the sample was taken, on the reference clock (middle of the server's turnaround)."""
        return (self.t2_us + self.t3_us) // 2

    def bounds_us(self) -> tuple[float, float]:
        """The interval of Eq. 3.14 that holds the true offset: ``offset -+ rtt / 2``."""
        half = max(self.rtt_us, 0) / 2
        return self.offset_exact_us - half, self.offset_exact_us + half


@dataclass(frozen=True, slots=True)
class FilteredPoint:
    """The minimum-filter output of one burst: a point of the skew regression."""

    ref_us: int
    offset_us: float
    rtt_us: int


@dataclass(frozen=True, slots=True)
class ClockEstimate:
    """What the gateway needs to map a source's timestamps onto the reference clock."""

    offset_us: int
    """Offset at ``sync_ref_us`` (``t_ref = t_source + offset_us``)."""
    skew_ppm: float
    """``d(offset) / d(t_ref)`` in parts per million; 0.0 until enough bursts were seen."""
    rtt_us: int
    """Round trip of the selected (lowest-delay) sample of the latest burst: the thesis' ``T_s``."""
    sync_ref_us: int
    """Reference time at which ``offset_us`` holds (the selected sample's midpoint)."""
    sample_count: int
    """Samples accepted by the estimator since it was created."""
    root_error_us: float = 0.0
    """Bound on ``|true offset - offset_us|`` at ``sync_ref_us``."""
    skew_error_ppm: float = DEFAULT_MAX_SKEW_PPM
    """Bound on the skew error; ``max_skew_ppm`` while no skew has been estimated."""
    dispersion_ppm: float = DEFAULT_DISPERSION_PPM
    """Extra bound growth per unit of elapsed time."""
    points_used: int = 1
    """Bursts the regression used."""
    burst_count: int = 1
    """Bursts seen (closed ones plus the open one)."""

    def offset_at_us(self, at_ref_us: int) -> float:
        """The offset extrapolated to reference time ``at_ref_us``."""
        return self.offset_us + self.skew_ppm * _US_PER_PPM_S * (at_ref_us - self.sync_ref_us)

    def to_reference_us(self, source_ts_us: int) -> int:
        """Map a source timestamp onto the reference clock: ``t + offset + skew * (t - t_sync)``.

        The elapsed time is measured on the reference timeline (``t + offset - sync_ref``); using
        the raw source timestamp would mix two clocks that may be hours apart.
        """
        approx_ref_us = source_ts_us + self.offset_us
        return round(source_ts_us + self.offset_at_us(approx_ref_us))

    def to_source_us(self, ref_ts_us: int) -> int:
        """Inverse of :meth:`to_reference_us` (to first order in the skew)."""
        return round(ref_ts_us - self.offset_at_us(ref_ts_us))

    def error_bound_us(self, at_ref_us: int) -> int:
        """Bound on the error of :meth:`to_reference_us` for timestamps near ``at_ref_us``.

        ``rtt/2`` (Eq. 3.14, widened to contain the regression estimate) plus dispersion growth and
        skew uncertainty for the time elapsed since the sync, rounded up to whole microseconds.
        """
        elapsed_us = abs(at_ref_us - self.sync_ref_us)
        growth = (self.dispersion_ppm + self.skew_error_ppm) * _US_PER_PPM_S * elapsed_us
        return math.ceil(self.root_error_us + growth)


@dataclass(slots=True)
class _Burst:
    best: SyncSample
    """Lowest round trip so far in this burst (the first one on a tie)."""
    count: int
    last_ref_us: int


@dataclass(slots=True)
class _Fit:
    offset_us: float
    skew_ppm: float
    skew_error_ppm: float
    points_used: int


@dataclass(slots=True)
class ClockEstimator:
    """Estimator state of one source; feed it :class:`SyncSample` objects, read :class:`ClockEstimate`.

    The minimum filter considers every sample of a burst.  A burst ends when :meth:`end_burst` is
    called (the client's final report), when a sample arrives more than ``burst_gap_us`` after the
    previous one, or once it holds ``burst_size`` samples (the bound on one burst; the next sample
    opens a new burst).
    """

    burst_size: int = DEFAULT_BURST_SIZE
    max_points: int = DEFAULT_MAX_POINTS
    burst_gap_us: int = DEFAULT_BURST_GAP_US
    max_skew_ppm: float = DEFAULT_MAX_SKEW_PPM
    dispersion_ppm: float = DEFAULT_DISPERSION_PPM
    precision_us: int = DEFAULT_PRECISION_US
    sample_count: int = 0
    rejected_count: int = 0
    step_count: int = 0
    """Clock steps detected (each one restarted the regression)."""
    _history: deque[FilteredPoint] = field(init=False)
    _burst: _Burst | None = field(init=False, default=None)
    _closed_bursts: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        if self.burst_size < 1:
            raise ValueError("burst_size must be >= 1")
        if self.max_points < 2:
            raise ValueError("max_points must be >= 2")
        self._history = deque(maxlen=self.max_points)

    # -- input -----------------------------------------------------------------------------------

    def add_sample(self, sample: SyncSample) -> bool:
        """Add one exchange.  Returns False (and counts it) if the sample is unusable.

        Rejected: a turnaround ``t3 < t2``, a request that arrived before the latest sample of the
        open burst by more than a burst gap (time going backwards), or a round trip larger than
        ``burst_gap_us``.
        """
        if sample.t3_us < sample.t2_us or sample.t4_us < sample.t1_us:
            self.rejected_count += 1
            return False
        if sample.rtt_us > self.burst_gap_us:
            self.rejected_count += 1
            return False
        ref_us = sample.ref_midpoint_us
        if self._stepped_before(sample):
            # The clock stepped since the estimate was made: this sample alone shows it (a delay widens a sample's
            # round trip, and with it the interval that holds its true offset; it never moves that interval away
            # from the truth). Start over from it, dropping the open burst too: its samples are from before.
            self._history.clear()
            self._burst = None
            self.step_count += 1
        burst = self._burst
        if burst is not None and abs(ref_us - burst.last_ref_us) > self.burst_gap_us:
            self.end_burst()
            burst = None
        if burst is None:
            self._burst = _Burst(best=sample, count=1, last_ref_us=ref_us)
        else:
            if sample.rtt_us < burst.best.rtt_us:
                burst.best = sample
            burst.count += 1
            burst.last_ref_us = max(burst.last_ref_us, ref_us)
        self.sample_count += 1
        if self.open_burst_samples >= self.burst_size:
            self.end_burst()
        return True

    def end_burst(self) -> None:
        """Close the open burst: its filtered point joins the regression history."""
        burst = self._burst
        if burst is None:
            return
        self._burst = None
        point = self._filter(burst)
        before = self.estimate() if self._history else None
        if before is not None:
            deviation = abs(point.offset_us - before.offset_at_us(point.ref_us))
            allowed = before.error_bound_us(point.ref_us) + max(point.rtt_us, 0) / 2 + STEP_THRESHOLD_US
            if deviation > allowed:
                # The clock stepped (a manual set, a VM resume, an NTP step): a line through both sides would turn
                # the step into an absurd skew, so start over from this burst.
                self._history.clear()
                self.step_count += 1
        self._history.append(point)
        self._closed_bursts += 1

    def _stepped_before(self, sample: SyncSample) -> bool:
        """The sample's offset lies outside what the current estimate allows (its error bound, plus the sample's
        own rtt/2, plus ``STEP_THRESHOLD_US``), as ``end_burst`` judges a whole burst."""
        if not self._history and self._burst is None:
            return False
        current = self.estimate()
        if current is None:
            return False
        ref_us = sample.ref_midpoint_us
        deviation = abs(sample.offset_exact_us - current.offset_at_us(ref_us))
        return deviation > current.error_bound_us(ref_us) + max(sample.rtt_us, 0) / 2 + STEP_THRESHOLD_US

    def reset(self) -> None:
        """Forget everything (e.g. the source restarted and its clock jumped)."""
        self._history.clear()
        self._burst = None
        self._closed_bursts = 0
        self.sample_count = 0

    # -- output ----------------------------------------------------------------------------------

    @property
    def burst_count(self) -> int:
        return self._closed_bursts + (1 if self._burst is not None else 0)

    @property
    def open_burst_samples(self) -> int:
        """Samples in the open burst (0 when none is open); never more than ``burst_size``."""
        return 0 if self._burst is None else self._burst.count

    def points(self) -> list[FilteredPoint]:
        """Regression points: closed bursts plus the open burst's provisional point, oldest first."""
        pts = list(self._history)
        if self._burst is not None:
            pts.append(self._filter(self._burst))
        return pts

    def estimate(self) -> ClockEstimate | None:
        """The current estimate, or None before the first sample."""
        pts = self.points()
        if not pts:
            return None
        latest = pts[-1]
        fit = self._fit(pts)
        rtt_eff = max(latest.rtt_us, self.precision_us)
        if fit is None:
            offset = latest.offset_us
            skew_ppm = 0.0
            skew_error_ppm = self.max_skew_ppm
            used = 1
        elif fit.skew_error_ppm >= self.max_skew_ppm:
            # The fit knows the skew less well than the prior does (a short baseline, or points widened by a
            # starved event loop): a line through a starved point and a clean one 1 s later can slope 2700 ppm on
            # clocks that do not drift. Capping its error at max_skew_ppm while keeping that slope made the bound a
            # lie; the estimate stays where one burst leaves it instead.
            offset = latest.offset_us
            skew_ppm = 0.0
            skew_error_ppm = self.max_skew_ppm
            used = 1
        else:
            offset = fit.offset_us
            skew_ppm = fit.skew_ppm
            skew_error_ppm = fit.skew_error_ppm
            used = fit.points_used
        offset_int = math.floor(offset + 0.5)
        # Eq. 3.14 for the selected sample, widened so that it contains the reported offset.
        root_error = rtt_eff / 2 + abs(offset_int - latest.offset_us) + self.precision_us
        return ClockEstimate(
            offset_us=offset_int,
            skew_ppm=skew_ppm,
            rtt_us=max(latest.rtt_us, 0),
            sync_ref_us=latest.ref_us,
            sample_count=self.sample_count,
            root_error_us=root_error,
            skew_error_ppm=skew_error_ppm,
            dispersion_ppm=self.dispersion_ppm,
            points_used=used,
            burst_count=self.burst_count,
        )

    # -- internals -------------------------------------------------------------------------------

    @staticmethod
    def _filter(burst: _Burst) -> FilteredPoint:
        best = burst.best
        return FilteredPoint(ref_us=best.ref_midpoint_us, offset_us=best.offset_exact_us, rtt_us=best.rtt_us)

    def _fit(self, pts: list[FilteredPoint]) -> _Fit | None:
        """Weighted regression of offset on reference time, newest point as the origin."""
        if len(pts) < MIN_REGRESSION_POINTS:
            return None
        while True:
            fit, residuals = self._weighted_line(pts)
            if fit is None:
                return None
            if abs(fit.skew_ppm) > MAX_PLAUSIBLE_SKEW_PPM:
                # No oscillator drifts this fast: the points straddle a step. Trust the newer half.
                pts = pts[len(pts) // 2 :]
                if len(pts) < MIN_REGRESSION_POINTS:
                    return None
                continue
            if len(pts) <= MIN_RUNS_TEST_POINTS or _runs_ok(residuals):
                return fit
            # Too few runs of equal residual sign: the oldest points follow a different line.
            pts = pts[len(pts) // 4 :]

    def _weighted_line(self, pts: list[FilteredPoint]) -> tuple[_Fit | None, list[float]]:
        origin = pts[-1]
        span_us = origin.ref_us - pts[0].ref_us
        if span_us < MIN_REGRESSION_SPAN_US:
            return None, []
        min_rtt = max(min(p.rtt_us for p in pts), self.precision_us)
        xs = [float(p.ref_us - origin.ref_us) for p in pts]
        ys = [p.offset_us - origin.offset_us for p in pts]
        # A point's offset error grows with its excess delay over the best point (chrony weights
        # samples by their distance over the minimum distance).
        sigmas = [
            self.precision_us + max(p.rtt_us - min_rtt, 0) / 2 + min_rtt / 8 for p in pts
        ]
        ws = [1.0 / (s * s) for s in sigmas]
        sw = math.fsum(ws)
        mx = math.fsum(w * x for w, x in zip(ws, xs, strict=True)) / sw
        my = math.fsum(w * y for w, y in zip(ws, ys, strict=True)) / sw
        sxx = math.fsum(w * (x - mx) ** 2 for w, x in zip(ws, xs, strict=True))
        if sxx <= 0.0:
            return None, []
        sxy = math.fsum(w * (x - mx) * (y - my) for w, x, y in zip(ws, xs, ys, strict=True))
        slope = sxy / sxx
        intercept = my - slope * mx  # offset at the newest point, relative to its own offset
        residuals = [y - (intercept + slope * x) for x, y in zip(xs, ys, strict=True)]
        n = len(pts)
        # The slope is linear in the offsets, slope = sum(c_i * y_i) with c_i = w_i * (x_i - mx) / sxx, and Eq. 3.14
        # puts each true offset within rtt_i/2 (+ precision) of y_i: so the true skew of a linear clock is within
        # sum(|c_i| * (rtt_i/2 + precision)) of the slope, whatever the delays were.  For two points this is
        # (rtt_a/2 + rtt_b/2 + 2 precision) / span.  A statistical error alone is not a bound: starved samples
        # are few and far from normal, and the weights of a short history can rest on one of them.
        worst = math.fsum(
            abs(w * (x - mx) / sxx) * (max(p.rtt_us, self.precision_us) / 2 + self.precision_us)
            for w, x, p in zip(ws, xs, pts, strict=True)
        )
        if n == 2:
            skew_error = worst  # no residuals to judge a line through two points by
        else:
            s2 = math.fsum(w * r * r for w, r in zip(ws, residuals, strict=True)) / (n - 2)
            # Floor the statistical error by the scale of the weights (a fit that is exact by
            # chance still knows each point only to within its sigma).
            s2 = max(s2, 1.0)
            # The statistical error still counts when the line fits worse than the intervals say (frequency
            # wander the worst case, which assumes a straight line, does not see).
            skew_error = max(worst, SKEW_COVERAGE_SIGMAS * math.sqrt(s2 / sxx))
        fit = _Fit(
            offset_us=origin.offset_us + intercept,
            skew_ppm=slope * 1e6,
            skew_error_ppm=skew_error * 1e6,
            points_used=n,
        )
        return fit, residuals


def _runs_ok(residuals: list[float]) -> bool:
    """Wald-Wolfowitz runs test on residual signs: False if there are clearly too few runs."""
    signs = [r >= 0.0 for r in residuals]
    n_pos = sum(signs)
    n_neg = len(signs) - n_pos
    if n_pos == 0 or n_neg == 0:
        return len(signs) < MIN_RUNS_TEST_POINTS
    runs = 1 + sum(1 for a, b in itertools.pairwise(signs) if a != b)
    n = n_pos + n_neg
    mean = 2.0 * n_pos * n_neg / n + 1.0
    var = (mean - 1.0) * (mean - 2.0) / (n - 1.0)
    if var <= 0.0:
        return True
    # One-sided test at ~1 %: chrony likewise only reacts to too *few* runs.
    return (runs - mean) / math.sqrt(var) > -2.33
