"""Timestamp-ordering baselines of thesis section 2.3: K-slack, MP-K-slack and AQ-K-slack.

They see only the events' own timestamps (``source_ts_us``; the thesis ran them on ``ts``), keep
``t_curr`` = the largest timestamp seen, and act only when an arrival advances ``t_curr`` (section
2.3.2: "those will be performed when an event arrives that has timestamp > t_curr").  Then an event is
released when ``ts + K <= t_curr`` (Eq. 2.1), smallest timestamp first.  An event released behind a newer
one is still released (as e_3^3 in Figure 2.6) and also reported on the late side output.

The thesis ran its baselines as Siddhi's reorder extensions (Query 5.4 ``reorder:kslack(ts)``, Query 5.5
``reorder:akslack(ts, v_abs)``).  Siddhi's ``kslack(ts)`` is what this module calls MP-K-slack (K grows to
the largest delay seen).  :class:`AQKSlack` is Siddhi's ``akslack`` with its defaults, re-implemented from
the thesis (section 2.3.3) and the extension's documented behaviour: see its docstring.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from statistics import NormalDist

from reorder.records import Late, Released, SourceEvent

__all__ = [
    "AQKSlack",
    "AQKSlackConfig",
    "AlphaController",
    "KSlack",
    "KSlackCounters",
    "MPKSlack",
    "SlackOutput",
    "runtime_window_coverage",
    "window_coverage_threshold",
]

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
    """AQ-K-slack's knobs: the defaults of Siddhi's ``reorder:akslack`` (Query 5.5 passes only ``ts, v_abs``)."""

    batch_size: int = 10_000
    """alpha is re-estimated once every ``batch_size + 1`` events (the extension's counter must pass it)."""
    error_threshold: float = 0.03
    """epsilon_thr: relative error threshold of the query's result."""
    confidence: float = 0.95
    """Confidence level; the critical value is ``|Phi^-1((1 - confidence) / 2)|`` (1.96 at 0.95)."""
    kp: float = 0.5
    kd: float = 0.8
    window: int = 10_000_000_000
    """Span of the runtime coverage measurement, in the stream's timestamp unit (the extension's fixed 10^10)."""
    max_k: int | None = None
    """Upper bound of K (None: unbounded, the extension's default)."""
    value: Callable[[SourceEvent], float] | None = field(default=None)
    """The correlation field (the thesis used ``v_abs``); default: ``payload['v']``, else 1."""


def _default_value(event: SourceEvent) -> float:
    payload = event.payload
    if isinstance(payload, dict):
        v = payload.get("v")
        if isinstance(v, int | float):
            return float(v)
    return 1.0


def _round_half_up(x: float) -> int:
    """Java's ``Math.round``: the extension rounds K and L this way (Python's round() rounds half to even)."""
    return math.floor(x + 0.5)


def window_coverage_threshold(values: list[float], critical_value: float, error_threshold: float) -> float:
    """theta_thr from the batch's correlation values, as the extension computes it.

    With ``t = z^2 (m^2 + v^2) / (n m^2)`` (m the mean, v the population variance; the extension squares the
    variance where the sampling model has the standard deviation), theta_thr is the smallest root of
    ``(1 + t) x^2 + (2 e - 2 - t) x + (1 - e)^2`` and ``(1 + t) x^2 - (2 + 2 e + t) x + (1 + e)^2``, over those
    with real roots (0 if neither has any).  A mean of 0 gives NaN, as in the extension.
    """
    n = len(values)
    mean = sum(values) / n
    variance = sum((mean - x) ** 2 for x in values) / n
    try:
        t = critical_value**2 * ((mean**2 + variance**2) / (n * mean**2))
    except ZeroDivisionError:
        return math.nan
    e = error_threshold
    a = 1.0 + t
    roots: list[float] = []
    for b, c in ((2 * e - 2 - t, (1 - e) ** 2), (-(2 + 2 * e + t), (1 + e) ** 2)):
        disc = b * b - 4 * a * c
        if disc >= 0:
            roots += [(-b - math.sqrt(disc)) / (2 * a), (-b + math.sqrt(disc)) / (2 * a)]
    return min(roots) if roots else 0.0


def runtime_window_coverage(current_ts: int, timestamps: list[int], l_units: int, window: int) -> float:
    """theta of the window ``[current - L - window, current - L]``, as the extension measures it.

    ``timestamps`` holds every timestamp received, in arrival order.  The events of the window are covered when
    they arrived before the first arrival whose timestamp reached the window's end (``>= current - L``): those
    the output had before it passed the window.  Timestamps ``<= current - L - window`` are removed from the list
    (no later window reaches them).  An empty window has coverage 1.
    """
    high = current_ts - l_units
    low = high - window
    covered = total = 0
    high_met = False
    kept: list[int] = []
    for ts in timestamps:
        if not high_met and ts >= high:
            high_met = True
        if low <= ts <= high:
            total += 1
            if not high_met:
                covered += 1
        if ts > low:
            kept.append(ts)
    timestamps[:] = kept
    return covered / total if total else 1.0


@dataclass(slots=True)
class AlphaController:
    """The PD controller of Eq. 2.3 as the extension runs it: ``err = theta_thr - theta``,
    ``alpha <- |alpha_prev + kp err + kd (err - err_prev)|``, from ``alpha_prev = 0`` and ``err_prev = 0``.

    Not clipped to [0, 1] (the thesis' alpha range); the absolute value keeps it non-negative.  The first
    estimate (no L yet) uses theta = 1, so it starts from ``(kp + kd) (theta_thr - 1)`` in absolute value."""

    kp: float
    kd: float
    alpha: float = 0.0
    previous_error: float = 0.0

    def step(self, threshold: float, coverage: float) -> float:
        error = threshold - coverage
        self.alpha = abs(self.alpha + self.kp * error + self.kd * (error - self.previous_error))
        self.previous_error = error
        return self.alpha


class AQKSlack(KSlack):
    """AQ-K-slack (section 2.3.3) as Siddhi's ``reorder:akslack`` runs it (the thesis' baseline, Query 5.5).

    Per arrival: its timestamp joins the coverage list and its correlation value the batch.  Once the batch
    passes ``batch_size`` events, alpha is re-estimated (:class:`AlphaController`) from the batch's coverage
    threshold (:func:`window_coverage_threshold`) and the runtime coverage of the window ending ``L`` before
    the arrival (:func:`runtime_window_coverage`; coverage 1 while ``L = 0``), then
    ``L = min(round(alpha K), K)`` and the batch starts over.  When the arrival advances ``t_curr``, the delay
    ``t_curr - (smallest timestamp arrived since the last advance)`` is compared with K: only a larger delay
    changes K, to ``round(delay * alpha)`` (``max_k`` if the delay reaches it).  Events are released when
    ``ts + K <= t_curr`` (Eq. 2.2: alpha is already inside K).  alpha starts at 1, so AQ-K-slack is MP-K-slack
    until the first estimate.
    """

    def __init__(self, config: AQKSlackConfig | None = None) -> None:
        super().__init__(0)
        cfg = config if config is not None else AQKSlackConfig()
        if cfg.batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        self.config = cfg
        self._value = cfg.value if cfg.value is not None else _default_value
        self.critical_value = abs(NormalDist().inv_cdf((1.0 - cfg.confidence) / 2.0))
        self.controller = AlphaController(cfg.kp, cfg.kd)
        self.alpha = 1.0
        self.k = 0
        self.l_units = 0
        """L: how far behind the latest arrival the coverage window ends."""
        self.theta_thr: float | None = None
        self.last_coverage: float | None = None
        self.adjustments = 0
        self._timestamps: list[int] = []
        self._batch: list[float] = []
        self._counter = 0
        self._pending_min_ts: int | None = None
        self.t_curr_us = 0  # the extension's largestTimestamp starts at 0

    def effective_k_us(self) -> int:
        return self.k

    def push(self, event: SourceEvent, now_us: int) -> list[SlackOutput]:
        ts = event.source_ts_us
        self._timestamps.append(ts)
        self._batch.append(self._value(event))
        self._counter += 1
        if self._counter > self.config.batch_size:
            self._estimate(ts)
        return super().push(event, now_us)

    def _estimate(self, current_ts: int) -> None:
        cfg = self.config
        self.theta_thr = window_coverage_threshold(self._batch, self.critical_value, cfg.error_threshold)
        if self.l_units == 0:
            coverage = 1.0
        else:
            coverage = runtime_window_coverage(current_ts, self._timestamps, self.l_units, cfg.window)
        self.last_coverage = coverage
        self.alpha = self.controller.step(self.theta_thr, coverage)
        self.l_units = min(_round_half_up(self.alpha * self.k), self.k)
        self._counter = 0
        self._batch = []
        self.adjustments += 1

    def _on_behind(self, event: SourceEvent, now_us: int) -> None:
        ts = event.source_ts_us
        if self._pending_min_ts is None or ts < self._pending_min_ts:
            self._pending_min_ts = ts

    def _on_advance(self, t_curr_us: int) -> None:
        # the advancing event itself is among the arrivals since the last advance, with delay 0
        pending = self._pending_min_ts
        self._pending_min_ts = None
        delay = 0 if pending is None else t_curr_us - pending
        if delay > self.k:
            max_k = self.config.max_k
            self.k = _round_half_up(delay * self.alpha) if max_k is None or delay < max_k else max_k
