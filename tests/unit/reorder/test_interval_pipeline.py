"""Interval events through the ordering pipeline and the gateway's ingest core, on virtual time: both endpoints of
an atomic interval mapped to the reference clock with their own error bounds, endpoint events carried as point
events with their id, ordering by the end (issue 16 item 1)."""

from __future__ import annotations

import orjson

from contract.topics import TopicNames
from contract.wire.messages import AtomicInterval, IncomingEvent, IntervalEndpoint
from gateway.ingest import ConnectionId, IngestCore, Produce
from reorder.pipeline import IngestPipeline, PublishRecord
from timesync.clocks import EstimateMapping
from timesync.estimator import ClockEstimate
from timesync.store import SourceInfo

T0 = 1_700_000_000_000_000
# Source "a" runs 5 ms behind the reference clock and gains 100 ppm on it (since T0); the bound starts at 40 us and
# grows by 3 ppm of the time since T0 (2 ppm skew error + 1 ppm dispersion).
ESTIMATE = ClockEstimate(offset_us=5_000, skew_ppm=100.0, rtt_us=80, sync_ref_us=T0, sample_count=8,
                         root_error_us=40.0, skew_error_ppm=2.0, dispersion_ppm=1.0)
# Ground truth by hand (t_ref = t + offset + skew * (t + offset - T0); bound = ceil(40 + 3e-6 * |t_ref - T0|)):
START_SRC = T0 + 1_000_000 - 5_000  # offset there: 5_000 + 100 = 5_100
START_REF, START_ERR = T0 + 1_000_100, 44  # 40 + 3.0003
END_SRC = T0 + 3_000_000 - 5_000  # offset there: 5_000 + 300 = 5_300
END_REF, END_ERR = T0 + 3_000_300, 50  # 40 + 9.0009
POINT_SRC = T0 + 2_000_000 - 5_000  # offset 5_200
POINT_REF, POINT_ERR = T0 + 2_000_200, 47  # 40 + 6.0006
ARRIVAL = T0 + 3_100_000


def mapping() -> EstimateMapping:
    clock = EstimateMapping()
    clock.update("a", ESTIMATE)
    return clock


def fields(record: object) -> tuple[object, ...]:
    return tuple(getattr(record, name) for name in (
        "seq", "source_ts_us", "ref_ts_us", "uncertainty_us", "start_ts_us", "start_uncertainty_us",
        "source_start_ts_us", "interval_id", "endpoint", "late", "late_reason"))


def test_the_estimate_maps_as_the_ground_truth_says() -> None:
    clock = mapping()
    assert clock.to_reference("a", START_SRC) == (START_REF, START_ERR)
    assert clock.to_reference("a", END_SRC) == (END_REF, END_ERR)
    assert clock.to_reference("a", POINT_SRC) == (POINT_REF, POINT_ERR)


def test_in_order_frame_maps_both_endpoints_of_an_atomic_interval() -> None:
    pipe = IngestPipeline(mapping())
    pipe.register("a", ("s",), ARRIVAL)
    out = pipe.push_many("a", [
        IncomingEvent("s", 0, POINT_SRC, {"p": 0}),
        IncomingEvent("s", 1, END_SRC, {"p": 1}, AtomicInterval(START_SRC)),
        IncomingEvent("s", 2, END_SRC, None, IntervalEndpoint("run-1", "end")),
    ], ARRIVAL)
    records = [o.record for o in out if isinstance(o, PublishRecord)]
    assert [o.topic for o in out if isinstance(o, PublishRecord)] == ["events"] * 3
    # A point event's record keeps its start fields None: its JSON leaves them out (start = end).
    assert [fields(r) for r in records] == [
        (0, POINT_SRC, POINT_REF, POINT_ERR, None, None, None, None, None, False, None),
        (1, END_SRC, END_REF, END_ERR, START_REF, START_ERR, START_SRC, None, None, False, None),
        (2, END_SRC, END_REF, END_ERR, END_REF, END_ERR, END_SRC, "run-1", "end", False, None),
    ]
    value = orjson.loads(records[1].to_json())
    assert (value["start_ts_us"], value["end_ts_us"], value["start_uncertainty_us"], value["uncertainty_us"],
            value["source_start_ts_us"], value["v"]) == (START_REF, END_REF, START_ERR, END_ERR, START_SRC, 2)


def test_buffered_interval_and_its_late_duplicate_carry_the_same_fields() -> None:
    pipe = IngestPipeline(mapping())
    pipe.register("a", ("s",), ARRIVAL)
    interval = IncomingEvent("s", 1, END_SRC, "x", AtomicInterval(START_SRC))
    assert [o for o in pipe.push("a", interval, ARRIVAL) if isinstance(o, PublishRecord)] == []  # waits for seq 0
    out = pipe.push("a", IncomingEvent("s", 0, START_SRC, None, IntervalEndpoint("run-2", "start")), ARRIVAL + 1)
    assert [fields(o.record) for o in out if isinstance(o, PublishRecord)] == [
        (0, START_SRC, START_REF, START_ERR, START_REF, START_ERR, START_SRC, "run-2", "start", False, None),
        (1, END_SRC, END_REF, END_ERR, START_REF, START_ERR, START_SRC, None, None, False, None),
    ]
    late = [o for o in pipe.push("a", interval, ARRIVAL + 2) if isinstance(o, PublishRecord)]
    assert [(o.topic, fields(o.record)) for o in late] == [
        ("late", (1, END_SRC, END_REF, END_ERR, START_REF, START_ERR, START_SRC, None, None, True, "duplicate"))]
    diverted = pipe.late_record("a", IncomingEvent("s", 5, END_SRC, None, AtomicInterval(START_SRC)), ARRIVAL,
                                ARRIVAL + 3, "clock_step_unresolved")
    assert fields(diverted.record)[4:7] == (START_REF, START_ERR, START_SRC)
    assert (diverted.record.lateness_us, diverted.record.extra) == (ARRIVAL - END_REF, {})


def test_merge_orders_intervals_by_their_end_across_sources() -> None:
    # b's clock is the reference (no estimate: unknown bound); a's interval started before b's point but ended
    # after it, so it comes second.
    clock = mapping()
    clock.update("b", ClockEstimate(offset_us=0, skew_ppm=0.0, rtt_us=10, sync_ref_us=T0, sample_count=8,
                                    skew_error_ppm=0.0, dispersion_ppm=0.0))
    pipe = IngestPipeline(clock)
    pipe.register("a", ("s",), ARRIVAL)
    pipe.register("b", ("s",), ARRIVAL)
    out = pipe.push("a", IncomingEvent("s", 0, END_SRC, None, AtomicInterval(START_SRC)), ARRIVAL)
    out += pipe.push("b", IncomingEvent("s", 0, POINT_REF, None), ARRIVAL + 1)
    out += pipe.heartbeat("b", {"s": 1}, END_REF + 1, ARRIVAL + 2)
    assert [(o.record.source_id, o.record.start_ts_us, o.record.ref_ts_us) for o in out
            if isinstance(o, PublishRecord)] == [("b", None, POINT_REF), ("a", START_REF, END_REF)]


def test_gateway_publishes_interval_records_of_a_synced_source() -> None:
    # As the gateway wires it: an EstimateMapping, clock_changed seen, so rule 9 maps every event's end first.
    clock = mapping()
    core = IngestCore(TopicNames("t"), clock)
    core.stream_created("s")
    core.source_registered("a", ("s",), ARRIVAL)
    core.clock_changed(SourceInfo("a", ESTIMATE, T0), 0, T0)
    actions = core.events_received(ConnectionId(1), "a", (
        IncomingEvent("s", 0, END_SRC, {"on": True}, AtomicInterval(START_SRC)),
        IncomingEvent("s", 1, END_SRC, None, IntervalEndpoint("run-3", "end")),
        IncomingEvent("s", 2, END_SRC, 7),
    ), ARRIVAL)
    values = [orjson.loads(a.value) for a in actions if isinstance(a, Produce) and a.delivery is not None]
    keys = ("seq", "ref_ts_us", "uncertainty_us", "start_ts_us", "end_ts_us", "start_uncertainty_us",
            "source_start_ts_us", "interval_id", "endpoint")
    assert [tuple(v.get(k) for k in keys) for v in values] == [
        (0, END_REF, END_ERR, START_REF, END_REF, START_ERR, START_SRC, None, None),
        (1, END_REF, END_ERR, END_REF, END_REF, END_ERR, END_SRC, "run-3", "end"),
        (2, END_REF, END_ERR, None, None, None, None, None, None),  # a point event: no interval fields
    ]
    assert {v["v"] for v in values} == {2}
    assert "interval_id" not in values[0] and "endpoint" not in values[0]
