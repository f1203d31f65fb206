"""Timeout statistics: the thesis' smoothed means (Eq. 3.1-3.10) and a decayed quantile.

Both are plain numeric state machines; the caller feeds samples in microseconds.
"""

from __future__ import annotations

import math

from reorder.bounds import check_fraction

__all__ = ["DecayedQuantile", "SmoothedDelay"]


class SmoothedDelay:
    """Exponentially smoothed mean and mean deviation, ``value = avg + 2 * dev``.

    One class serves both thesis estimators:

    * inter-arrival of in-order events (Eq. 3.1-3.5, smoothing factor alpha),
      ``first_dev_abs=False`` because Eq. 3.5 has no absolute value;
    * time early events spent in the buffer (Eq. 3.6-3.10, smoothing factor beta),
      ``first_dev_abs=True`` as Eq. 3.10 writes it.

    The deviation of a sample is taken against the mean *before* that sample updates it.  The thesis
    cites the TCP retransmission estimator for these equations, which orders them that way, and with
    this reading Eq. 3.5 / 3.10 are exactly the first step of Eq. 3.3 / 3.8.
    """

    __slots__ = ("_first_dev_abs", "avg", "count", "dev", "weight")

    def __init__(self, weight: float, *, first_dev_abs: bool) -> None:
        if not 0.0 <= weight <= 1.0:
            raise ValueError("smoothing factor must be in [0, 1]")
        self.weight = weight
        self._first_dev_abs = first_dev_abs
        self.avg = 0.0
        self.dev = 0.0
        self.count = 0

    def update(self, sample_us: float) -> None:
        w = self.weight
        if self.count == 0:
            self.avg = sample_us  # Eq. 3.4 / 3.9
        elif self.count == 1:
            first = sample_us - self.avg  # Eq. 3.5 / 3.10
            self.dev = abs(first) if self._first_dev_abs else first
            self.avg = w * self.avg + sample_us * (1.0 - w)  # Eq. 3.2 / 3.7
        else:
            self.dev = w * self.dev + abs((sample_us - self.avg) * (1.0 - w))  # Eq. 3.3 / 3.8
            self.avg = w * self.avg + sample_us * (1.0 - w)  # Eq. 3.2 / 3.7
        self.count += 1

    @property
    def value_us(self) -> float:
        """Eq. 3.1 (``t_inter``) or Eq. 3.6 (``t_buffer``); 0 before the first sample."""
        return self.avg + 2.0 * self.dev


class DecayedQuantile:
    """Streaming upper quantile of positive delays with exponential forgetting and bounded memory.

    Samples fall into log-spaced buckets (each ``growth`` times wider than the previous), so the
    estimate is an upper bucket edge: at most ``growth - 1`` (5 %) above the true quantile, never below
    it, which errs on the side of waiting.  Instead of decaying every bucket on every sample, each new
    sample weighs ``2 ** (1 / half_life)`` times the previous one; weights are renormalised when they
    grow large.  Memory is ``O(log(max_us) / log(growth))`` whatever the number of samples.
    """

    __slots__ = (
        "_cached",
        "_counts",
        "_dirty",
        "_gain",
        "_inv_log_growth",
        "_n_buckets",
        "_recompute_every",
        "_since",
        "_total",
        "_weight",
        "count",
        "growth",
        "q",
    )

    _RENORMALISE_AT = 1e200

    def __init__(
        self,
        q: float,
        *,
        half_life_samples: float = 50_000.0,
        growth: float = 1.05,
        max_us: int = 3_600_000_000,
        recompute_every: int = 32,
    ) -> None:
        check_fraction("q", q)
        if growth <= 1.0:
            raise ValueError("growth must be > 1")
        self.q = q
        self.growth = growth
        self._inv_log_growth = 1.0 / math.log(growth)
        # The buckets are allocated at the first sample: a merge or reorderer state that never sees one (a source
        # that only said hello) costs no 3.7 KB list per stream.
        self._n_buckets = math.ceil(math.log(max_us) * self._inv_log_growth) + 2
        self._counts: list[float] = []
        self._gain = 2.0 ** (1.0 / half_life_samples)
        self._weight = 1.0
        self._total = 0.0
        self.count = 0
        self._recompute_every = recompute_every
        self._since = 0
        self._dirty = True
        self._cached = 0

    def _bucket(self, sample_us: float) -> int:
        if sample_us <= 1.0:
            return 0
        i = math.ceil(math.log(sample_us) * self._inv_log_growth)
        return min(i, self._n_buckets - 1)

    def upper_edge_us(self, bucket: int) -> int:
        return math.ceil(self.growth**bucket)

    def add(self, sample_us: float) -> None:
        i = self._bucket(sample_us)
        if not self._counts:
            self._counts = [0.0] * self._n_buckets
        self._counts[i] += self._weight
        self._total += self._weight
        self._weight *= self._gain
        if self._weight > self._RENORMALISE_AT:
            scale = 1.0 / self._weight
            self._counts = [c * scale for c in self._counts]
            self._total *= scale
            self._weight = 1.0
        self.count += 1
        self._since += 1
        # A sample above the cached quantile can only raise it: refresh at once so a new tail is
        # honoured by the very next gap; otherwise refresh lazily.
        if (i > 0 and self.upper_edge_us(i) > self._cached) or self._since >= self._recompute_every:
            self._dirty = True

    def value_us(self) -> int:
        """The q-quantile's bucket edge; 0 before any sample."""
        if not self._dirty:
            return self._cached
        self._dirty = False
        self._since = 0
        if self.count == 0:
            self._cached = 0
            return 0
        allowed_above = (1.0 - self.q) * self._total
        above = 0.0
        counts = self._counts
        for i in range(len(counts) - 1, -1, -1):
            above += counts[i]
            if above > allowed_above:
                self._cached = self.upper_edge_us(i)
                return self._cached
        self._cached = self.upper_edge_us(0)
        return self._cached
