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
    assert value == {"v": 1, "kind": "event", "stream": "doors", "source_id": "rfid-1", "seq": 3, "source_ts_us": 10,
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
