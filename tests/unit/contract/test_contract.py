from pathlib import Path

import orjson
import pytest

from contract.records import EventRecord
from contract.topics import InvalidStreamName, TopicNames
from spark_jobs.session import connector_jars

CONTRACT_FIELDS = {"stream", "source_id", "seq", "source_ts_us", "ref_ts_us", "uncertainty_us", "arrival_ts_us",
                   "release_ts_us", "late", "payload"}


def test_record_json_has_every_contract_field():
    record = EventRecord("doors", "rfid-1", 3, 10, 12, 2, 20, 21, payload={"open": True})
    value = orjson.loads(record.to_json())
    assert set(value) >= CONTRACT_FIELDS
    # A point event's record leaves the interval fields out (tests/unit/contract/test_interval_records.py).
    assert value == {"v": 2, "kind": "event", "stream": "doors", "source_id": "rfid-1", "seq": 3, "source_ts_us": 10,
                     "ref_ts_us": 12, "uncertainty_us": 2, "arrival_ts_us": 20, "release_ts_us": 21,
                     "late": False, "payload": {"open": True}}
    assert record.key == b"rfid-1"


def test_late_record_carries_reason():
    record = EventRecord("doors", "r", 3, 10, 12, 2, 20, 21, late=True, late_reason="after_release")
    assert orjson.loads(record.to_json())["late_reason"] == "after_release"


def test_topic_names():
    names = TopicNames("acme")
    assert names.events("doors") == "acme.events.doors"
    assert names.late("doors") == "acme.late.doors"
    assert names.sources == "acme.sources"
    assert names.results("window_count") == "acme.results.window_count"
    assert names.events_pattern == r"acme\.events\..+"
    with pytest.raises(InvalidStreamName):
        names.events("a.b")
    with pytest.raises(InvalidStreamName):
        names.events("")


def test_connector_jars_skip_what_pyspark_ships(tmp_path: Path):
    ours, bundled = tmp_path / "ours", tmp_path / "pyspark"
    ours.mkdir()
    bundled.mkdir()
    for name in ("spark-sql-kafka-0-10_2.13-4.0.0.jar", "kafka-clients-3.9.0.jar", "lz4-java-1.8.0.jar",
                 "snappy-java-1.1.10.5.jar"):
        (ours / name).touch()
    for name in ("lz4-java-1.8.0.jar", "snappy-java-1.1.10.7.jar"):
        (bundled / name).touch()
    assert [p.name for p in connector_jars(ours, bundled)] == [
        "kafka-clients-3.9.0.jar", "spark-sql-kafka-0-10_2.13-4.0.0.jar"]


def test_every_gateway_record_kind_round_trips_byte_exact() -> None:
    import orjson

    from contract.records import (
        ClockRecord,
        EventRecord,
        ProgressRecord,
        PunctuationRecord,
        RecordError,
        decode_record,
    )

    punctuation = PunctuationRecord("s", 100, 120)
    assert punctuation.to_json() == b'{"v":2,"kind":"punctuation","stream":"s","watermark_us":100,"release_ts_us":120}'
    clock = ClockRecord("a", -5, 40, 1.5, 60, 7, 10, 40, 8, {"offset_us": -5, "skew_ppm": 1.5})
    event = EventRecord("s", "a", 3, 10, 5, 60, 11, 12, payload={"x": 1}, start_ts_us=5, start_uncertainty_us=60,
                        source_start_ts_us=10)
    progress = ProgressRecord("s", 9, {"a": 4}, 100)
    for record in (punctuation, clock, event, progress):
        assert decode_record(record.to_json()) == record
    assert orjson.loads(clock.to_json())["kind"] == "clock"
    assert "estimate" not in orjson.loads(ClockRecord("a", 0, 0, 0.0, 0, 0, 0, 0, 0).to_json())
    assert progress.key == b"progress|s"
    for bad in (b"[1]", b"not json", b'{"kind":"nope"}', b'{"kind":"event","stream":"s"}',
                b'{"kind":"punctuation","stream":"s","watermark_us":true,"release_ts_us":1}'):
        with pytest.raises(RecordError):
            decode_record(bad)
