"""Percentiles of the benchmarks' samples, one definition each, so that figures of different benchmarks compare.

Two definitions are in use and both are kept, since changing either would move published figures:

* :func:`percentile` (the latency and throughput benchmarks, the reliability load run): ``q`` is a fraction, and
  the result is the sorted sample at 0-based index ``floor(q * n)``, clamped to the last one;
* :func:`percentile_nearest` (the time-sync accuracy benchmark): ``percent`` is in percent, and the result is the
  sorted sample nearest to position ``percent / 100 * (n - 1)`` (a tie goes to the even index, as ``round``
  does).

Both return NaN for no samples: a benchmark row without samples shows ``nan`` rather than failing the run.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["percentile", "percentile_nearest"]


def percentile(values: Sequence[float], q: float) -> float:
    """The sorted sample at index ``floor(q * n)`` (clamped to the last); ``q`` in [0, 1]."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return float(ordered[min(len(ordered) - 1, int(q * len(ordered)))])


def percentile_nearest(values: Sequence[float], percent: float) -> float:
    """The sorted sample nearest to position ``percent / 100 * (n - 1)``; ``percent`` in [0, 100]."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return float(ordered[min(len(ordered) - 1, max(0, round(percent / 100 * (len(ordered) - 1))))])
