"""Time-sync exchanges simulated on a trace's own clocks, fed to ``timesync.estimator``.

The replay never reads a source's offset from the trace.  It only knows, for each source, how its
clock reads against true time (a line through the trace's ``(true_ts_us, source_ts_us)`` pairs, which
is exact for the generator's offset + skew clocks), and plays NTP-style exchanges over a simulated
network: ``t1 = C(T)``, ``t2 = T + d_up``, ``t3 = t2 + turnaround``, ``t4 = C(t3 + d_down)`` with random
one-way delays.  The estimator sees only those four timestamps, as the gateway would.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from timesync.estimator import ClockEstimate, ClockEstimator, SyncSample

__all__ = ["SourceClockModel", "SyncPlan", "SyncRound", "plan_sync"]


@dataclass(frozen=True, slots=True)
class SourceClockModel:
    """``C(t) = source_at_anchor + (t - true_anchor) * rate``."""

    true_anchor_us: int
    source_at_anchor_us: int
    rate: float

    def read(self, true_us: int) -> int:
        return self.source_at_anchor_us + round((true_us - self.true_anchor_us) * self.rate)

    @classmethod
    def fit(cls, pairs: Sequence[tuple[int, int]]) -> SourceClockModel:
        """From (true_ts_us, source_ts_us) pairs: anchored at the first, rate from first to last."""
        first = min(pairs)
        last = max(pairs)
        span = last[0] - first[0]
        rate = (last[1] - first[1]) / span if span > 0 else 1.0
        return cls(first[0], first[1], rate)


@dataclass(frozen=True, slots=True)
class SyncRound:
    """One burst of exchanges; its estimate is usable from ``effective_us`` (reference clock) on."""

    source_id: str
    started_us: int
    effective_us: int
    source_clock_at_start_us: int
    estimate: ClockEstimate | None


@dataclass(frozen=True, slots=True)
class SyncPlan:
    exchanges_per_round: int = 8
    exchange_spacing_us: int = 2_000
    interval_us: int = 1_000_000
    lead_us: int = 200_000
    """The first round starts this long before the source's first event (sync before publishing)."""
    one_way_base_us: int = 200
    one_way_jitter_mean_us: int = 50
    turnaround_us: int = 20


def plan_sync(
    source_id: str,
    clock: SourceClockModel,
    first_true_us: int,
    end_us: int,
    plan: SyncPlan,
    seed: int,
) -> list[SyncRound]:
    """Run every round for one source from before its first event to ``end_us``; deterministic per seed."""
    rng = random.Random(f"sync/{seed}/{source_id}")
    est = ClockEstimator()
    rounds: list[SyncRound] = []
    start = first_true_us - plan.lead_us
    while start <= end_us:
        t = start
        done = start
        for _ in range(plan.exchanges_per_round):
            up = plan.one_way_base_us + int(rng.expovariate(1.0 / plan.one_way_jitter_mean_us))
            down = plan.one_way_base_us + int(rng.expovariate(1.0 / plan.one_way_jitter_mean_us))
            t2 = t + up
            t3 = t2 + plan.turnaround_us
            back = t3 + down
            est.add_sample(SyncSample(clock.read(t), t2, t3, clock.read(back)))
            done = back
            t += plan.exchange_spacing_us
        est.end_burst()
        rounds.append(SyncRound(source_id, start, done, clock.read(start), est.estimate()))
        start += plan.interval_us
    return rounds
