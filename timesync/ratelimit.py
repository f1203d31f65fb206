"""Per-address token bucket.  Pure: the caller passes the current time."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

__all__ = ["RateLimiter"]

#: Addresses tracked at once.  A spoofed flood from many addresses evicts the least recently seen
#: entries instead of growing memory without limit (chrony's ratelimit table is bounded likewise).
DEFAULT_MAX_TRACKED = 65_536


@dataclass(slots=True)
class _Bucket:
    tokens: float
    last_us: int


class RateLimiter:
    """Allow ``rate_per_s`` requests per second per key with bursts up to ``burst``.

    ``rate_per_s <= 0`` disables limiting.
    """

    def __init__(self, rate_per_s: float, burst: int, max_tracked: int = DEFAULT_MAX_TRACKED) -> None:
        if burst < 1:
            raise ValueError("burst must be >= 1")
        self.rate_per_s = rate_per_s
        self.burst = burst
        self.max_tracked = max_tracked
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()

    def __len__(self) -> int:
        return len(self._buckets)

    def allow(self, key: str, now_us: int) -> bool:
        if self.rate_per_s <= 0:
            return True
        bucket = self._buckets.get(key)
        if bucket is None:
            if len(self._buckets) >= self.max_tracked:
                self._buckets.popitem(last=False)
            bucket = _Bucket(tokens=float(self.burst), last_us=now_us)
            self._buckets[key] = bucket
        else:
            self._buckets.move_to_end(key)
            elapsed_us = max(now_us - bucket.last_us, 0)  # a clock step backwards refills nothing
            bucket.tokens = min(float(self.burst), bucket.tokens + elapsed_us * self.rate_per_s / 1e6)
            bucket.last_us = max(bucket.last_us, now_us)
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            return True
        return False
