"""Timestamp-ordering baselines of thesis section 2.3: K-slack, MP-K-slack and AQ-K-slack.

They see only the events' own timestamps (``source_ts_us``; the thesis ran them on ``ts``), keep
``t_curr`` = the largest timestamp seen, and act only when an arrival advances ``t_curr`` (section
2.3.2: "those will be performed when an event arrives that has timestamp > t_curr").  Then an event is
released when ``ts + K <= t_curr`` (Eq. 2.1; Eq. 2.2 with ``alpha * K`` for AQ-K-slack), smallest
timestamp first.  An event released behind a newer one is still released (as e_3^3 in Figure 2.6)
and also reported on the late side output.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field
from statistics import NormalDist

from reorder.estimators import DecayedQuantile
from reorder.records import Late, Released, SourceEvent

__all__ = ["AQKSlack", "AQKSlackConfig", "KSlack", "KSlackCounters", "MPKSlack", "SlackOutput"]

SlackOutput = Released | Late


@dataclass(slots=True)
class KSlackCounters:
    released: int = 0
    late: int = 0
    peak_buffered: int = 0


class KSlack:
    """K-slack with a fixed ``k_us`` chosen a priori (section 2.3.1)."""

    def __init__(self, k_us: int) -> None:
        if k_us < 0:
            raise ValueError("k_us must be >= 0")
        self.k_us = k_us
        self.t_curr_us: int | None = None
        self.counters = KSlackCounters()
        self._heap: list[tuple[int, int, SourceEvent, int]] = []
        self._order = 0
        self._last_released_ts: int | None = None

    @property
    def buffered(self) -> int:
        return len(self._heap)

    def effective_k_us(self) -> int:
        return self.k_us

    def push(self, event: SourceEvent, now_us: int) -> list[SlackOutput]:
        ts = event.source_ts_us
        heapq.heappush(self._heap, (ts, self._order, event, now_us))
        self._order += 1
        self.counters.peak_buffered = max(self.counters.peak_buffered, len(self._heap))
        if self.t_curr_us is not None and ts <= self.t_curr_us:
            self._on_behind(event, now_us)
            return []
        self.t_curr_us = ts
        self._on_advance(ts)
        return self._release(ts - self.effective_k_us(), now_us)

    def flush(self, now_us: int) -> list[SlackOutput]:
        """End of stream: release everything still held, smallest timestamp first."""
        if not self._heap:
            return []
        return self._release(max(entry[0] for entry in self._heap), now_us)

    # hooks for the adaptive variants
    def _on_behind(self, event: SourceEvent, now_us: int) -> None:
        """An arrival that does not advance ``t_curr``."""

    def _on_advance(self, t_curr_us: int) -> None:
        """``t_curr`` just advanced; adapt K before releasing."""

    def _on_release(self, event: SourceEvent, ts_us: int, output_max_ts_us: int | None) -> None:
        """An event left the buffer; ``output_max_ts_us`` is the largest timestamp released before it."""

    def _release(self, limit_ts_us: int, now_us: int) -> list[SlackOutput]:
        heap = self._heap
        out: list[SlackOutput] = []
        last = self._last_released_ts
        while heap and heap[0][0] <= limit_ts_us:
            ts, _, event, arrival_us = heapq.heappop(heap)
            self._on_release(event, ts, last)
            behind = last is not None and ts < last
            if behind:
                assert last is not None
                self.counters.late += 1
                out.append(Late(event, arrival_us, "behind_output", last - ts, True))
            else:
                last = ts
            out.append(Released(event, arrival_us, now_us, behind))
            self.counters.released += 1
        self._last_released_ts = last
        return out


class MPKSlack(KSlack):
    """MP-K-slack (section 2.3.2): K grows to the largest delay ``t_curr - ts`` seen so far."""

    def __init__(self) -> None:
        super().__init__(0)
        self.k_max_us = 0
        # smallest timestamp among the arrivals since t_curr last advanced: only it can raise K
        self._pending_min_ts: int | None = None

    def effective_k_us(self) -> int:
        return self.k_max_us

    def _on_behind(self, event: SourceEvent, now_us: int) -> None:
        ts = event.source_ts_us
        if self._pending_min_ts is None or ts < self._pending_min_ts:
            self._pending_min_ts = ts

    def _on_advance(self, t_curr_us: int) -> None:
        # action (1): K = max(K, max_i D(e_i)), D(e_i) = t_curr - e_i.ts over arrivals since the last
        # update of t_curr (the advancing event itself has D = 0)
        if self._pending_min_ts is not None:
            delay = t_curr_us - self._pending_min_ts
            self._pending_min_ts = None
            self._observe_delay(delay)
            self.k_max_us = max(self.k_max_us, delay)

    def _observe_delay(self, delay_us: int) -> None:
        """Hook: a late arrival's delay (AQ-K-slack's quantile L learns from these)."""


@dataclass(frozen=True, slots=True)
class AQKSlackConfig:
    """AQ-K-slack's knobs.  The thesis does not publish the ones it ran; these are ours."""

    epsilon_thr: float = 1e-4
    """Relative error threshold of the window aggregate (AVG of ``value``)."""
    delta: float = 0.05
    """Allowed probability of exceeding ``epsilon_thr``: P(eps > eps_thr) <= delta."""
    window_us: int = 1_000_000
    """Sliding event-time window of the aggregate whose coverage is measured..."""
    slide_us: int = 100_000
    """...and its slide: one result, one coverage measurement, one controller step per slide."""
    kp: float = 0.05
    kd: float = 0.02
    delay_quantile: float = 0.95
    """q of the q-quantile L of late-arrival delays: coverage is read L after a window's end."""
    alpha_min: float = 0.0
    value: Callable[[SourceEvent], float] | None = field(default=None)
    """Attribute aggregated by the query (the thesis used ``v_abs``); default: ``payload['v']``."""


def _default_value(event: SourceEvent) -> float:
    payload = event.payload
    if isinstance(payload, dict):
        v = payload.get("v")
        if isinstance(v, int | float):
            return float(v)
    return 1.0


class AQKSlack(MPKSlack):
    """AQ-K-slack (section 2.3.3): releases at ``ts + alpha * K <= t_curr``; a PD controller (Eq. 2.3)
    moves alpha so the measured window coverage tracks the threshold derived from (epsilon_thr, delta).

    Coverage: the query is a sliding AVG over ``window_us`` with slide ``slide_us``; the result ending at
    T is produced when the output first reaches T.  An event released behind the output maximum M
    missed every produced result that contains it, i.e. ends in ``(ts, min(ts + window, M)]``.  The
    coverage of the result ending at T is ``1 - missed / events in [T - window, T)``, read once
    ``t_curr >= T + L`` with L the q-quantile of late-arrival delays (section 2.3.3).

    Coverage threshold (our derivation of the sampling error model): the AVG over a Bernoulli sample
    of rate p of N values with coefficient of variation cv has relative standard error
    ``cv * sqrt((1 - p) / (p * N))``; requiring ``z * that <= epsilon_thr`` with
    ``z = Phi^-1(1 - delta / 2)`` gives ``p_min = z^2 cv^2 / (epsilon_thr^2 N + z^2 cv^2)``, and
    ``theta_thr = p_min``.  N and cv are measured on the stream.
    """

    def __init__(self, config: AQKSlackConfig | None = None) -> None:
        super().__init__()
        cfg = config if config is not None else AQKSlackConfig()
        if cfg.window_us % cfg.slide_us:
            raise ValueError("window_us must be a multiple of slide_us")
        self.config = cfg
        self._value = cfg.value if cfg.value is not None else _default_value
        self._z = NormalDist().inv_cdf(1.0 - cfg.delta / 2.0)
        self._k = cfg.window_us // cfg.slide_us
        self.alpha = 1.0
        self.theta_thr = 1.0
        self.last_coverage: float | None = None
        self._prev_err: float | None = None
        self._late_delay = DecayedQuantile(cfg.delay_quantile, half_life_samples=10_000)
        self._arrivals: dict[int, int] = {}  # slide bucket -> events
        self._missed: dict[int, int] = {}  # result index (end = index * slide) -> events it missed
        self._measured_upto: int | None = None
        self._n = 0
        self._mean = 0.0
        self._m2 = 0.0
        self.adjustments = 0

    def effective_k_us(self) -> int:
        return int(self.alpha * self.k_max_us)

    def push(self, event: SourceEvent, now_us: int) -> list[SlackOutput]:
        b = event.source_ts_us // self.config.slide_us
        self._arrivals[b] = self._arrivals.get(b, 0) + 1
        x = self._value(event)
        self._n += 1
        d = x - self._mean
        self._mean += d / self._n
        self._m2 += d * (x - self._mean)
        return super().push(event, now_us)

    def _observe_delay(self, delay_us: int) -> None:
        self._late_delay.add(delay_us)

    def _on_release(self, event: SourceEvent, ts_us: int, output_max_ts_us: int | None) -> None:
        if output_max_ts_us is None or ts_us >= output_max_ts_us:
            return
        slide = self.config.slide_us
        b = ts_us // slide
        last_produced = output_max_ts_us // slide
        missed = self._missed
        for r in range(b + 1, min(b + self._k, last_produced) + 1):
            missed[r] = missed.get(r, 0) + 1

    def _on_advance(self, t_curr_us: int) -> None:
        super()._on_advance(t_curr_us)
        out_max = self._last_released_ts
        if out_max is None:
            return
        slide = self.config.slide_us
        lag_us = self._late_delay.value_us() if self._late_delay.count else self.k_max_us
        upto = min((t_curr_us - lag_us) // slide, out_max // slide)
        if self._measured_upto is None:
            first_bucket = min(self._arrivals) if self._arrivals else upto
            self._measured_upto = first_bucket + self._k - 1  # first full window
        while self._measured_upto < upto:
            self._measured_upto += 1
            r = self._measured_upto
            total = sum(self._arrivals.get(b, 0) for b in range(r - self._k, r))
            self._arrivals.pop(r - self._k, None)  # no later result needs that bucket
            missed = self._missed.pop(r, 0)
            if total:
                self._adjust(1.0 - missed / total, total)

    def _threshold(self, n_per_window: int) -> float:
        if self._n < 2:
            return 1.0
        mean = self._mean
        std = (self._m2 / (self._n - 1)) ** 0.5
        cv2 = (std / mean) ** 2 if mean != 0 else 1.0
        zc = self._z * self._z * cv2
        return zc / (self.config.epsilon_thr**2 * n_per_window + zc)

    def _adjust(self, coverage: float, n_per_window: int) -> None:
        cfg = self.config
        self.theta_thr = self._threshold(n_per_window)
        self.last_coverage = coverage
        # Eq. 2.3's control error theta_thr - theta, in units of the allowed miss rate 1 - theta_thr:
        # coverage errors are tiny fractions, and this keeps one set of gains meaningful whatever
        # (epsilon_thr, delta) the user asks for (err = -1 at perfect coverage).  Clipped to +-1 so a
        # single result that missed a burst cannot slam alpha from one bound to the other.
        allowed_miss = max(1.0 - self.theta_thr, 1e-9)
        err = min(1.0, max(-1.0, (self.theta_thr - coverage) / allowed_miss))
        derr = 0.0 if self._prev_err is None else err - self._prev_err
        self._prev_err = err
        self.alpha = min(1.0, max(cfg.alpha_min, self.alpha + cfg.kp * err + cfg.kd * derr))
        self.adjustments += 1
