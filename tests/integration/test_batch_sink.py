"""The results sink's transaction on the real broker: a null key or value is written as Kafka's null (no key, a
tombstone), not as a text, and a replayed batch id writes nothing."""

from __future__ import annotations

import uuid

from broker.admin import ensure_topics
from broker.batch_ledger import BatchDecision
from broker.batch_sink import SinkRecord, TransactionalBatchSink
from broker.client import KafkaClientConfig
from broker.launcher import BrokerState


def committed_records(servers: str, topic: str, expected: int, timeout_s: float = 20.0) -> list[SinkRecord]:
    """Every committed record of partition 0, key and value as Kafka holds them (None for null)."""
    consumer = KafkaClientConfig.of(servers).consumer(f"test-{uuid.uuid4().hex[:8]}",
                                                      {"auto.offset.reset": "earliest"})
    try:
        consumer.subscribe([topic])
        records: list[SinkRecord] = []
        deadline_polls = int(timeout_s / 0.2)
        for _ in range(deadline_polls):
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                records.append((message.key(), message.value()))
            if len(records) >= expected:
                # One more poll: a record beyond the expected ones would show up here.
                extra = consumer.poll(1.0)
                if extra is not None and extra.error() is None:
                    records.append((extra.key(), extra.value()))
                break
        return records
    finally:
        consumer.close()


def test_nulls_are_kafka_nulls_and_a_replay_writes_nothing(kafka: BrokerState) -> None:
    servers = kafka.bootstrap_servers
    topic = f"t{uuid.uuid4().hex[:10]}-results"
    ensure_topics(servers, [topic], partitions=1)
    records: list[SinkRecord] = [(None, b"no key"), (b"tombstone", None), (b"", b""), (b"k", b"\xc3\xa9")]
    sink = TransactionalBatchSink(servers, topic, f"{topic}-sink", timeout_s=30.0)
    sink.open()
    try:
        assert sink.write(0, records) is BatchDecision.WRITE
        assert sink.write(0, records) is BatchDecision.SKIP
    finally:
        sink.close()
    assert committed_records(servers, topic, len(records)) == records
