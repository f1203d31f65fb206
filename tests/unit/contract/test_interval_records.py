"""Event records of contract version 2 (docs/record-contract.md, "Interval events"): exact JSON, round trips, and
version 1 records read with the stated defaults."""

import orjson
import pytest

from contract.records import CONTRACT_VERSION, EventRecord, RecordError, decode_record


def test_contract_version_is_2() -> None:
    assert CONTRACT_VERSION == 2


def test_atomic_interval_record_json_and_round_trip() -> None:
    record = EventRecord("machines", "m-1", 7, 2_000, 5_040, 30, 6_000, 6_100, payload={"state": "on"},
                         rtt_us=50, start_ts_us=1_020, start_uncertainty_us=25, source_start_ts_us=980)
    value = orjson.loads(record.to_json())
    assert value == {"v": 2, "kind": "event", "stream": "machines", "source_id": "m-1", "seq": 7,
                     "source_ts_us": 2_000, "ref_ts_us": 5_040, "uncertainty_us": 30, "arrival_ts_us": 6_000,
                     "release_ts_us": 6_100, "late": False, "payload": {"state": "on"}, "start_ts_us": 1_020,
                     "end_ts_us": 5_040, "start_uncertainty_us": 25, "source_start_ts_us": 980, "rtt_us": 50}
    assert record.end_ts_us == 5_040
    decoded = decode_record(record.to_json())
    assert decoded == record
    assert decoded.to_json() == record.to_json()


def test_endpoint_record_json_and_round_trip() -> None:
    record = EventRecord("machines", "m-1", 8, 2_000, 2_040, 30, 2_100, 2_200, payload=None, start_ts_us=2_040,
                         start_uncertainty_us=30, source_start_ts_us=2_000, interval_id="run-9", endpoint="end")
    value = orjson.loads(record.to_json())
    assert {k: value[k] for k in ("start_ts_us", "end_ts_us", "start_uncertainty_us", "source_start_ts_us",
                                  "interval_id", "endpoint", "v")} == {
        "start_ts_us": 2_040, "end_ts_us": 2_040, "start_uncertainty_us": 30, "source_start_ts_us": 2_000,
        "interval_id": "run-9", "endpoint": "end", "v": 2}
    assert decode_record(record.to_json()) == record


def test_point_record_leaves_the_interval_fields_out_and_reads_back_with_start_equal_end() -> None:
    record = EventRecord("s", "a", 1, 10, 15, 4, 20, 21)
    assert record.to_json() == (b'{"v":2,"kind":"event","stream":"s","source_id":"a","seq":1,"source_ts_us":10,'
                                b'"ref_ts_us":15,"uncertainty_us":4,"arrival_ts_us":20,"release_ts_us":21,'
                                b'"late":false,"payload":null}')
    decoded = decode_record(record.to_json())
    assert isinstance(decoded, EventRecord)
    assert (decoded.start_ts_us, decoded.end_ts_us, decoded.start_uncertainty_us, decoded.source_start_ts_us,
            decoded.interval_id, decoded.endpoint) == (15, 15, 4, 10, None, None)
    # Absent and written with their default values mean the same.
    assert decode_record(decoded.to_json()) == decoded


def test_late_interval_record_keeps_its_lateness() -> None:
    record = EventRecord("s", "a", 1, 10, 15, 4, 20, 21, late=True, late_reason="duplicate", start_ts_us=12,
                         start_uncertainty_us=3, source_start_ts_us=7, lateness_us=5)
    decoded = decode_record(record.to_json())
    assert decoded == record
    assert isinstance(decoded, EventRecord) and (decoded.lateness_us, decoded.extra) == (5, {})


def test_v1_record_reads_as_a_point_event() -> None:
    v1 = {"v": 1, "kind": "event", "stream": "s", "source_id": "a", "seq": 3, "source_ts_us": 100, "ref_ts_us": 140,
          "uncertainty_us": 9, "arrival_ts_us": 150, "release_ts_us": 160, "late": False, "payload": 1, "rtt_us": 18}
    assert decode_record(orjson.dumps(v1)) == EventRecord(
        "s", "a", 3, 100, 140, 9, 150, 160, False, 1, None, 18, start_ts_us=140, start_uncertainty_us=9,
        source_start_ts_us=100, interval_id=None, endpoint=None, extra={})


@pytest.mark.parametrize("change", [
    {"start_ts_us": 141},  # starts after its end
    {"end_ts_us": 139},  # the end is ref_ts_us
    {"start_ts_us": "1"},
    {"interval_id": "x"},  # an endpoint needs both
    {"endpoint": "start"},
    {"interval_id": "x", "endpoint": "middle"},
    {"interval_id": 5, "endpoint": "end"},
])
def test_broken_interval_fields_are_refused(change: dict[str, object]) -> None:
    raw = {"v": 2, "kind": "event", "stream": "s", "source_id": "a", "seq": 3, "source_ts_us": 100,
           "ref_ts_us": 140, "uncertainty_us": 9, "arrival_ts_us": 150, "release_ts_us": 160, "late": False,
           "payload": 1} | change
    with pytest.raises(RecordError):
        decode_record(orjson.dumps(raw))


def test_an_endpoint_record_built_without_start_fields_is_still_an_endpoint() -> None:
    # A tool or test building an endpoint by hand must not get a point record (the iseq job would see a point).
    record = EventRecord("machines", "m-1", 8, 2_000, 2_040, 30, 2_100, 2_200, interval_id="door", endpoint="end")
    value = orjson.loads(record.to_json())
    assert {k: value[k] for k in ("start_ts_us", "end_ts_us", "start_uncertainty_us", "source_start_ts_us",
                                  "interval_id", "endpoint")} == {
        "start_ts_us": 2_040, "end_ts_us": 2_040, "start_uncertainty_us": 30, "source_start_ts_us": 2_000,
        "interval_id": "door", "endpoint": "end"}
