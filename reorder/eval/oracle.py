"""The oracle: knows the whole trace and holds each event exactly as long as 100 % order requires.

An event may leave only when every event that precedes it in the true order has arrived, so its
earliest possible release is ``max(arrival of every event with a smaller or equal true timestamp)``.
Releasing every event at exactly that time gives a perfectly ordered output with the least latency any
reorderer can achieve: the lower bound the others are compared with.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["oracle_schedule"]


def oracle_schedule(true_ts_us: Sequence[int], arrival_us: Sequence[int]) -> list[tuple[int, int]]:
    """Return ``(index, release_us)`` in release order for events given by parallel sequences.

    Ties in the true timestamp are released in arrival order (then index), so the schedule is fully
    deterministic.
    """
    if len(true_ts_us) != len(arrival_us):
        raise ValueError("true_ts_us and arrival_us must have the same length")
    order = sorted(range(len(true_ts_us)), key=lambda i: (true_ts_us[i], arrival_us[i], i))
    schedule: list[tuple[int, int]] = []
    frontier = None
    for i in order:
        a = arrival_us[i]
        frontier = a if frontier is None or a > frontier else frontier
        schedule.append((i, frontier))
    return schedule
