"""The latency benchmark's floor (benchmarks/gateway_latency.py): the earliest release any correct merge could give
an event, given when the other sources' frames reached the gateway; and the shares computed from it. A hand-computed
example of 3 sources a, b, c (times in us):

    a: seq 0 stamped 100 arrived 150, seq 1 stamped 200 arrived 260
    b: seq 0 stamped  90 arrived 120, seq 1 stamped 210 arrived 300
    c: seq 0 stamped 100 arrived 130, seq 1 stamped 150 arrived 350, seq 2 stamped 205 arrived 400

a0 (t=100): b first reaches 100 with b1 (arrived 300), c with c0 (stamped exactly 100: an equal time holds nothing
back) at 130: floor max(150, 300, 130) = 300. a1 (t=200): b1 at 300, c2 at 400: 400. b0 (t=90): a0 at 150, c0 at
130, its own 120: 150. c0 (t=100): a0 150, b1 300: 300. c1 (t=150): a1 260, b1 300, but it arrived at 350 itself:
350. b1 (t=210) and c2 (t=205): a never reaches them (its last stamp is 200): no floor (a heartbeat or a departure
released them).
On the send stamps instead (the stamp is when the frame was sent): a0 max(100, 210, 100) = 210; a1 max(200, 210,
205) = 210; b0 max(90, 100, 100) = 100; c0 max(100, 100, 210) = 210; c1 max(150, 200, 210) = 210.
"""

import pytest

from benchmarks.gateway_latency import ack_times_us, latency_shares, release_floors_us

# (source, seq, stamp, arrival), interleaved as records of several sources come
EVENTS = [("a", 0, 100, 150), ("b", 0, 90, 120), ("c", 0, 100, 130), ("a", 1, 200, 260), ("c", 1, 150, 350),
          ("b", 1, 210, 300), ("c", 2, 205, 400)]


def test_floor_is_the_latest_other_source_to_reach_the_event_and_never_before_its_own_arrival() -> None:
    assert release_floors_us(EVENTS) == [300, 150, 300, 400, 350, None, None]


def test_floor_on_send_stamps_is_the_sources_schedule_alone() -> None:
    sent = [(source, seq, stamp, stamp) for source, seq, stamp, _arrival in EVENTS]
    assert release_floors_us(sent) == [210, 100, 210, 210, 210, None, None]


def test_floor_does_not_depend_on_the_order_of_the_records() -> None:
    assert release_floors_us(EVENTS[::-1]) == [None, None, 350, 400, 300, 150, 300]


def test_a_lone_source_waits_for_nobody() -> None:
    assert release_floors_us([("a", 0, 100, 150), ("a", 1, 90, 170)]) == [150, 170]


def test_ack_times_are_those_of_the_first_cumulative_ack_covering_each_seq() -> None:
    assert ack_times_us([(0, 200), (3, 600)], [1, 0, 3, 2]) == [600, 200, 600, 600]


def record(source: str, seq: int, stamp: int, arrival: int, release: int) -> dict[str, object]:
    return {"source_id": source, "seq": seq, "ref_ts_us": stamp, "arrival_ts_us": arrival, "release_ts_us": release}


# c0's release stamp 260 is that of a1's frame: handled after b1's frame although read before it (260 < 300), so
# the stamp lies 40 us before c0's floor while the release did not.
RELEASES = [300, 150, 260, 400, 350, 500, 500]
RECORDS = [record(*event, release) for event, release in zip(EVENTS, RELEASES, strict=True)]


def test_shares_split_added_latency_into_the_unavoidable_wait_and_the_gateways_excess() -> None:
    shares = latency_shares(RECORDS, {"a": [(1, 450)], "b": [(0, 200), (1, 600)], "c": [(2, 600)]})
    # per event with a floor, in record order a0, b0, c0, a1, c1
    assert shares.added_us == [150, 30, 130, 140, 0]
    assert shares.waited_us == [150, 30, 170, 140, 0]
    assert shares.excess_us == [0, 0, -40, 0, 0]
    assert shares.acked_us == [150, 50, 300, 50, 250]
    assert shares.scheduled_us == [110, 10, 110, 10, 60]
    assert shares.read_lag_us == [50, 30, 30, 60, 200]
    assert shares.tail == 2


def test_an_ack_before_the_floor_is_a_release_before_the_promise() -> None:
    with pytest.raises(AssertionError, match="a seq 1: acked at 350 us, before its floor 400 us"):
        latency_shares(RECORDS, {"a": [(1, 350)], "b": [(0, 200), (1, 600)], "c": [(2, 600)]})
