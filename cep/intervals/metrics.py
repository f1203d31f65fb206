"""IO3's evaluation metrics, which the paper names but does not define, defined here (see docs/intervals.md).

* **Rate of compensation** = NoC / NoR: NoC the number of (-) compensations (``retract``), NoR the number of
  positive records (``match`` + ``add``).  Raw counts are reported too.  0 in conservative mode by construction.
* **Accuracy** against the complete stream (the oracle: the reference evaluator over the sorted, complete input):
  ``precision`` = positive records whose result is in the oracle / positive records (what a consumer acting on
  each record at once gets right); ``recall`` = net results (positives minus retractions) in the oracle / oracle
  size; ``exact`` = the net multiset equals the oracle.
* **Latency** of a positive record = arrival time of the item that produced it minus arrival time of the result's
  last member (0 when emitted at once; a conservative negation result waits for its bound plus K).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .events import IntervalOutput

__all__ = ["Accuracy", "Compensation", "LatencyStats", "accuracy", "compensation", "latency", "net_results"]

Key = tuple[tuple[str, int, int, str | None], ...]


@dataclass(frozen=True, slots=True)
class Compensation:
    positives: int
    retractions: int
    re_adds: int
    """``add`` records that restore a retracted result (part of NoR)."""

    @property
    def rate(self) -> float:
        return self.retractions / self.positives if self.positives else 0.0


@dataclass(frozen=True, slots=True)
class Accuracy:
    precision: float
    recall: float
    exact: bool


@dataclass(frozen=True, slots=True)
class LatencyStats:
    count: int
    mean_us: float
    p50_us: float
    p99_us: float
    max_us: int


def net_results(outputs: Iterable[IntervalOutput]) -> Counter[Key]:
    """Each result's net count: +1 per ``match``/``add``, -1 per ``retract``; zero entries removed."""
    net: Counter[Key] = Counter()
    for o in outputs:
        if o.sign:
            net[o.key] += o.sign
    return +net


def compensation(outputs: Iterable[IntervalOutput]) -> Compensation:
    pos = neg = re_adds = 0
    retracted: set[Key] = set()
    for o in outputs:
        if o.kind in ("match", "add"):
            pos += 1
            if o.key in retracted:
                re_adds += 1
                retracted.discard(o.key)
        elif o.kind == "retract":
            neg += 1
            retracted.add(o.key)
    return Compensation(pos, neg, re_adds)


def accuracy(outputs: Sequence[IntervalOutput], oracle: Iterable[Key]) -> Accuracy:
    truth = Counter(oracle)
    positives = [o for o in outputs if o.kind in ("match", "add")]
    precision = sum(1 for o in positives if o.key in truth) / len(positives) if positives else 1.0
    net = net_results(outputs)
    hit = sum(min(n, truth[k]) for k, n in net.items())
    recall = hit / sum(truth.values()) if truth else 1.0
    return Accuracy(precision, recall, net == truth)


def latency(outputs: Iterable[IntervalOutput], arrival_us: Sequence[int]) -> LatencyStats:
    """``arrival_us[i]`` is the arrival time of the i-th item fed to the engine."""
    lat = sorted(arrival_us[o.emitted_at_seq] - arrival_us[o.last_member_seq]
                 for o in outputs if o.kind in ("match", "add") and o.last_member_seq >= 0)
    if not lat:
        return LatencyStats(0, 0.0, 0.0, 0.0, 0)
    return LatencyStats(len(lat), sum(lat) / len(lat), float(lat[len(lat) // 2]),
                        float(lat[min(len(lat) - 1, int(0.99 * len(lat)))]), lat[-1])
