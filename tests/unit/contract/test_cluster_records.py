"""The cluster control topic's records: exact JSON, byte-exact round trip through decode_record, refusals."""

import orjson
import pytest

from contract.records import ClusterRecord, OwnerRecord, RecordError, decode_record
from contract.topics import TopicNames


def test_cluster_record_json_and_round_trip() -> None:
    record = ClusterRecord("prod-eu", 4, 1_700_000_000_000_000)
    assert orjson.loads(record.to_json()) == {"v": 2, "kind": "cluster", "cluster": "prod-eu", "shards": 4,
                                              "created_us": 1_700_000_000_000_000}
    assert record.key == b"cluster"
    decoded = decode_record(record.to_json())
    assert decoded == record
    assert decoded.to_json() == record.to_json()


def test_owner_record_json_and_round_trip() -> None:
    record = OwnerRecord(3, "gw-b", "10.0.0.7", 7300, 12300, 1_700_000_000_000_123)
    assert orjson.loads(record.to_json()) == {"v": 2, "kind": "owner", "shard": 3, "gateway_id": "gw-b",
                                              "host": "10.0.0.7", "port": 7300, "timesync_port": 12300,
                                              "since_us": 1_700_000_000_000_123}
    assert record.key == b"owner"
    assert decode_record(record.to_json()) == record
    without_timesync = OwnerRecord(0, "gw-a", "h", 1, None, 5)
    assert orjson.loads(without_timesync.to_json())["timesync_port"] is None
    assert decode_record(without_timesync.to_json()) == without_timesync


@pytest.mark.parametrize("raw, message", [
    ({"kind": "cluster", "cluster": "c", "shards": 0, "created_us": 1}, "'shards' must be at least 1, got 0"),
    ({"kind": "cluster", "cluster": "c", "shards": "4", "created_us": 1}, "'shards' must be an integer, got str"),
    ({"kind": "cluster", "shards": 4, "created_us": 1}, "'cluster' must be a string, got NoneType"),
    ({"kind": "owner", "shard": -1, "gateway_id": "g", "host": "h", "port": 1, "since_us": 1},
     "'shard' must not be negative, got -1"),
    ({"kind": "owner", "shard": 1, "gateway_id": "g", "host": "h", "port": 1, "timesync_port": 1.5, "since_us": 1},
     "'timesync_port' must be an integer, got float"),
    ({"kind": "owner", "shard": 1, "gateway_id": "g", "host": "h", "port": 1}, "record without 'since_us'"),
])
def test_malformed_cluster_records_are_refused(raw: dict[str, object], message: str) -> None:
    with pytest.raises(RecordError) as refused:
        decode_record(orjson.dumps(raw))
    assert message in str(refused.value)


def test_cluster_topic_names() -> None:
    names = TopicNames("acme")
    assert names.cluster == "acme.cluster"
    assert names.gateway_group == "acme.gateways"
