"""IO3's metrics as cep.intervals.metrics defines them (issue 16, Deliver 5): exact values on hand-computed cases."""

from __future__ import annotations

import pytest

from cep.intervals import (
    Interval,
    IntervalEngine,
    IntervalEngineConfig,
    IntervalOutput,
    LatencyStats,
    accuracy,
    compensation,
    latency,
    parse_iseq,
    result_key,
)
from cep.intervals.events import OutputKind

A1 = Interval("A", 0, 1, event_id="a1")
A2 = Interval("A", 2, 3, event_id="a2")
A3 = Interval("A", 4, 5, event_id="a3")
K1, K2, K3 = result_key((A1,)), result_key((A2,)), result_key((A3,))


def rec(kind: OutputKind, member: Interval | None = None, emitted_at_seq: int = 0,
        last_member_seq: int = 0) -> IntervalOutput:
    members = () if member is None else (member,)
    return IntervalOutput(kind, members, 0, emitted_at_seq, last_member_seq)


# -- latency ------------------------------------------------------------------------------------------------------
def test_latency_counts_positive_records_only_from_their_last_members_arrival() -> None:
    arrival_us = [0, 10, 25, 40, 100]
    outputs = [
        rec("match", A1, emitted_at_seq=1, last_member_seq=1),  # at once: 0
        rec("add", A2, emitted_at_seq=3, last_member_seq=1),  # 40 - 10 = 30
        rec("retract", A2, emitted_at_seq=4, last_member_seq=1),  # not a positive record
        rec("match", A3, emitted_at_seq=4, last_member_seq=2),  # 100 - 25 = 75
        rec("too_late", None, emitted_at_seq=2, last_member_seq=-1),
    ]
    # sorted [0, 30, 75]: mean 35, p50 = element 1, p99 = element min(2, int(2.97)) = 2
    assert latency(outputs, arrival_us) == LatencyStats(3, 35.0, 30.0, 75.0, 75)


def test_latency_percentiles_index_the_sorted_list() -> None:
    arrival_us = list(range(0, 2000, 10))  # 200 items, 10 us apart
    outputs = [rec("match", A1, emitted_at_seq=i, last_member_seq=0) for i in reversed(range(200))]
    # latencies 0, 10, ..., 1990: p50 = element 100, p99 = element int(0.99 * 200) = 198
    assert latency(outputs, arrival_us) == LatencyStats(200, 995.0, 1000.0, 1980.0, 1990)


def test_latency_of_no_positive_record_is_all_zero() -> None:
    assert latency([rec("retract", A1, 1, 0)], [0, 5]) == LatencyStats(0, 0.0, 0.0, 0.0, 0)


@pytest.mark.parametrize(("mode", "expected_us"), [("conservative", 150), ("aggressive", 0)])
def test_latency_of_an_engine_run_is_the_wait_for_the_negation_bound(mode: str, expected_us: int) -> None:
    """K = 5: <a0, c4> is complete at c4|6 (arrival 200 us) but a D ending before c.ts = 4 may still come until
    CLOCK - K >= 4, i.e. until x9|9 (arrival 350 us).  Aggressive mode emits at once."""
    query = parse_iseq("EVENT ISEQ[a.te < d.ts AND d.te < c.ts AND a.te < c.ts](A a, !D d, C c; 20)")
    engine = IntervalEngine(query, IntervalEngineConfig(k_slack_us=5, mode=mode))  # type: ignore[arg-type]
    out = engine.feed([Interval("A", 0, 1, event_id="a0"), Interval("C", 4, 6, event_id="c4"),
                       Interval("X", 9, 9, event_id="x9")])
    assert [(o.kind, o.emitted_at_seq, o.last_member_seq) for o in out] == [
        ("match", 2 if mode == "conservative" else 1, 1)]
    assert latency(out, [100, 200, 350]) == LatencyStats(1, float(expected_us), float(expected_us),
                                                        float(expected_us), expected_us)


# -- accuracy -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("outputs", "oracle", "precision", "recall", "exact"), [
    # a wrong result emitted then retracted: 2 of 3 positive records right, the net is the oracle
    ([rec("match", A1), rec("add", A3), rec("retract", A3), rec("match", A2)], [K1, K2], 2 / 3, 1.0, True),
    # a wrong result never retracted, a right one missing
    ([rec("match", A1), rec("match", A3)], [K1, K2], 0.5, 0.5, False),
    # a right result emitted twice: every record is right, recall counts it once, the net is not the oracle
    ([rec("match", A1), rec("add", A1)], [K1], 1.0, 1.0, False),
    # a right result retracted for good
    ([rec("match", A1), rec("retract", A1)], [K1], 1.0, 0.0, False),
    # nothing emitted
    ([], [K1], 1.0, 0.0, False),
    ([], [], 1.0, 1.0, True),
    # too_late records are not results
    ([rec("too_late", None, 0, -1), rec("match", A2)], [K2, K3], 1.0, 0.5, False),
])
def test_accuracy_precision_and_recall(outputs: list[IntervalOutput], oracle: list[tuple[tuple[str, int, int,
                                       str | None], ...]], precision: float, recall: float, exact: bool) -> None:
    got = accuracy(outputs, oracle)
    assert (got.precision, got.recall, got.exact) == (precision, recall, exact)


def test_compensation_counts_and_rate() -> None:
    outputs = [rec("match", A1), rec("retract", A1), rec("add", A1), rec("match", A2), rec("retract", A2)]
    c = compensation(outputs)
    assert (c.positives, c.retractions, c.re_adds) == (3, 2, 1)
    assert c.rate == 2 / 3
    assert compensation([]).rate == 0.0
