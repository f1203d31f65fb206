"""A fixed-bucket latency histogram of plain integers, for the gateway's hot path.

Observing is one bisect and three integer increments: no lock, no label lookup, no float. The metrics collector
(gateway/metrics.py) turns the counts into a Prometheus Histogram in seconds at scrape time. Counts only grow, so
Prometheus' rate() and histogram_quantile() work on them across scrapes.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Sequence

# Kafka delivery latency (release to the broker's ack): from a local broker's sub-millisecond acks to a stalled
# cluster's seconds. Upper bounds, inclusive, in microseconds; a last +Inf bucket is implied.
DELIVERY_LATENCY_BUCKETS_US: tuple[int, ...] = (
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 2_500_000, 5_000_000, 10_000_000)


class Histogram:
    """Counts per bucket (not cumulative; the last is +Inf), their sum and count."""

    __slots__ = ("bounds_us", "count", "counts", "sum_us")

    def __init__(self, bounds_us: Sequence[int] = DELIVERY_LATENCY_BUCKETS_US) -> None:
        if list(bounds_us) != sorted(set(bounds_us)):
            raise ValueError(f"bucket bounds must be strictly increasing: {list(bounds_us)}")
        self.bounds_us: tuple[int, ...] = tuple(bounds_us)
        self.counts: list[int] = [0] * (len(self.bounds_us) + 1)
        self.sum_us = 0
        self.count = 0

    def observe_us(self, value_us: int) -> None:
        # bisect_left: a value equal to a bound belongs to that bound's bucket (Prometheus' `le`, less or equal).
        self.counts[bisect_left(self.bounds_us, value_us)] += 1
        self.sum_us += value_us
        self.count += 1

    def observe_all_us(self, values_us: Iterable[int]) -> None:
        for value_us in values_us:
            self.observe_us(value_us)

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound in seconds, count of observations <= it) per bucket, +Inf last: Prometheus' buckets."""
        buckets: list[tuple[float, int]] = []
        running = 0
        for bound_us, n in zip((*self.bounds_us, None), self.counts, strict=True):
            running += n
            buckets.append((float("inf") if bound_us is None else bound_us / 1_000_000, running))
        return buckets

    @classmethod
    def merged(cls, histograms: Iterable[Histogram], bounds_us: Sequence[int] = DELIVERY_LATENCY_BUCKETS_US,
               ) -> Histogram:
        """The sum of histograms with the same bounds (e.g. one per shard)."""
        total = cls(bounds_us)
        for histogram in histograms:
            if histogram.bounds_us != total.bounds_us:
                raise ValueError(f"cannot merge buckets {histogram.bounds_us} into {total.bounds_us}")
            total.counts = [a + b for a, b in zip(total.counts, histogram.counts, strict=True)]
            total.sum_us += histogram.sum_us
            total.count += histogram.count
        return total
